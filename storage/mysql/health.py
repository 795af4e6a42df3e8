"""Whether a shard server is down: from a failure that says it cannot be reached until
a probe of it answers again.

With several servers, one that does not answer must not hold up the others' work: a
send batch spanning servers is answered when every server's part is, and a SYNC asks
every server. Waiting the store timeout for a dead server on each of them would hold
every batch (and the healthy messages in it) and every SYNC for that long. So the first
failure marks the server down; while it is down its part of a batch fails at once
(`unavailable`, nothing stored), a SYNC answers without it (a partial page), and a probe
(`SELECT 1`, every PROBE_S) marks it up when it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Final

from asyncmy import errors as db_errors

from storage.errors import StoreUnavailable

PROBE_S: Final = 0.1  # between probes of a server that is down
PROBE_TIMEOUT_S: Final = 1.0  # a probe not answered within this has failed

_UNREACHABLE: Final = (
    TimeoutError,
    OSError,
    ConnectionError,
    db_errors.OperationalError,
    db_errors.InterfaceError,
)


def unreachable(e: BaseException) -> bool:
    """Whether `e` (a StoreUnavailable and its causes) says the server could not be
    reached or did not answer, rather than refusing one statement (a shard moving, a
    conflict that kept coming back)."""
    if not isinstance(e, StoreUnavailable):
        return False
    # Causes and contexts both: a StoreUnavailable re-raised `from None` (the send path
    # does, after asking what landed) keeps its story in its context only.
    seen: set[int] = set()
    todo: list[BaseException] = [e]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, _UNREACHABLE):
            return True
        todo += [y for y in (x.__cause__, x.__context__) if y is not None]
    return False


class ServerHealth:
    """Up or down, for one server; `ping` asks it something small."""

    __slots__ = ("_on_up", "_ping", "_probe", "down_count", "name")

    def __init__(
        self, name: str, ping: Callable[[], Awaitable[None]], on_up: Callable[[], None]
    ) -> None:
        self.name = name  # host:port, for the error a down server's work fails with
        self._ping = ping
        self._on_up = on_up  # called when a server that was down answers again
        self._probe: asyncio.Task[None] | None = None
        self.down_count = 0  # times it was marked down

    @property
    def down(self) -> bool:
        return self._probe is not None

    def error(self) -> StoreUnavailable:
        """What work given to a server that is down fails with."""
        return StoreUnavailable(f"MySQL server {self.name} is down (probing it)")

    def failed(self, e: BaseException) -> None:
        """One of its operations failed with `e`: if `e` says it cannot be reached, it
        is down until a probe answers."""
        if self._probe is not None or not unreachable(e):
            return
        self.down_count += 1
        self._probe = asyncio.get_running_loop().create_task(self._until_up())

    async def _until_up(self) -> None:
        while True:
            await asyncio.sleep(PROBE_S)
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    await self._ping()
            except Exception:
                continue
            self._probe = None
            self._on_up()
            return

    async def close(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
