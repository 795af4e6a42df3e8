"""A hashed timing wheel: one loop timer per node drives every connection's deadlines.

Entries are never removed from a slot: each carries the deadline and the slot it is armed
for, and a slot that comes round skips entries armed elsewhere since. Pushing a deadline
later (every inbound frame extends the idle deadline) touches nothing: the entry fires at
its old deadline and `on_timer` returns the new one. So liveness costs no wheel work, and a
closed connection costs one list slot until its slot fires.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol


class Timed(Protocol):
    timer_at: float  # the deadline this entry is armed for; 0.0 = not armed
    timer_slot: int  # the slot holding the live entry

    def on_timer(self, now: float) -> float | None:
        """Handle due work; return the next deadline (loop time) or None to stop."""
        ...


class TimingWheel:
    __slots__ = (
        "_clock",
        "_cursor",
        "_handle",
        "_loop",
        "_slot_ids",
        "_slots",
        "_tick",
        "_tick_at",
        "on_error",
        "on_tick",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        tick_s: float = 0.25,
        slots: int = 512,
        on_tick: Callable[[], None] | None = None,
        on_error: Callable[[Timed | None, Exception], None] | None = None,
    ) -> None:
        self._loop = loop
        self._clock = loop.time
        self._tick = tick_s
        self._slots: list[list[Timed]] = [[] for _ in range(slots)]
        # Slot numbers handed to entries are these shared ints: past 256 a computed int is
        # an object of its own (28 bytes a connection, a million on a big node).
        self._slot_ids = tuple(range(slots))
        self._tick_at = self._clock()  # loop time of the slot under the cursor
        self._cursor = 0
        self._handle: asyncio.TimerHandle | None = None
        self.on_tick = on_tick
        # told when an entry's on_timer (the entry) or on_tick (None) raises; the wheel
        # goes on either way, and the failed entry is left disarmed
        self.on_error = on_error

    def start(self) -> None:
        if self._handle is None:
            self._tick_at = self._clock()
            self._handle = self._loop.call_at(self._tick_at + self._tick, self._advance)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def schedule(self, entry: Timed, deadline: float) -> None:
        """Arm `entry` for `deadline` (loop time). Arming for a later deadline than the one
        already armed is a no-op on the wheel: the entry re-arms itself when it fires."""
        if entry.timer_at and entry.timer_at <= deadline:
            return
        slot = self._slot_for(deadline)
        entry.timer_at = deadline
        entry.timer_slot = slot
        self._slots[slot].append(entry)

    def _slot_for(self, deadline: float) -> int:
        ticks = max(1, int((deadline - self._tick_at) / self._tick) + 1)
        ticks = min(ticks, len(self._slots) - 1)
        return self._slot_ids[(self._cursor + ticks) % len(self._slots)]

    def _advance(self) -> None:
        now = self._clock()
        # Catch up on every slot whose time has come (the loop may have been busy).
        while self._tick_at + self._tick <= now:
            self._tick_at += self._tick
            self._cursor = (self._cursor + 1) % len(self._slots)
            bucket = self._slots[self._cursor]
            if bucket:
                self._slots[self._cursor] = []
                self._fire(bucket, self._cursor, now)
        self._handle = self._loop.call_at(self._tick_at + self._tick, self._advance)
        if self.on_tick is not None:
            try:
                self.on_tick()
            except Exception as e:
                self._failed(None, e)

    def _fire(self, bucket: list[Timed], slot: int, now: float) -> None:
        for entry in bucket:
            at = entry.timer_at
            if not at or entry.timer_slot != slot:
                continue  # disarmed, or armed in another slot since
            entry.timer_at = 0.0
            if at > now:
                self.schedule(entry, at)  # beyond the wheel's span: go round again
                continue
            try:
                nxt = entry.on_timer(now)
            except Exception as e:  # one entry's bug must not stop every other timer
                self._failed(entry, e)
                continue
            if nxt is not None:
                self.schedule(entry, nxt)

    def _failed(self, entry: Timed | None, e: Exception) -> None:
        if self.on_error is not None:
            with contextlib.suppress(Exception):
                self.on_error(entry, e)
