"""Object keys and the content of media messages: pure functions, no I/O.

A key is `media/{uid}/{sha256}`: the uploader's uid in decimal and the SHA-256 of the
file in 64 lowercase hex digits. The same user uploading the same bytes gets the same
key, so a file is stored once per user however often it is sent.

A media message (msg_type 2 image, 3 voice, 4 file) carries the key in its content, a
msgpack map `{"key": str, ...}` (other keys are the client's: size, type, name, ...).
Content that is not such a map is not a media reference and is stored as it comes.
"""

from __future__ import annotations

import re
from typing import Final

import msgpack

SHA256_RE: Final = re.compile(r"[0-9a-f]{64}")
KEY_RE: Final = re.compile(r"media/([1-9][0-9]{0,19})/([0-9a-f]{64})")
# type/subtype, lowercase (RFC 6838 restricted names), no parameters
CONTENT_TYPE_RE: Final = re.compile(
    r"[a-z0-9][a-z0-9!#$&^_.+-]{0,62}/[a-z0-9][a-z0-9!#$&^_.+-]{0,62}"
)
MAX_U64: Final = (1 << 64) - 1


def media_key(uid: int, sha256: str) -> str:
    return f"media/{uid}/{sha256}"


def parse_key(key: str) -> tuple[int, str] | None:
    """(uid, sha256) of a well-formed key; None otherwise."""
    m = KEY_RE.fullmatch(key)
    if m is None:
        return None
    uid = int(m.group(1))
    return (uid, m.group(2)) if 0 < uid <= MAX_U64 else None


def type_allowed(content_type: str, allowed: tuple[str, ...]) -> bool:
    """Whether `content_type` matches one of `allowed`: exact names or `major/*`."""
    if not CONTENT_TYPE_RE.fullmatch(content_type):
        return False
    major = content_type.split("/", 1)[0] + "/*"
    return content_type in allowed or major in allowed or "*/*" in allowed


def key_of_content(content: bytes) -> str | None:
    """The "key" a media message's content carries; None when the content is not a
    msgpack map with a str "key" (then it is no media reference)."""
    if not content or not (0x80 <= content[0] <= 0x8F or content[0] in (0xDE, 0xDF)):
        return None  # not a map: no decoding at all
    try:
        value = msgpack.unpackb(content, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if not isinstance(value, dict):
        return None
    key = value.get("key")
    return key if isinstance(key, str) else None


def media_content(key: str, **extra: object) -> bytes:
    """The content of a media message carrying `key` (and the client's own fields)."""
    out: bytes = msgpack.packb({"key": key, **extra})
    return out
