"""Signed URLs of a `file://` media root, served by the gateway's media listener
(gateway/http/media.py): pure functions, no I/O.

A URL names the method, the key, an expiry (Unix seconds), the content type and, for an
upload, the size the upload must have (a download's URL has no `size`: it signs 0);
`sig` is the unpadded base64url HMAC-SHA256 of `METHOD\\nkey\\nexp\\nsize\\ntype` under
the media secret. Verification is in constant time; an expired, tampered or foreign URL
raises `SignatureError` (its reason is for the log, never for the peer).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, quote, urlencode

MIN_SECRET_BYTES: Final = 16


class SignatureError(ValueError):
    """A signed URL is refused; `reason` says why: malformed, expired or bad_signature."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Grant:
    """What a verified URL allows: `method` on `key` until `exp`, and for a PUT exactly
    `size` bytes of `content_type` (GET: the type to serve it as, size 0)."""

    method: str
    key: str
    exp: int
    size: int
    content_type: str


def _mac(secret: bytes, g: Grant) -> str:
    msg = f"{g.method}\n{g.key}\n{g.exp}\n{g.size}\n{g.content_type}".encode()
    digest = hmac.new(secret, msg, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def signed_path(secret: bytes, g: Grant) -> str:
    """`/<key>?exp=..&size=..&type=..&sig=..` (no `size` when it is 0: a download):
    append it to the listener's base URL."""
    query: dict[str, str | int] = {"exp": g.exp, "size": g.size}
    if not g.size:
        del query["size"]
    query.update(type=g.content_type, sig=_mac(secret, g))
    return f"/{quote(g.key)}?{urlencode(query)}"


def verify(secret: bytes, method: str, path: str, query: str, now_s: float) -> Grant:
    """The grant of a request `method path?query`, or SignatureError."""
    params = dict(parse_qsl(query, keep_blank_values=True))
    try:
        g = Grant(
            method,
            path.lstrip("/"),
            int(params["exp"]),
            int(params.get("size", "0")),
            params["type"],
        )
        sig = params["sig"]
    except (KeyError, ValueError):
        raise SignatureError("malformed") from None
    if not hmac.compare_digest(_mac(secret, g).encode(), sig.encode()):
        raise SignatureError("bad_signature")
    if now_s > g.exp:
        raise SignatureError("expired")
    return g
