"""When a coalescer sends what has gathered: `Pacer`.

Route writes, SYNC pages and duplicate-login kicks are each sent in batches, one round
trip for many callers. Sending a batch every event-loop iteration sent about one call a
batch in a reconnect storm: a loop busy with thousands of sockets turns over thousands of
times a second, and each batch is a syscall on both sides of a socket. So a pacer sends
a batch when

- something is waiting,
- fewer than `in_flight` batches are out, and
- `linger_s` has passed since the last batch went, unless the call asked not to wait
  (`request(now=True)`: a SYNC's next page, whose client waits on each page in turn).

So under load batches go at most every `linger_s` and grow with the load (up to the
owner's batch size: beyond it, calls queue); a call made when no batch went for
`linger_s` goes at the end of the event-loop iteration it was made in. Calls made
meanwhile wait for the next batch.

Sending full batches at once instead of waiting out the linger lets clients be told
`unavailable` more than twice in a 100,000-client storm (71 and 2,571 of them, SYNCs
timing out in MariaDB) where waiting tells none (docs/decisions.md, "Coalescers are
paced").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class Pacer:
    """Runs `take()` (the coroutine sending the next batch, taken from its owner's queue)
    whenever the rules above allow and `waiting()` says the owner has calls queued.
    `cancelled()` is called when a batch was cancelled (shutdown): the owner cancels
    the calls still queued. `spawn` makes the batch's task (default: the loop's
    create_task), so an owner can keep track of its background work."""

    __slots__ = (
        "_cancelled", "_last", "_linger", "_max", "_scheduled", "_spawn", "_take",
        "_tasks", "_timer", "_waiting",
    )  # fmt: skip

    def __init__(
        self,
        take: Callable[[], Coroutine[Any, Any, None]],
        waiting: Callable[[], int],
        cancelled: Callable[[], None],
        *,
        in_flight: int,
        linger_s: float,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None,
    ) -> None:
        self._spawn = spawn
        self._take = take
        self._waiting = waiting
        self._cancelled = cancelled
        self._max = in_flight
        self._linger = linger_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None  # a send waiting out the linger
        self._last = float("-inf")  # loop time the last batch went

    @property
    def out(self) -> int:
        """Batches sent and not yet answered."""
        return len(self._tasks)

    def request(self, *, now: bool = False) -> None:
        """The owner queued a call: send it as soon as the rules allow (`now`: without
        waiting for the linger)."""
        if len(self._tasks) >= self._max:
            return  # the next batch goes when one comes back (_done)
        loop = asyncio.get_running_loop()
        wait = self._last + self._linger - loop.time()
        urgent = wait <= 0 or now
        if self._scheduled:
            if urgent and self._timer is not None:  # was waiting out the linger
                self._timer.cancel()
                self._timer = None
                loop.call_soon(self._send)
            return
        self._scheduled = True
        if urgent:
            loop.call_soon(self._send)
        else:
            self._timer = loop.call_later(wait, self._send)

    def _send(self) -> None:
        self._scheduled = False
        self._timer = None
        loop = asyncio.get_running_loop()
        if self._waiting() and len(self._tasks) < self._max:
            self._last = loop.time()
            task = (self._spawn or loop.create_task)(self._take())
            self._tasks.add(task)
            task.add_done_callback(self._done)
        if self._waiting():
            self.request()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            self._cancelled()
        elif self._waiting():
            self.request()
