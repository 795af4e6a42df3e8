"""Exceptions raised by the protocol package.

Exception tree::

    Exception
    └── ProtocolError             .code: ErrorCode to send before closing
        ├── FrameError            the byte stream cannot be framed or decoded
        │                         (.code BAD_FRAME or FRAME_TOO_LARGE; .frames: the
        │                         frames completed before the error in the same feed)
        └── TokenError            a LOGIN token is refused (.code AUTH_FAILED; .reason)

Every ProtocolError is the peer's fault and maps to exactly one ERROR code. A frame
that is well framed but unacceptable (unknown op, bad fields) is not an exception:
the decoder returns it as `protocol.frames.Invalid` and the connection lives on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, TypeAlias

from protocol.frames import Frame, Invalid
from protocol.ops import ErrorCode

# The reasons verify_token gives; kept open as `str` in TokenError for callers' own.
TokenFailure: TypeAlias = Literal[
    "malformed",
    "unknown_kid",
    "bad_signature",
    "expired",
    "too_long",
    "iat_after_exp",
    "iat_future",
    "uid_mismatch",
    "device_mismatch",
]


class ProtocolError(Exception):
    """The peer broke the protocol; `code` is the ERROR code that answers it."""

    code: ErrorCode

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class FrameError(ProtocolError):
    """Fatal framing error: send ERROR `code` (rid 0) and close the connection.

    `frames` holds the frames and Invalids that the failing `FrameDecoder.feed` call
    completed before it met the error, in order; the caller should handle them before
    closing (a LOGOUT or SEND pipelined ahead of garbage is still a valid request).
    """

    frames: list[Frame | Invalid]

    def __init__(
        self, code: ErrorCode, message: str, frames: Iterable[Frame | Invalid] = ()
    ) -> None:
        super().__init__(code, message)
        self.frames = list(frames)


class TokenError(ProtocolError):
    """A token failed verification; `reason` says why (for logs, never for the peer)."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(ErrorCode.AUTH_FAILED, f"token rejected: {reason}")
        self.reason = reason
