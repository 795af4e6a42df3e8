"""The server API answers as its OpenAPI document (GET /api/v1/openapi.json) says, under
Schemathesis: what `schemathesis run` does, from Python, against a gateway on each
backend. Every operation gets the document's examples, the coverage phase's boundary
and invalid values and unexpected methods, and generated cases; once on seeded ids (a
group and its members, so that calls get through to 200) and once on any ids. Every
answer must be no 5xx, of a documented status, JSON, of the status's schema, with its
documented headers; what the document calls invalid must be refused; a call without
credentials is 401; a method the path does not take is 405 with Allow.

Then the inputs no generator draws (a lone surrogate, an over-long cursor), which must
be answered the same way, and a few that must be refused.

Deterministic (derandomized, no example database) and bounded: MAX_EXAMPLES generated
cases per operation and run, about 1,900 calls a run; 15-20 s a backend on two cores.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
import schemathesis
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.engine import Status, events

from gateway.http.api import ROUTES
from tests.conftest import StartGateway
from tests.support.api import TOKEN, Api
from tests.support.proc import free_port

pytestmark = pytest.mark.backends("embedded", "production")

MAX_EXAMPLES = 50  # generated cases per operation and run (the coverage phase adds its own)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
    "ignored_auth",
    "unsupported_method",
    "allow_header_conformance",
)
# Schemathesis leaves out the operation that serves the document (GET /openapi.json):
# it loads the document from there, and hand_made() calls it with another method.
OPERATIONS = len(ROUTES)


@dataclass
class Report:
    calls: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    operations: set[str] = field(default_factory=set)
    failures: dict[str, str] = field(default_factory=dict)  # the first of each kind
    stopped: list[str] = field(default_factory=list)

    def failed(self, what: str, detail: str) -> None:
        self.failures.setdefault(what, detail[:2000])

    def summary(self) -> str:
        return f"{self.calls} calls, statuses {sorted(self.statuses.items())}, {self.stopped}"


async def seed(api: Api) -> dict[str, int]:
    """A p2p conversation, a group and a few messages in each, among uids 1001-1003 (those
    of the document's examples); the path ids the seeded run uses."""
    p2p = (await api.ok("POST", "p2p", {"uid": 1001, "peer_uid": 1002}))["conv_id"]
    body = {"owner_uid": 1001, "title": "team", "uids": [1002, 1003]}
    group = (await api.ok("POST", "groups", body))["conv_id"]
    for conv in (p2p, group):
        for i, uid in enumerate((1001, 1002, 1001)):
            send = {"sender_uid": uid, "client_msg_id": f"seed-{conv}-{i}", "text": f"m{i}"}
            await api.ok("POST", f"conversations/{conv}/messages", send)
    return {"conv_id": group, "uid": 1002}


def run(base_url: str, report: Report, parameters: dict[str, int] | None = None) -> None:
    """One Schemathesis run (examples, coverage, fuzzing) of the document the gateway at
    `base_url` serves; `parameters` fixes path ids."""
    settings: dict[str, Any] = {
        "base-url": base_url,
        "headers": AUTH,
        "workers": 1,
        "request-timeout": 10,
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
        "phases": {"stateful": {"enabled": False}},
        "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS}},
    }
    if parameters:
        settings["parameters"] = parameters
    config = schemathesis.Config.from_dict(settings)
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json", config=config)
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            for interaction in recorder.interactions.values():
                report.calls += 1
                report.operations.add(recorder.label)
                if interaction.response is not None:
                    report.statuses[interaction.response.status_code] += 1
            for case_id, checks in recorder.checks.items():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        failure = check.failure_info.failure
                        curl = recorder.cases[case_id].value.as_curl_command()
                        report.failed(
                            f"{recorder.label}: {failure.title}", f"{curl}\n{failure.message}"
                        )
        elif isinstance(event, events.NonFatalError | events.FatalError):
            report.failed(f"schemathesis: {type(event).__name__}", str(event.info))
        elif isinstance(event, events.EngineFinished):
            report.stopped.append(event.stop_reason.value)


# Inputs that no generator draws: (operation, path ids, query, body).
SURROGATE = "\ud800"  # a lone surrogate: JSON can escape it, UTF-8 cannot encode it
HAND_MADE: list[tuple[str, dict[str, Any], dict[str, Any] | None, Any]] = [
    ("POST /conversations/{conv_id}/messages", {}, None,
     {"sender_uid": 1001, "client_msg_id": "s1", "text": SURROGATE}),
    ("POST /conversations/{conv_id}/messages", {}, None,
     {"sender_uid": 1001, "client_msg_id": SURROGATE * 17, "text": "x"}),
    ("POST /conversations/{conv_id}/messages", {}, None,
     {"sender_uid": 0, "client_msg_id": "s2", "text": "x", "data": {SURROGATE: 1}}),
    ("PUT /conversations/{conv_id}/title", {}, None, {"title": SURROGATE}),
    ("POST /groups", {}, None, {"owner_uid": 1001, "title": SURROGATE}),
    ("POST /kick", {}, None, {"uid": 1001, "text": SURROGATE}),
    ("POST /broadcast", {}, None, {"uids": [1001], "text": SURROGATE}),
    ("POST /tokens", {}, None, {"uid": 1001, "device": "d", "ttl_s": 60, SURROGATE: 1}),
    ("GET /conversations/{conv_id}/members", {}, {"cursor": "u" + "9" * 5000}, None),
    ("GET /conversations/{conv_id}/messages", {}, {"cursor": "a" + "9" * 5000}, None),
    ("GET /users/{uid}/conversations", {}, {"cursor": "43" + "ff" * 32}, None),
]  # fmt: skip
# Requests answered with a status the generators may not reach: a parameter given empty
# is malformed, as is a body with a surrogate encoded as if it were a character.
REFUSED: list[tuple[str, str, bytes | None, int]] = [
    ("GET", "/conversations/{conv_id}/messages?cursor=", None, 400),
    ("GET", "/conversations/{conv_id}/messages?limit=", None, 400),
    ("GET", "/conversations/{conv_id}/members?cursor=", None, 400),
    ("GET", "/users/{uid}/conversations?device=", None, 400),
    ("GET", "/users/{uid}/conversations?cursor=", None, 400),
    ("GET", "/presence?uids=", None, 400),
    ("POST", "/groups", b'{"owner_uid": 1001, "title": "\xed\xa0\x80"}', 400),
]
CONFORMANCE = (
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.response_headers_conformance,
)


def hand_made(base_url: str, report: Report, ids: dict[str, int]) -> None:
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    for label, path_ids, query, body in HAND_MADE:
        operation = schema.find_operation_by_label(label)
        assert operation is not None, label
        names = {p.name for p in operation.path_parameters}
        pinned = {k: v for k, v in {**ids, **path_ids}.items() if k in names}
        if body is None:
            case = operation.Case(path_parameters=pinned, query=query)
        else:
            case = operation.Case(path_parameters=pinned, query=query, body=body)
        response = case.call(base_url=base_url, headers=AUTH, timeout=10)
        report.calls += 1
        report.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=list(CONFORMANCE), headers=AUTH)
        except (Failure, FailureGroup) as e:
            report.failed(f"{label} (hand-made): {type(e).__name__}", str(e))
    for method, path, raw, status in REFUSED:
        path = path.format(**ids)
        r = requests.request(method, base_url + path, data=raw, headers=AUTH, timeout=10)
        report.calls += 1
        report.statuses[r.status_code] += 1
        if r.status_code != status or "error" not in r.json():
            report.failed(f"{method} {path}", f"{r.status_code} {r.headers} {r.text}")
    r = requests.post(base_url + "/openapi.json", timeout=10)  # the document: GET only
    report.calls += 1
    if r.status_code != 405 or r.headers.get("Allow") != "GET":
        report.failed("POST /openapi.json", f"{r.status_code} {r.headers} {r.text}")


async def test_every_answer_is_one_the_document_describes(start_gateway: StartGateway) -> None:
    port = free_port()
    await start_gateway(admin_port=port, admin_token=TOKEN)
    api = Api(port)
    ids = await seed(api)
    base_url = api.base.rstrip("/")
    report = Report()
    started = time.monotonic()
    await asyncio.to_thread(run, base_url, report, ids)  # the gateway runs on this loop
    await asyncio.to_thread(run, base_url, report)
    await asyncio.to_thread(hand_made, base_url, report, ids)
    summary = f"{report.summary()} in {time.monotonic() - started:.1f} s"
    print(summary)
    assert not report.failures, (
        summary + "\n\n" + "\n\n".join(f"== {k}\n{v}" for k, v in sorted(report.failures.items()))
    )
    assert report.stopped == ["completed", "completed"], summary
    assert len(report.operations) == OPERATIONS, (sorted(report.operations), summary)
    assert report.statuses[200] >= 200, summary  # and many calls got through
