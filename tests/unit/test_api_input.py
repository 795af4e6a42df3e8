"""Server API input the JSON parser or the encoders would choke on is a 400, refused
before any handler runs: content_b64 outside ASCII, a body nested past the parser's
recursion limit, a system message's data nested deeper than DATA_DEPTH_MAX, NaN and
Infinity (never stored: history would give them back as JSON strict parsers refuse)."""

from __future__ import annotations

import asyncio
import base64
import json
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from gateway.config import Config
from gateway.http import api
from gateway.http.jsonout import message_json
from gateway.http.keys import ADMIN_SCOPES, Caller
from gateway.logs import Throttle
from gateway.metrics import Metrics
from protocol.ops import MsgType


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def exception(self, event: str, **kw: Any) -> None:
        self.events.append(event)


ADMIN = Caller("admin", ADMIN_SCOPES)


async def answer(method: str, path: str, raw: bytes) -> tuple[int, dict[str, Any], Log]:
    loop = asyncio.get_running_loop()
    log = Log()
    node = SimpleNamespace(
        config=Config(), loop=loop, log=log, log_throttle=Throttle(loop.time),
        accepting=True, metrics=Metrics(),
    )  # fmt: skip
    status, body, _ = await api.Api(node).handle(method, api.PREFIX + path, "", raw, ADMIN)  # type: ignore[arg-type]
    return status, body, log


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


SYSTEM = '{"sender_uid": 0, "client_msg_id": "n1", "text": "t", "data": %s}'
BAD = {
    "non-ASCII content_b64 (send)": (
        "conversations/5/messages",
        '{"sender_uid": 1, "client_msg_id": "m1", "content_b64": "aGk\u00e9"}',
    ),
    "non-ASCII content_b64 (broadcast)": ("broadcast", '{"uids": [1], "content_b64": "\u00b2"}'),
    "a body nested 100,000 deep": ("groups", '{"uids": ' + nested(100_000) + "}"),
    "data nested 990 deep": ("conversations/5/messages", SYSTEM % nested(990)),
    "data nested one level too deep": (
        "conversations/5/messages",
        SYSTEM % nested(api.DATA_DEPTH_MAX + 1),
    ),
    "data with NaN": ("conversations/5/messages", SYSTEM % '{"x": NaN}'),
    "data with Infinity": ("conversations/5/messages", SYSTEM % "[-Infinity]"),
    "data with a number too large for a float": ("conversations/5/messages", SYSTEM % "1e999"),
}


@pytest.mark.parametrize(("path", "raw"), BAD.values(), ids=BAD.keys())
async def test_input_the_encoders_would_choke_on_is_a_400(path: str, raw: str) -> None:
    status, body, log = await answer("POST", path, raw.encode())
    assert (status, body["error"]["code"]) == (400, "bad_request"), body
    assert log.events == []  # refused, not failed


def test_data_at_the_depth_limit_is_taken() -> None:
    data = json.loads(nested(api.DATA_DEPTH_MAX))
    assert api._depth(data) == api.DATA_DEPTH_MAX
    assert api._depth({"a": [1, {"b": []}], "c": 2}) == 4
    assert api._depth("x") == 0


def test_a_stored_nan_is_never_given_back_as_json() -> None:
    """A system message stored before NaN was refused: history carries its content_b64
    only, never an `event` that strict JSON parsers would refuse."""
    content = msgpack.packb({"event": "notice", "data": float("nan")})
    out = message_json(1, 2, 0, int(MsgType.SYSTEM), content, 3, "n1")
    assert "event" not in out and base64.b64decode(out["content_b64"]) == content
    json.dumps(out, allow_nan=False)
