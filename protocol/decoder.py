"""Incremental, sans-I/O decoder: bytes in, typed frames out (docs/protocol.md, Frames).

`FrameDecoder.feed` takes whatever the transport read and returns every frame it
completes. Three outcomes per frame:

* a typed frame (`protocol.frames`) of the direction this side accepts;
* `Invalid` (UNKNOWN_OP or BAD_REQUEST): answer with an ERROR, keep the connection;
* `FrameError` (BAD_FRAME or FRAME_TOO_LARGE), raised: send the ERROR and close.
  Frames completed earlier in the same `feed` ride on the exception as `.frames`.
  The decoder is dead afterwards: every later `feed` raises again.

Memory: an idle decoder holds no buffer. Only the tail of a partial frame is kept
between calls, and a frame's LEN is checked as soon as its 4 header bytes are in, so
the decoder never holds more than ``max_frame + 4`` bytes. Whole frames are decoded
straight from the caller's chunk; each byte is copied at most once into the
buffer, so total work is O(bytes fed) whatever the chunking.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Final, TypeAlias

import msgpack

from protocol.errors import FrameError
from protocol.frames import Frame, Invalid
from protocol.ops import HEADER_SIZE, MAX_FRAME_DEFAULT, MAX_U64, ErrorCode, Op
from protocol.parsers import (
    CLIENT_FRAME_PARSERS,
    RID_OPS,
    SERVER_FRAME_PARSERS,
    FieldError,
)

Decoded: TypeAlias = Frame | Invalid
Data: TypeAlias = bytes | bytearray | memoryview

_Parsers: TypeAlias = Mapping[int, Callable[[list[Any]], Frame]]

_unpack_len: Final = struct.Struct(">I").unpack_from
_unpackb: Final = msgpack.unpackb


class Side(Enum):
    """Which end of the connection the decoder runs in."""

    SERVER = "server"
    """Runs in the server: accepts client ops; server ops are UNKNOWN_OP."""
    CLIENT = "client"
    """Runs in a client: accepts server ops; client ops are UNKNOWN_OP."""


_PARSERS: Final[Mapping[Side, _Parsers]] = {
    Side.SERVER: CLIENT_FRAME_PARSERS,
    Side.CLIENT: SERVER_FRAME_PARSERS,
}


def _rid_of(body: list[Any]) -> int:
    rid = body[1] if len(body) > 1 else 0
    return rid if type(rid) is int and 0 <= rid <= MAX_U64 else 0


def _op_name(op: int) -> str:
    try:
        return f"{op} ({Op(op).name})"
    except ValueError:
        return str(op)


def decode_body(body: Data, side: Side) -> Decoded:
    """Decode one frame body (without LEN) as received by `side`.

    Returns the frame or an `Invalid`; raises `FrameError` BAD_FRAME when `body` is
    not one msgpack array starting with a positive int op.
    """
    return _decode_body(body, _PARSERS[side], side)


def _decode_body(body: Data, parsers: _Parsers, side: Side) -> Decoded:
    try:
        # unpackb (msgpack >= 1.0) sets every max_*_len limit from len(body) by itself
        # (test_framing pins this), so a hostile length prefix cannot allocate more
        # than the frame; passing them again costs ~25% of the call. Nesting is
        # bounded by msgpack's StackError. Any failure is the peer's: bad_frame.
        obj = _unpackb(body, raw=False, strict_map_key=False)
    except Exception as exc:
        raise FrameError(
            ErrorCode.BAD_FRAME, f"body is not one msgpack value: {type(exc).__name__}: {exc}"
        ) from None
    if type(obj) is not list or not obj:
        raise FrameError(ErrorCode.BAD_FRAME, "body is not a non-empty msgpack array")
    op = obj[0]
    if type(op) is not int or op < 1:
        raise FrameError(ErrorCode.BAD_FRAME, f"op must be a positive int, got {op!r:.40}")
    parser = parsers.get(op)
    if parser is None:
        accepted = "client" if side is Side.SERVER else "server"
        return Invalid(
            op, _rid_of(obj), ErrorCode.UNKNOWN_OP, f"op {_op_name(op)} is not a {accepted} op"
        )
    try:
        return parser(obj)
    except FieldError as exc:
        rid = _rid_of(obj) if op in RID_OPS else 0
        return Invalid(op, rid, ErrorCode.BAD_REQUEST, str(exc))


class FrameDecoder:
    """Splits a byte stream into frames and decodes them; one per connection."""

    __slots__ = ("_buf", "_failure", "_max_frame", "_parsers", "_side")

    def __init__(self, *, max_frame: int = MAX_FRAME_DEFAULT, side: Side) -> None:
        if not 1 <= max_frame <= 0xFFFFFFFF:
            raise ValueError(f"max_frame must be in 1..2^32-1, got {max_frame}")
        self._max_frame = max_frame
        self._side = side
        self._parsers = _PARSERS[side]
        self._buf: bytearray | None = None  # partial frame (header included), never empty
        self._failure: tuple[ErrorCode, str] | None = None

    @property
    def max_frame(self) -> int:
        return self._max_frame

    @property
    def side(self) -> Side:
        return self._side

    @property
    def buffered(self) -> int:
        """Bytes of a partial frame held until more data arrives."""
        return 0 if self._buf is None else len(self._buf)

    @property
    def failed(self) -> bool:
        """Whether a FrameError was raised (the decoder accepts nothing more)."""
        return self._failure is not None

    def feed(self, data: Data) -> list[Decoded]:
        """Append `data`; return the frames it completes, in order.

        Raises `FrameError` on a framing error; its `.frames` holds the frames this
        call completed before the error.
        """
        if self._failure is not None:
            code, message = self._failure
            raise FrameError(code, f"decoder already failed: {message}")
        frames: list[Decoded] = []
        try:
            pos = 0
            if self._buf is not None:
                pos = self._finish_partial(data, frames)
                if self._buf is not None:
                    return frames  # `data` went into the still partial frame
            # Decode whole frames straight from `data`; only a partial tail is copied.
            end = len(data)
            while end - pos >= HEADER_SIZE:
                size: int = _unpack_len(data, pos)[0]
                if size == 0 or size > self._max_frame:
                    raise self._bad_len(size)
                stop = pos + HEADER_SIZE + size
                if stop > end:
                    break
                frames.append(
                    _decode_body(data[pos + HEADER_SIZE : stop], self._parsers, self._side)
                )
                pos = stop
            if pos < end:
                self._buf = bytearray(memoryview(data)[pos:])
        except FrameError as exc:
            self._buf = None
            self._failure = (exc.code, str(exc))  # not exc: its traceback pins `data`
            exc.frames = frames
            raise
        return frames

    def _finish_partial(self, data: Data, frames: list[Decoded]) -> int:
        """Complete the buffered frame from `data`; return how many bytes it took."""
        buf = self._buf
        assert buf is not None
        used = 0
        if len(buf) < HEADER_SIZE:
            used = min(HEADER_SIZE - len(buf), len(data))
            buf += data[:used]
            if len(buf) < HEADER_SIZE:
                return used
        size: int = _unpack_len(buf)[0]
        if size == 0 or size > self._max_frame:
            raise self._bad_len(size)
        need = HEADER_SIZE + size - len(buf)
        if len(data) - used < need:
            buf += memoryview(data)[used:]
            return len(data)
        buf += memoryview(data)[used : used + need]
        self._buf = None
        frames.append(_decode_body(memoryview(buf)[HEADER_SIZE:], self._parsers, self._side))
        return used + need

    def _bad_len(self, size: int) -> FrameError:
        if size == 0:
            return FrameError(ErrorCode.BAD_FRAME, "frame LEN is 0")
        return FrameError(
            ErrorCode.FRAME_TOO_LARGE, f"frame LEN {size} exceeds max_frame {self._max_frame}"
        )
