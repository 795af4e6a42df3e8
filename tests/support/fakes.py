"""Fakes for driving a protocol object (gateway.connection.Connection) and the timing
wheel without sockets or a running loop, modelled on uvicorn's MockTransport.

`FakeTransport` records every byte written and what was asked of it (pause/resume
reading, close, abort), and keeps a write buffer with asyncio's water marks: past the high
mark it calls the protocol's `pause_writing`, and once the test lets the peer read it down
to the low mark, `resume_writing`. `connection_lost` is never called behind the test's
back: call `lose()`.

`ManualClock` is a loop's `time`, `call_at`, `call_later` and `call_soon`, moved by hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

HIGH_WATER = 64 * 1024  # asyncio's defaults
LOW_WATER = 16 * 1024


class FakeTransport(asyncio.Transport):
    def __init__(
        self,
        protocol: asyncio.BaseProtocol | None = None,
        *,
        peername: tuple[str, int] = ("127.0.0.1", 50000),
        sockname: tuple[str, int] = ("127.0.0.1", 7070),
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__({"peername": peername, "sockname": sockname, **(extra or {})})
        self.protocol = protocol
        self.written = bytearray()  # every byte accepted, in order
        self.unread = bytearray()  # accepted and not yet read by the peer (`take`)
        self.reading = True
        self.pauses = 0  # pause_reading calls that paused
        self.closed = False  # close() was called
        self.aborted = False  # abort() was called
        self.lost = False  # lose() delivered connection_lost
        self.late_writes = 0  # writes after close/abort: dropped, as asyncio drops them
        self.writing_paused = False  # the protocol was told pause_writing
        self._high = HIGH_WATER
        self._low = LOW_WATER

    # -- asyncio.Transport ------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed or self.aborted:
            self.late_writes += 1
            return
        self.written += data
        self.unread += data
        self._check_high()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False  # close() stands for the whole goodbye, as a bare fd's transport

    def abort(self) -> None:
        self.aborted = True
        self.unread.clear()

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def pause_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.pauses += 1

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = HIGH_WATER if high is None else high
        self._low = self._high // 4 if low is None else low
        self._check_high()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return len(self.unread)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    # -- the test's side --------------------------------------------------------------

    def take(self, n: int | None = None) -> bytes:
        """The peer reads `n` bytes (all by default): they leave the write buffer, and the
        protocol is told `resume_writing` once the buffer is down to the low mark."""
        n = len(self.unread) if n is None else min(n, len(self.unread))
        data = bytes(self.unread[:n])
        del self.unread[:n]
        if self.writing_paused and len(self.unread) <= self._low:
            self.writing_paused = False
            if isinstance(self.protocol, asyncio.Protocol):
                self.protocol.resume_writing()
        return data

    def lose(self, exc: Exception | None = None) -> None:
        """The connection is gone: deliver `connection_lost(exc)` to the protocol, once."""
        if self.lost:
            return
        self.lost = True
        self.closed = True
        if self.protocol is not None:
            self.protocol.connection_lost(exc)

    def _check_high(self) -> None:
        if not self.writing_paused and len(self.unread) > self._high:
            self.writing_paused = True
            if isinstance(self.protocol, asyncio.Protocol):
                self.protocol.pause_writing()


class TimerHandle:
    def __init__(self, when: float, seq: int, callback: Callable[..., object], args: Any) -> None:
        self.when = when
        self.seq = seq  # equal times run in the order they were asked for
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A loop's clock and timers, moved by hand: `advance(s)` / `run_until(t)` run every
    timer due by then at its own time, in time order, as a loop that is never late would;
    `stall_to(t)` moves the clock without running anything (a busy loop)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self._timers: list[TimerHandle] = []
        self._seq = 0

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> TimerHandle:
        self._seq += 1
        handle = TimerHandle(when, self._seq, callback, args)
        self._timers.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> TimerHandle:
        return self.call_at(self.now + delay, callback, *args)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> TimerHandle:
        return self.call_at(self.now, callback, *args)

    def pending(self) -> list[TimerHandle]:
        return [h for h in self._timers if not h.cancelled]

    def stall_to(self, t: float) -> None:
        self.now = max(self.now, t)

    def run_until(self, t: float) -> None:
        while True:
            due = [h for h in self.pending() if h.when <= t]
            if not due:
                break
            first = min(due, key=lambda h: (h.when, h.seq))
            self._timers.remove(first)
            self.now = max(self.now, first.when)
            first.callback(*first.args)
        self.now = max(self.now, t)

    def advance(self, seconds: float) -> None:
        self.run_until(self.now + seconds)
