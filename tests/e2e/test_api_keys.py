"""Who may call the admin listener, and how it speaks HTTP: scoped API keys (each call
needs its scope, the admin token has them all and drain), rotation by two keys under one
name, keys never shown in /metrics or logs (their names are), keep-alive, chunked
bodies, and JSON errors everywhere (404, 405 with Allow, a wrong token)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.server import Server
from tests.conftest import StartGateway
from tests.support.api import TOKEN, Api
from tests.support.proc import free_port

pytestmark = pytest.mark.backends("embedded")

SENDER = "sender-key-0123456789"
READER = "reader-key-0123456789"
READER_NEXT = "reader-key-next-98765"  # the same name: the reader key being rotated
ALL = "all-scopes-key-0123456789"
KEYS = (
    f"backend:{SENDER}:send",
    f"analytics:{READER}:read",
    f"analytics:{READER_NEXT}:read",
    f"ops:{ALL}:send,read,manage,moderate,push",
)


async def started(start_gateway: StartGateway, **overrides: Any) -> tuple[Server, int]:
    port = free_port()
    gw = await start_gateway(admin_port=port, admin_token=TOKEN, api_keys=KEYS, **overrides)
    return gw, port


async def http(
    port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection, HTTP/1.1, Connection: close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = [f"{method} {path} HTTP/1.1", "Host: x", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body and "Transfer-Encoding" not in (headers or {}):
        head.append(f"Content-Length: {len(body)}")
    writer.write("\r\n".join(head).encode() + b"\r\n\r\n" + body)
    try:
        async with asyncio.timeout(10):
            raw = await reader.read()
    finally:
        writer.close()
    return parse(raw)


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in fields.items()}, body


async def test_each_call_needs_its_scope(start_gateway: StartGateway) -> None:
    gw, port = await started(start_gateway)
    admin, sender, reader, ops = Api(port), Api(port, SENDER), Api(port, READER), Api(port, ALL)
    conv = (await admin.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    send = {"sender_uid": 1, "client_msg_id": "k1", "text": "hi"}
    assert (await sender.ok("POST", f"conversations/{conv}/messages", send))["seq"] == 1
    # the sender key cannot read, manage or moderate
    for method, path, body in (
        ("GET", f"conversations/{conv}/messages", None),
        ("POST", "p2p", {"uid": 1, "peer_uid": 3}),
        ("POST", "kick", {"uid": 1}),
    ):
        status, answer = await sender.call(method, path, body)
        assert (status, answer["error"]["code"]) == (403, "forbidden"), (path, answer)
        assert "backend lacks the scope" in answer["error"]["message"]
    # the reader key reads and sends nothing
    page = await reader.ok("GET", f"conversations/{conv}/messages")
    assert [m["text"] for m in page["messages"]] == ["hi"]
    assert await reader.error("POST", f"conversations/{conv}/messages", send) == (403, "forbidden")
    # a key with every scope still cannot drain the node: that is the admin token's
    assert (await ops.ok("POST", "p2p", {"uid": 1, "peer_uid": 3}))["conv_id"]
    for token in (ALL, SENDER):
        status, _, body = await http(port, "POST", "/drain", headers=bearer(token))
        assert status == 403, body
        assert json.loads(body)["error"]["code"] == "forbidden"
    assert gw.node is not None and gw.node.accepting
    # /revoke is moderation: the ops key may, the sender key may not
    assert (await http(port, "POST", "/revoke?uid=9", headers=bearer(ALL)))[0] == 200
    assert (await http(port, "POST", "/revoke?uid=9", headers=bearer(SENDER)))[0] == 403


async def test_two_keys_under_one_name_rotate_it_and_only_names_are_shown(
    start_gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    _, port = await started(start_gateway)
    for secret in (READER, READER_NEXT):
        assert (await Api(port, secret).ok("GET", "presence?uids=1"))["presence"]
    status, answer = await Api(port, "reader-key-0123456780").call("GET", "presence?uids=1")
    assert (status, answer["error"]) == (401, {"code": "auth_failed", "message": "invalid token"})
    status, answer = await Api(port, "").call("GET", "presence?uids=1")
    assert status == 401 and "needed" in answer["error"]["message"]
    metrics = await Api(port).metrics()
    assert 'imgw_api_calls_total{call="presence",code="ok",key="analytics"} 2.0' in metrics
    shown = metrics + "\n".join(r.getMessage() for r in caplog.records)
    for secret in (SENDER, READER, READER_NEXT, ALL, TOKEN):
        assert secret not in shown


async def test_keep_alive_pipelining_and_chunked_bodies(start_gateway: StartGateway) -> None:
    gw, port = await started(start_gateway)
    conv = (await Api(port).ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {TOKEN}\r\nHost: x\r\n"
    body = json.dumps({"sender_uid": 1, "client_msg_id": "c1", "text": "chunked"}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:10], body[10:])) + b"0\r\n\r\n"
    # three requests written at once on one connection: a chunked POST and two GETs
    writer.write(
        f"POST /api/v1/conversations/{conv}/messages HTTP/1.1\r\n{auth}"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + chunked
        + f"GET /api/v1/conversations/{conv}/messages HTTP/1.1\r\n{auth}\r\n".encode()
        + f"GET /api/v1/conversations/x/messages HTTP/1.1\r\n{auth}\r\n".encode()
    )
    answers = []
    async with asyncio.timeout(10):
        for _ in range(3):
            head = await reader.readuntil(b"\r\n\r\n")
            status, fields, _ = parse(head)
            answers.append(
                (status, json.loads(await reader.readexactly(int(fields["content-length"]))))
            )
    writer.close()
    assert answers[0][0] == 200 and answers[0][1]["seq"] == 1
    assert [m["text"] for m in answers[1][1]["messages"]] == ["chunked"]
    assert answers[2] == (400, answers[2][1]) and answers[2][1]["error"]["code"] == "bad_request"
    assert gw.node is not None


async def test_errors_are_json_everywhere(start_gateway: StartGateway) -> None:
    _, port = await started(start_gateway)
    auth = bearer(TOKEN)
    cases = {
        ("GET", "/nowhere"): (404, "unknown_op"),
        ("GET", "/api/v1/nowhere"): (404, "unknown_op"),
        ("DELETE", "/api/v1/p2p"): (405, "bad_request"),
        ("GET", "/drain"): (405, "bad_request"),
        ("POST", "/revoke?uid=x"): (400, "bad_request"),
        ("GET", "/api/v1/conversations/abc"): (400, "bad_request"),
        ("GET", "/api/v1/conversations/1/messages?limit=0"): (400, "bad_request"),
        ("GET", "/api/v1/users/1/conversations?limit=0"): (400, "bad_request"),
        ("GET", "/api/v1/presence?uids=1&colour=red"): (400, "bad_request"),
    }
    for (method, path), (status, code) in cases.items():
        got, fields, body = await http(port, method, path, headers=auth)
        assert (got, json.loads(body)["error"]["code"]) == (status, code), (path, body)
        assert fields["content-type"].startswith("application/json")
    _, fields, _ = await http(port, "DELETE", "/api/v1/p2p", headers=auth)
    assert fields["allow"] == "POST"
    status, _, body = await http(
        port,
        "POST",
        "/api/v1/p2p",
        b'{"uid": 1, "peer": 2}',
        {**auth, "Content-Type": "application/json"},
    )
    assert status == 400 and "unknown key peer" in json.loads(body)["error"]["message"]
    big = b'{"uids": [' + b"1," * 200_000 + b"1]}"
    status, _, body = await http(port, "POST", "/api/v1/broadcast", big, auth)
    assert (status, json.loads(body)["error"]["code"]) == (413, "content_too_large")
    # the contract is public
    status, _, body = await http(port, "GET", "/api/v1/openapi.json")
    assert status == 200 and json.loads(body)["openapi"].startswith("3.1")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
