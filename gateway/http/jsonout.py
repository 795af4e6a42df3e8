"""Messages and ids as JSON, the one shape that the server API (gateway/http/api.py), the
notify webhook (gateway/hooks/notify.py) and push events write (docs/api.md)."""

from __future__ import annotations

import base64
import json
from typing import Any, Final

import msgpack

from protocol.mediakeys import key_of_content
from protocol.ops import MEDIA_MSG_TYPES, MsgType, is_client_msg_type

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
    """One stored message: `content_b64` always; `text` for a client type that is valid
    UTF-8; `event` (the decoded map) for a system message; `media` (`key`, and the
    `size` and `content_type` its sender gave) for an image, voice or file message that
    carries an object key."""
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
    elif msg_type in MEDIA_MSG_TYPES and (media := media_json(content)) is not None:
        out["media"] = media
    elif (text := message_text(msg_type, content)) is not None:
        out["text"] = text
    return out


def message_text(msg_type: int, content: bytes) -> str | None:
    """A message's `text`: the content of a client message that is valid UTF-8 and not a
    media reference; None for any other."""
    if not is_client_msg_type(msg_type):
        return None
    if msg_type in MEDIA_MSG_TYPES and key_of_content(content) is not None:
        return None
    try:
        return content.decode()
    except UnicodeDecodeError:
        return None


def media_json(content: bytes) -> dict[str, Any] | None:
    """The media reference of a media message's content (protocol/mediakeys.py: a
    msgpack map with a str "key"), as JSON; None when the content carries none."""
    if key_of_content(content) is None:
        return None
    fields = msgpack.unpackb(content, raw=False, strict_map_key=False)
    size = fields.get("size")
    ctype = fields.get("type")
    return {
        "key": fields["key"],
        "size": size if type(size) is int and 0 <= size <= JSON_SAFE_MAX else None,
        "content_type": ctype if isinstance(ctype, str) else None,
    }
