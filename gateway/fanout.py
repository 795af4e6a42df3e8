"""Fan-out: frames to every online device of a set of users, coalesced.

Deliveries requested in the same event-loop iteration (all the acks of one group commit
land in one) are resolved together: one route lookup for the union of their users (one
Redis round trip, not one per message), then each frame written to its local connections
and, for users on other nodes, one bus publish per node carrying every frame for it.
Best effort: a failed lookup is logged and counted, a failed publish is counted by the
bus (it never raises); receivers catch up with SYNC/PULL, and those behind a lost publish
are sent SYNC_HINT once the node can publish again (`Node.missed`).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

import msgpack

from storage.ports import Delivery

if TYPE_CHECKING:
    from gateway.connection import Connection
    from gateway.node import Node

# Bus envelope: [kind, [[conn_ids, frame bytes], ...]]
BUS_FRAMES: Final = 1
BUS_KICK: Final = 2  # duplicate_login
BUS_REVOKE: Final = 3  # auth_revoked


class _Delivery(NamedTuple):
    uids: Sequence[int]
    payload: bytes
    skip: Connection | None


class FanOut:
    __slots__ = ("_node", "_pending", "_running", "_scheduled", "failures")

    def __init__(self, node: Node) -> None:
        self._node = node
        self._pending: list[_Delivery] = []
        self._scheduled = False
        self._running: set[asyncio.Task[None]] = set()
        self.failures = 0  # deliveries that lost frames (lookup failed, publish lost)

    def deliver(self, uids: Sequence[int], payload: bytes, skip: Connection | None = None) -> None:
        """Write `payload` to every online device of `uids` except `skip`, soon."""
        if not uids:
            return
        self._pending.append(_Delivery(uids, payload, skip))
        if not self._scheduled:
            self._scheduled = True
            self._node.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        if batch:
            task = self._node.spawn(self._deliver(batch))
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

    async def _deliver(self, batch: list[_Delivery]) -> None:
        node = self._node
        wanted = {u for d in batch for u in d.uids}
        try:
            online = await node.routes.online(list(wanted))
        except Exception as e:
            node.metrics.fanout_failures.inc()
            self.failures += 1
            node.route_watch.fanout_failed()  # hint every session once Redis answers again
            if (held := node.log_throttle.allow("fan-out lookup")) is not None:
                node.log.warning(
                    "fan-out route lookup failed",
                    users=len(wanted),
                    error=repr(e),
                    similar_held_back=held,
                )
            return
        me = node.node_id
        sessions = node.sessions
        pushes = 0
        remote: dict[str, list[tuple[list[int], bytes]]] = defaultdict(list)
        for d in batch:
            far: dict[str, list[int]] = {}
            for uid in d.uids:
                for r in online.get(uid, ()):
                    if r.node == me:
                        conn = sessions.get(r.conn_id)
                        # the route must be this connection's own (same login epoch)
                        if conn is not None and conn is not d.skip and conn.route == r:
                            conn.write(d.payload)
                            pushes += 1
                    else:
                        far.setdefault(r.node, []).append(r.conn_id)
            for target, conn_ids in far.items():
                remote[target].append((conn_ids, d.payload))
        node.metrics.pushes.inc(pushes)
        if remote:  # one publish per node, all at once (each may wait for a broker confirm)
            results = await asyncio.gather(
                *(
                    node.bus.publish(t, msgpack.packb([BUS_FRAMES, items]))
                    for t, items in remote.items()
                )
            )
            for (target, items), result in zip(remote.items(), results, strict=True):
                if result is Delivery.LOST:  # that node is alive: tell its clients later
                    self.failures += 1
                    node.missed(target, {c for conn_ids, _ in items for c in conn_ids})
