"""A node's side of the transactional outbox (see storage/mysql/outbox.py).

Every group commit of a node sharing its store with other nodes records the fan-out it
owes in the commit. This keeper:

- clears those rows once their fan-out has been delivered (`delivered`, then one DELETE
  a second for everything delivered since); a row whose fan-out lost frames (the route
  lookup failed, a publish was lost) stays until the node has sent the SYNC_HINTs that
  such failures trigger (`owes_hints` false; at most `MAX_RETRIED` rows are kept). So
  if the node dies while its bus link or Redis is down, a survivor still delivers what
  it could not;
- keeps the node's lease (`node_lease_s`, 5 s, renewed every second);
- every second, claims the nodes whose lease lapsed (killed, or cut off from MySQL) and
  delivers what they owed: each message PUSHed again to every online device of every
  current member (clients dedup by seq), then their rows deleted and their lease
  dropped. So a kill -9 between a commit and its fan-out delays the PUSH by at most the
  lease plus a second, instead of leaving it to the receiver's next reconnect; what the
  dead node owed the notify webhook (its hook rows) is adopted too (`adopt`);
- at start, first delivers what a predecessor with the same node id left;
- every second, reads every node's lease, to tell which connections are gone with their
  process (`gone`): those of a node whose lease lapsed or was claimed (it stays dead,
  after a survivor deleted its row, for `DEAD_REMEMBERED_S` or until it holds a lease
  again), and those of an earlier process of a node restarted with the same node id
  (the lease carries the current process's connection-id floor). The node skips the
  duplicate-login kicks it would publish to those: after a node dies, every one of its
  clients that logs in elsewhere names it, thousands a second in a reconnect storm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

from gateway.periodic import Periodic
from storage.models import OutboxRow
from storage.ports import Outbox

SWEEP_PAGE: Final = 200  # rows of a dead node read at a time
MAX_RETRIED: Final = 10_000  # rows kept until the failure's SYNC_HINTs are out
DEAD_REMEMBERED_S: Final = 600.0  # a dead node whose lease row is gone is still dead


class OutboxKeeper:
    def __init__(
        self,
        outbox: Outbox,
        node_id: str,
        *,
        lease_s: float,
        redeliver: Callable[[OutboxRow], Awaitable[None]],
        settled: Callable[[], Awaitable[bool]],
        owes_hints: Callable[[], bool],
        log: Any,
        every_s: float = 1.0,
        conn_floor: int = 0,
        adopt: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._outbox = outbox
        self._node_id = node_id
        self._conn_floor = conn_floor  # this process's connection ids are above it
        self._ttl_ms = int(lease_s * 1000)
        self._redeliver = redeliver  # PUSH a row's messages again
        self._adopt = adopt  # take over a dead node's other duties (its notify rows)
        self._settled = settled  # wait for the fan-out requested so far; False: frames lost
        self._owes_hints = owes_hints  # SYNC_HINTs for lost frames not sent yet
        self._log = log
        self._fresh: set[int] = set()  # committed in this loop iteration
        self._done: set[int] = set()  # delivered, to delete
        self._held: set[int] = set()  # delivery lost frames: kept until hinted
        self._dead: dict[str, float] = {}  # node -> when its lease was last seen dead
        self._floors: dict[str, int] = {}  # live node -> its process's connection-id floor
        self._loop = Periodic(every_s, self.tick, log=log, failed="outbox upkeep failed")
        self._background: set[asyncio.Task[None]] = set()
        self.redelivered = 0  # rows of dead nodes delivered again (metrics)

    async def start(self) -> None:
        await self._outbox.keep_lease(self._node_id, self._ttl_ms, self._conn_floor)
        await self._sweep(self._node_id)  # left by a predecessor with our node id
        self._outbox.record_for(self._node_id)
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    async def finish(self) -> None:
        """At the end of a clean shutdown (after the last commit): clear what was
        delivered and drop the lease, so that no other node delivers it again."""
        self.stop()
        if self._background:
            await asyncio.wait(list(self._background))
        try:
            if self._done:
                await self._outbox.clear(list(self._done))
                self._done.clear()
            # lapsed at once: swept if rows remain
            await self._outbox.keep_lease(self._node_id, 0, self._conn_floor)
        except Exception as e:
            self._log.warning("outbox not cleared at shutdown", error=repr(e))

    def delivered(self, outbox_id: int) -> None:
        """A message of outbox row `outbox_id` was handed to fan-out in this iteration;
        the row is cleared once that fan-out is done."""
        if not self._fresh:
            asyncio.get_running_loop().call_soon(self._after_fanout)
        self._fresh.add(outbox_id)

    def _after_fanout(self) -> None:
        ids, self._fresh = self._fresh, set()
        task = asyncio.get_running_loop().create_task(self._settle(ids))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _settle(self, ids: set[int]) -> None:
        if await self._settled():
            self._done |= ids
        elif len(self._held) < MAX_RETRIED:
            self._held |= ids
        else:
            self._done |= ids

    async def tick(self) -> None:
        """Renew the lease, clear delivered rows, take over lapsed nodes."""
        await self._outbox.keep_lease(self._node_id, self._ttl_ms, self._conn_floor)
        if self._done:
            done, self._done = self._done, set()
            try:
                await self._outbox.clear(list(done))
            except Exception:
                self._done |= done
                raise
        if self._held and not self._owes_hints():
            self._done |= self._held  # cleared at the next tick
            self._held = set()
        await self._learn_leases()  # before the claims below: those may take a while
        for node in await self._outbox.claim_lapsed(self._node_id, self._ttl_ms):
            self._log.warning("taking over the fan-out of a lapsed node", dead=node)
            await self._sweep(node)
            if self._adopt is not None:
                await self._adopt(node)
            await self._outbox.release(node, self._node_id)

    def gone(self, node: str, conn_id: int) -> bool:
        """Connection `conn_id` of `node` is known gone: `node`'s lease lapsed (or a
        survivor claimed it) and it has not held one since, or the node's current
        process started after that connection was made."""
        return node in self._dead or conn_id <= self._floors.get(node, 0)

    async def _learn_leases(self) -> None:
        states = await self._outbox.leases()
        now = asyncio.get_running_loop().time()
        self._floors = {n: s.conn_floor for n, s in states.items() if s.live}
        for node, state in states.items():
            if state.live or node == self._node_id:
                self._dead.pop(node, None)
            else:
                self._dead[node] = now
        for node, seen in list(self._dead.items()):
            if node not in states and now - seen > DEAD_REMEMBERED_S:
                del self._dead[node]

    async def _sweep(self, node: str) -> None:
        while rows := await self._outbox.owed(node, SWEEP_PAGE):
            if node != self._node_id:  # a long sweep must not make us look dead
                await self._outbox.keep_lease(self._node_id, self._ttl_ms, self._conn_floor)
            for row in rows:
                await self._redeliver(row)
            await self._settled()  # what still failed is hinted by its own path
            await self._outbox.clear([r.id for r in rows])
            self.redelivered += len(rows)
