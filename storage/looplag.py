"""Backend call deadlines that tell an overloaded node from a backend outage.

A Redis or MySQL call is bounded by a timeout on the event loop's clock. When the loop
itself is late (a flood keeps it busy for hundreds of milliseconds at a time), the
answer can be sitting in the socket while the timeout fires: the node then takes its
own slowness for an outage, answers `unavailable` or `outcome_unknown`, and sends
SYNC_HINT to every session. So:

- `LoopLag` measures how late the loop runs: a handle every TICK_S notes how late it
  fired (one per loop, started by the first `Deadline`; ~10 wakeups a second).
- `Deadline(limit_s)` replaces `asyncio.timeout(limit_s)` around backend calls. When
  its limit passes while the loop is late (`LoopLag.overloaded`: a tick, or this very
  deadline, ran more than LATE_S late within the last WINDOW_S), it grants the call
  another `limit_s`, at most MAX_EXTENSIONS times; otherwise the call is cut at its
  limit, as by `asyncio.timeout` (TimeoutError).
- `overloaded()` lets the route watch tell a check that failed because the node was
  late from an outage (no push was lost: no SYNC_HINT).
"""

from __future__ import annotations

import asyncio
import weakref
from types import TracebackType
from typing import Final

TICK_S: Final = 0.1
LATE_S: Final = 0.05  # a loop this late is overloaded: a backend's answer may be waiting
WINDOW_S: Final = 2.0
MAX_EXTENSIONS: Final = 2  # a call waits at most 3 limits while the node is overloaded


class LoopLag:
    """How late one event loop runs its handles."""

    __slots__ = ("_due", "_loop", "late_at", "worst_s")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.late_at = float("-inf")  # when a handle last ran more than LATE_S late
        self.worst_s = 0.0  # the lateness of the latest tick (seconds)
        self._due = loop.time() + TICK_S
        loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        now = self._loop.time()
        self.note(now - self._due, now)
        self._due = now + TICK_S
        self._loop.call_at(self._due, self._tick)

    def note(self, late_s: float, now: float) -> None:
        self.worst_s = late_s
        if late_s > LATE_S:
            self.late_at = now

    def overloaded(self) -> bool:
        now = self._loop.time()
        if now - self._due > LATE_S:  # the tick itself is overdue: late right now
            return True
        return now - self.late_at < WINDOW_S


_LAGS: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopLag]] = (
    weakref.WeakKeyDictionary()
)


def loop_lag(loop: asyncio.AbstractEventLoop | None = None) -> LoopLag:
    """The running (or given) loop's LoopLag, started on first use."""
    loop = loop or asyncio.get_running_loop()
    lag = _LAGS.get(loop)
    if lag is None:
        lag = _LAGS[loop] = LoopLag(loop)
    return lag


def overloaded() -> bool:
    """Whether the running loop has been late within the last WINDOW_S."""
    return loop_lag().overloaded()


class Deadline:
    """`async with Deadline(limit_s):` bounds the block like `asyncio.timeout(limit_s)`
    (TimeoutError when cut), but grants it more time while the loop is late."""

    __slots__ = ("_extensions", "_handle", "_lag", "_limit_s", "_loop", "_timeout", "_when")

    def __init__(self, limit_s: float) -> None:
        self._limit_s = limit_s
        self._extensions = 0

    async def __aenter__(self) -> Deadline:
        loop = self._loop = asyncio.get_running_loop()
        self._lag = loop_lag(loop)
        self._timeout = asyncio.timeout(None)  # armed only when the call is to be cut
        await self._timeout.__aenter__()
        self._when = loop.time() + self._limit_s
        self._handle = loop.call_at(self._when, self._due)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._handle.cancel()
        await self._timeout.__aexit__(exc_type, exc, tb)

    def _due(self) -> None:
        loop = self._loop
        now = loop.time()
        lag = self._lag
        lag.note(now - self._when, now)  # this handle's own lateness counts too
        if self._extensions < MAX_EXTENSIONS and lag.overloaded():
            self._extensions += 1
            self._when = now + self._limit_s
            self._handle = loop.call_at(self._when, self._due)
            return
        self._timeout.reschedule(now)  # cut: the block gets TimeoutError
