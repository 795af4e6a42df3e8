"""Route watch: notice that the route store lost this node's routes, or could not be
reached, and make good what fan-out missed in the meantime.

Fan-out finds receivers through the route store (Redis in production). When Redis loses
its data (FLUSHDB, a restart without persistence, a failover to an empty replica) every
live connection is still connected but has no route, so pushes to it stop, silently,
until its next renewal (`route_renew_s`, 30 s). When Redis is out of reach, fan-out's
route lookups fail and pushes are dropped the same way.

Every `route_check_s` (1 s) the node calls `RouteStore.mark(node_id)`: one round trip,
whatever the number of connections. Then:

- the marker was missing (the data is gone): every live route of the node is renewed at
  once (renewal re-creates an absent route, never one a newer login owns), in pipelines
  of `CHUNK` routes, and then every session is sent SYNC_HINT, paced over
  `sync_hint_spread_s`, so that what was committed while the routes were gone is pulled;
- the check failed, or a fan-out lookup failed since the last good check: pushes were
  dropped, so once a check succeeds again every session is sent SYNC_HINT the same way.
  A check that failed while the node's own event loop was late (storage/looplag.py) is
  overload, not an outage: nothing was dropped by it, and no SYNC_HINT follows.

The hints go out only after the re-registration finished, so a message committed after a
client's SYNC is pushed to it. A loss noticed while a recovery is still running is
handled after it. What this does not cover: a node that can reach Redis while another
node cannot; the receivers of that other node's dropped fan-out are hinted only if their
own node also saw Redis fail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from gateway.periodic import Periodic
from storage.looplag import overloaded
from storage.models import Route
from storage.ports import RouteStore

CHUNK: Final = 2_000  # routes renewed per pipeline while re-registering


class _Session(Protocol):
    @property
    def route(self) -> Route | None: ...

    @property
    def active(self) -> bool: ...


class RouteWatch:
    def __init__(
        self,
        routes: RouteStore,
        node_id: str,
        *,
        every_s: float,
        sessions: Callable[[], Sequence[_Session]],
        hint_all: Callable[[str], Any],
        log: Any,
        on_loss: Callable[[], None] = lambda: None,
    ) -> None:
        self._routes = routes
        self._node_id = node_id
        self._sessions = sessions
        self._hint_all = hint_all  # awaitable: SYNC_HINT to every session, paced
        self._log = log
        self._on_loss = on_loss
        self._lost = False  # routes must be registered again
        self._missed = False  # pushes may have been dropped: hint every session
        self._loop = Periodic(every_s, self.check, log=log, failed="route check failed")

    async def start(self) -> None:
        """Set the marker (a node that starts has no routes to lose), then check on."""
        try:
            await self._routes.mark(self._node_id)
        except Exception:
            self._missed = True  # nothing to hint yet; harmless
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    @property
    def owes_hints(self) -> bool:
        """A loss or outage was seen and its SYNC_HINTs have not started yet."""
        return self._missed or self._lost

    def fanout_failed(self) -> None:
        """A fan-out route lookup failed: its pushes were dropped."""
        self._missed = True

    async def check(self) -> None:
        """One check, and the recovery it calls for (see the module docstring)."""
        try:
            lost = await self._routes.mark(self._node_id)
        except Exception as e:
            if overloaded():
                # This node is too late to tell (its own loop is behind, not the route
                # store): no push was lost to this check, and hinting every session
                # would add to the overload. Fan-out lookups that failed say so
                # themselves (fanout_failed).
                self._log.warning("route check failed while this node is overloaded", error=repr(e))
                return
            if not self._missed:
                self._log.warning("route store unreachable; pushes may be missed", error=repr(e))
            self._missed = True
            return
        if lost:
            self._lost = self._missed = True
            self._on_loss()
            self._log.warning(
                "route store lost this node's routes; registering them again",
                sessions=len(self._sessions()),
            )
        if self._lost:
            await self._register_all()  # raises on failure: retried at the next check
            self._lost = False
        if self._missed:
            self._missed = False
            self._log.warning("sending SYNC_HINT after a route-store outage or loss")
            await self._hint_all("route store outage")

    async def _register_all(self) -> None:
        sessions = self._sessions()
        for i in range(0, len(sessions), CHUNK):
            # still logged in when the chunk goes (renewing a closed one's route would
            # bring it back until its TTL)
            chunk = [r for c in sessions[i : i + CHUNK] if c.active and (r := c.route)]
            await self._routes.renew(chunk)
