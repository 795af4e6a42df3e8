"""Incremental, sans-I/O decoder: bytes in, typed frames out (docs/protocol.md, Frames).

`FrameDecoder.feed` takes whatever the transport read and returns every frame it
completes, or at most `limit` of them: the rest stays buffered, undecoded, and
`feed(b"", limit)` goes on with it (`ahead` says whether a whole frame waits). A server
stops there when a client is over its budget, so one read of tiny frames costs it a
bounded number of frames, not every frame in the read. Three outcomes per frame:

* a typed frame (`protocol.frames`) of the direction this side accepts;
* `Invalid` (UNKNOWN_OP or BAD_REQUEST): answer with an ERROR, keep the connection;
* `FrameError` (BAD_FRAME or FRAME_TOO_LARGE), raised: send the ERROR and close.
  Frames completed earlier in the same `feed` ride on the exception as `.frames`.
  The decoder is dead afterwards: every later `feed` raises again.

Memory: an idle decoder holds no buffer. Without a limit only the tail of a partial
frame is kept between calls, and a frame's LEN is checked as soon as its 4 header bytes
are in, so the decoder never holds more than ``max_frame + 4`` bytes; a feed stopped at
its limit also keeps what it did not decode (the caller bounds that: it stops reading).
Whole frames are decoded straight from the caller's chunk; each byte is copied at most
once into the buffer (and a partial tail at most once more), so total work is
O(bytes fed) whatever the chunking.
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

    __slots__ = ("_buf", "_failure", "_max_frame", "_parsers", "_side", "_start", "ahead")

    def __init__(self, *, max_frame: int = MAX_FRAME_DEFAULT, side: Side) -> None:
        if not 1 <= max_frame <= 0xFFFFFFFF:
            raise ValueError(f"max_frame must be in 1..2^32-1, got {max_frame}")
        self._max_frame = max_frame
        self._side = side
        self._parsers = _PARSERS[side]
        # Undecoded bytes from _start on, never empty: a partial frame (header included,
        # _start 0), or, after a feed stopped at its limit (ahead), whole frames first.
        self._buf: bytearray | None = None
        self._start = 0
        # A feed stopped at its limit before a whole frame (or a LEN it will refuse):
        # `feed(b"")` goes on with it. Read-only outside.
        self.ahead = False
        self._failure: tuple[ErrorCode, str] | None = None

    @property
    def max_frame(self) -> int:
        return self._max_frame

    @property
    def side(self) -> Side:
        return self._side

    @property
    def buffered(self) -> int:
        """Bytes held: a partial frame until more data arrives, and after a feed that
        stopped at its limit, the whole frames it did not decode."""
        return 0 if self._buf is None else len(self._buf) - self._start

    @property
    def failed(self) -> bool:
        """Whether a FrameError was raised (the decoder accepts nothing more)."""
        return self._failure is not None

    def feed(self, data: Data, limit: int = 0) -> list[Decoded]:
        """Append `data`; return the frames it completes, in order: at most `limit` of
        them when `limit` > 0 (the rest is kept; see `ahead`).

        Raises `FrameError` on a framing error; its `.frames` holds the frames this
        call completed before the error.
        """
        if self._failure is not None:
            code, message = self._failure
            raise FrameError(code, f"decoder already failed: {message}")
        frames: list[Decoded] = []
        try:
            if self.ahead:
                return self._feed_ahead(data, frames, limit)
            pos = 0
            if self._buf is not None:
                pos = self._finish_partial(data, frames)
                if self._buf is not None:
                    return frames  # `data` went into the still partial frame
            # Decode whole frames straight from `data`; only the rest is copied. (The
            # loop of _split, inlined: this is every read's path.)
            end = len(data)
            most = limit or -1
            while end - pos >= HEADER_SIZE and len(frames) != most:
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
                self.ahead = 0 < limit <= len(frames) and self._whole_at(self._buf, 0)
        except FrameError as exc:
            self._buf = None
            self.ahead = False
            self._failure = (exc.code, str(exc))  # not exc: its traceback pins `data`
            exc.frames = frames
            raise
        return frames

    def _split(self, data: Data, pos: int, frames: list[Decoded], limit: int) -> int:
        """Decode the whole frames of `data` from `pos` on (at most `limit` in `frames`
        when `limit` > 0); return where the first one not decoded starts."""
        end = len(data)
        most = limit or -1
        while end - pos >= HEADER_SIZE and len(frames) != most:
            size: int = _unpack_len(data, pos)[0]
            if size == 0 or size > self._max_frame:
                raise self._bad_len(size)
            stop = pos + HEADER_SIZE + size
            if stop > end:
                break
            frames.append(_decode_body(data[pos + HEADER_SIZE : stop], self._parsers, self._side))
            pos = stop
        return pos

    def _whole_at(self, buf: Data, pos: int) -> bool:
        """A whole frame (or a LEN the next feed refuses) starts at `pos` of `buf`."""
        if len(buf) - pos < HEADER_SIZE:
            return False
        size: int = _unpack_len(buf, pos)[0]
        return size == 0 or size > self._max_frame or len(buf) - pos >= HEADER_SIZE + size

    def _feed_ahead(self, data: Data, frames: list[Decoded], limit: int) -> list[Decoded]:
        """`feed` while whole frames wait in the buffer: `data` goes behind them."""
        buf = self._buf
        assert buf is not None
        if data:
            buf += data
        view = memoryview(buf)
        try:
            pos = self._split(view, self._start, frames, limit)
            if pos < len(buf) and 0 < limit <= len(frames) and self._whole_at(view, pos):
                self._start = pos  # still ahead: no copy
                return frames
            rest = bytearray(view[pos:]) if pos < len(buf) else None
        finally:
            view.release()
        self._buf, self._start, self.ahead = rest, 0, False  # at most a partial frame
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
