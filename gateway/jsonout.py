"""Messages and ids as JSON, the one shape the server API (gateway/api.py) and the notify
webhook (gateway/notify.py) both write (docs/api.md)."""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any, Final

import msgpack

from protocol.ops import MsgType, is_client_msg_type

JSON_SAFE_MAX: Final = (1 << 53) - 1  # larger integers go out as decimal strings


def out_id(n: int) -> int | str:
    """An integer as JSON: a number up to 2^53-1, a decimal string above."""
    return n if n <= JSON_SAFE_MAX else str(n)


def message_json(
    seq: int,
    msg_id: int,
    sender_uid: int,
    msg_type: int,
    content: bytes,
    server_ms: int,
    cmid: str,
) -> dict[str, Any]:
    """One stored message: `content_b64` always, `text` for a client type that is valid
    UTF-8, `event` (the decoded map) for a system message."""
    out: dict[str, Any] = {
        "seq": out_id(seq),
        "msg_id": str(msg_id),  # a snowflake: always above 2^53
        "sender_uid": out_id(sender_uid),
        "msg_type": msg_type,
        "content_b64": base64.b64encode(content).decode(),
        "server_ms": server_ms,
        "client_msg_id": cmid,
    }
    if msg_type == MsgType.SYSTEM:
        try:
            event = msgpack.unpackb(content)
            json.dumps(event, allow_nan=False)  # strict JSON only: no NaN, no Infinity
        except Exception:  # not a map JSON can carry: content_b64 has it
            pass
        else:
            out["event"] = event
    elif is_client_msg_type(msg_type):
        with contextlib.suppress(UnicodeDecodeError):
            out["text"] = content.decode()
    return out
