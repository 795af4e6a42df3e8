"""Fan-out: frames to every online device of a set of users, coalesced.

Deliveries requested in the same event-loop iteration (all the acks of one group commit
land in one) are resolved together: one route lookup for the union of their users (one
Redis round trip, not one per message), then one write per local connection carrying
every frame for it (a busy group's member gets a commit's messages in one system call)
and, for users on other nodes, one bus publish per node carrying every frame for it.
Best effort: a failed lookup is logged and counted, and the frames still go to the
users' connections on this node (`local`: the node knows its own sessions without the
route store), so a Redis outage or a master's failover stops only the pushes to other
nodes; a failed publish is counted by the bus (it never raises). Receivers catch up with
SYNC/PULL, those behind a failed lookup are sent SYNC_HINT once the route store answers
again (the route watch), and those behind a lost publish once the node can publish again
(`FanOut._lost`).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

from gateway import envelope
from gateway.metrics import Metrics
from gateway.ports import Session
from protocol.codec import encode
from protocol.frames import SyncHint
from storage.ports import Bus, Delivery, RouteStore

MISSED_RETRY_S: Final = 1.0
MISSED_CAP: Final = 100_000  # connection ids remembered per node; beyond, their next sync
_SYNC_HINT: Final = encode(SyncHint())


# Told, once a delivery is done, the (uid, device)s its payload was written to (here, or
# published to their node with the broker's confirm).
Seen = Callable[[frozenset[tuple[int, str]]], None]


class _Delivery(NamedTuple):
    uids: Sequence[int]
    payload: bytes
    skip: Session | None
    seen: Seen | None


class FanOut:
    """The fan-out of one node. It reads the node's sessions (`sessions`, conn_id ->
    session; `local`, a uid's sessions here) and nothing else of it; `on_lookup_failed`
    is told when a route lookup failed (the route watch then hints every session once
    Redis answers again)."""

    __slots__ = (
        "_bus",
        "_local",
        "_log",
        "_loop",
        "_metrics",
        "_missed",
        "_missed_task",
        "_node_id",
        "_on_lookup_failed",
        "_pending",
        "_routes",
        "_running",
        "_scheduled",
        "_sessions",
        "_spawn",
        "_throttle",
        "failures",
    )

    def __init__(
        self,
        *,
        node_id: str,
        loop: asyncio.AbstractEventLoop,
        routes: RouteStore,
        bus: Bus,
        sessions: Mapping[int, Session],
        local: Callable[[int], Iterable[Session]],
        metrics: Metrics,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        on_lookup_failed: Callable[[], None],
        log: Any,
        throttle: Callable[[str], int | None],
    ) -> None:
        self._node_id = node_id
        self._loop = loop
        self._routes = routes
        self._bus = bus
        self._sessions = sessions
        self._local = local
        self._metrics = metrics
        self._spawn = spawn
        self._on_lookup_failed = on_lookup_failed
        self._log = log
        self._throttle = throttle
        self._pending: list[_Delivery] = []
        self._scheduled = False
        self._running: set[asyncio.Task[None]] = set()
        self._missed: dict[str, set[int]] = {}  # node -> its connections behind lost publishes
        self._missed_task: asyncio.Task[None] | None = None
        self.failures = 0  # deliveries that lost frames (lookup failed, publish lost)

    def deliver(
        self,
        uids: Sequence[int],
        payload: bytes,
        skip: Session | None = None,
        seen: Seen | None = None,
    ) -> None:
        """Write `payload` to every online device of `uids` except `skip`, soon; then
        tell `seen` which devices it went to (not when the route lookup failed)."""
        if not uids:
            if seen is not None:
                seen(frozenset())
            return
        self._pending.append(_Delivery(uids, payload, skip, seen))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        if batch:
            task = self._spawn(self._deliver(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def settled(self) -> bool:
        """Wait until every delivery requested so far is done; False if any delivery
        that ended meanwhile lost frames (a failed lookup or a lost publish)."""
        before = self.failures
        if self._pending:
            self._flush()
        if self._running:
            await asyncio.wait(list(self._running))
        return self.failures == before

    @property
    def owes_hints(self) -> bool:
        """Whether SYNC_HINTs for frames lost on the bus are still to be sent."""
        return bool(self._missed)

    def close(self) -> None:
        if self._missed_task is not None:
            self._missed_task.cancel()

    async def _deliver(self, batch: list[_Delivery]) -> None:
        wanted = {u for d in batch for u in d.uids}
        try:
            online = await self._routes.online(list(wanted))
        except Exception as e:
            self._metrics.fanout_failures.inc()
            self.failures += 1
            self._on_lookup_failed()
            if (held := self._throttle("fan-out lookup")) is not None:
                self._log.warning(
                    "fan-out route lookup failed",
                    users=len(wanted),
                    error=repr(e),
                    similar_held_back=held,
                )
            self._deliver_here(batch)
            return
        me = self._node_id
        sessions = self._sessions
        pushes = 0
        local: dict[Session, list[bytes]] = {}  # in order: one write per connection
        remote: dict[str, list[envelope.Item]] = defaultdict(list)
        # deliveries that want to know where their payload went: index in `batch` ->
        # the devices written here, and per node the devices published to
        written: dict[int, set[tuple[int, str]]] = {}
        far_devices: dict[str, list[tuple[int, tuple[int, str]]]] = defaultdict(list)
        for i, d in enumerate(batch):
            far: dict[str, list[int]] = {}
            got = written.setdefault(i, set()) if d.seen is not None else None
            for uid in d.uids:
                for r in online.get(uid, ()):
                    if r.node == me:
                        conn = sessions.get(r.conn_id)
                        # the route must be this connection's own (same login epoch)
                        if conn is not None and conn is not d.skip and conn.route == r:
                            if (frames := local.get(conn)) is None:
                                local[conn] = [d.payload]
                            else:
                                frames.append(d.payload)
                            pushes += 1
                            if got is not None and conn.active:  # closing: dropped, offline
                                got.add((uid, r.device))
                    else:
                        far.setdefault(r.node, []).append(r.conn_id)
                        if got is not None:
                            far_devices[r.node].append((i, (uid, r.device)))
            for target, conn_ids in far.items():
                remote[target].append((conn_ids, d.payload))
        for conn, frames in local.items():
            conn.write(frames[0] if len(frames) == 1 else b"".join(frames))
        self._metrics.pushes.inc(pushes)
        if remote:  # one publish per node, all at once (each may wait for a broker confirm)
            results = await asyncio.gather(
                *(self._bus.publish(t, envelope.frames(items)) for t, items in remote.items())
            )
            for (target, items), result in zip(remote.items(), results, strict=True):
                if result is Delivery.LOST:  # that node is alive: tell its clients later
                    self.failures += 1
                    self._lost(target, (c for conn_ids, _ in items for c in conn_ids))
                else:
                    for i, device in far_devices.get(target, ()):
                        written[i].add(device)
        for i, got in written.items():
            seen = batch[i].seen
            assert seen is not None
            seen(frozenset(got))

    def _deliver_here(self, batch: list[_Delivery]) -> None:
        """Without routes: the frames to the users' connections on this node. Their
        `seen` is not told (where else the frames went is unknown)."""
        local: dict[Session, list[bytes]] = {}
        for d in batch:
            for uid in d.uids:
                for conn in self._local(uid):
                    if conn is not d.skip:
                        local.setdefault(conn, []).append(d.payload)
        for conn, frames in local.items():
            conn.write(frames[0] if len(frames) == 1 else b"".join(frames))
        self._metrics.pushes.inc(sum(map(len, local.values())))

    def _lost(self, target: str, conn_ids: Iterable[int]) -> None:
        """Frames for `conn_ids` on node `target` were lost on the way (our bus link was
        down, or the broker did not confirm): send them SYNC_HINT once we can publish
        again, so they catch up without waiting for their next reconnect."""
        ids = self._missed.setdefault(target, set())
        if len(ids) < MISSED_CAP:
            ids.update(conn_ids)
        if self._missed_task is None:
            self._missed_task = self._loop.create_task(self._hint_missed())

    async def _hint_missed(self) -> None:
        try:
            while self._missed:
                await asyncio.sleep(MISSED_RETRY_S)
                for target in list(self._missed):
                    ids = self._missed.pop(target)
                    hint = envelope.frames([(list(ids), _SYNC_HINT)])
                    if await self._bus.publish(target, hint) is Delivery.LOST:
                        self._missed.setdefault(target, set()).update(ids)  # next round
        finally:
            self._missed_task = None
