"""The transactional outbox on MySQL (`storage.ports.Outbox`).

A group commit that stores messages also inserts one `im_outbox` row, in the same
transaction and the same round trip as the messages: its id (a snowflake), the
committing node, and the runs of seqs it stored (`[[conv_id, lo, hi], ...]`, msgpack).
So whatever is committed is also recorded as owed, and nothing is recorded that was not
committed. The node deletes the rows once their fan-out is delivered, in batches.

Each node writing rows keeps a lease row in `im_node_lease` (`expires_ms`, renewed
every second). When a lease lapses (the node was killed, or cannot reach MySQL), any
surviving node claims it with a compare-and-set UPDATE (`claimed_by`, a fresh expiry),
reads the dead node's rows, delivers them again and deletes them, then drops the lease.
A survivor that dies in the middle lets its claim lapse and the next one takes over.
Deliveries may repeat (a node that was only cut off delivered some itself); clients
dedup by seq.

Cost on the healthy path: one short INSERT inside each commit's existing round trip,
one DELETE per node per second for the delivered rows, one lease UPSERT per second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgpack

from storage.models import NodeLease, OutboxRow, StoredMessage

if TYPE_CHECKING:
    from storage.mysql.transactions import Cursor, Row, Transactions


def entries_of(msgs: Sequence[StoredMessage]) -> list[list[int]]:
    """Runs of consecutive seqs per conversation: [[conv_id, lo, hi], ...]."""
    runs: list[list[int]] = []
    last: dict[int, list[int]] = {}
    for m in sorted(msgs, key=lambda m: (m.conv_id, m.seq)):
        run = last.get(m.conv_id)
        if run is not None and run[2] + 1 == m.seq:
            run[2] = m.seq
        else:
            last[m.conv_id] = run = [m.conv_id, m.seq, m.seq]
            runs.append(run)
    return runs


def insert_row(row_id: int, node: str, msgs: Sequence[StoredMessage], now: int) -> str:
    """The INSERT a commit adds to its statements (literals only: see storage.mysql.sql)."""
    blob = msgpack.packb(entries_of(msgs))
    return (
        "INSERT INTO im_outbox (id, node, entries, created_ms) VALUES "
        f"({row_id:d},X'{node.encode().hex()}',X'{blob.hex()}',{now:d})"
    )


def _entries(blob: bytes) -> tuple[tuple[int, int, int], ...]:
    return tuple((int(c), int(lo), int(hi)) for c, lo, hi in msgpack.unpackb(blob))


class MySQLOutbox:
    def __init__(self, db: Transactions, clock: Callable[[], int]) -> None:
        self._db = db
        self._clock = clock
        self.node = ""  # set: every append records its fan-out for this node

    def record_for(self, node: str) -> None:
        self.node = node

    async def clear(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        listed = ",".join(str(int(i)) for i in ids)

        async def q(cur: Cursor) -> None:
            await cur.execute(f"DELETE FROM im_outbox WHERE id IN ({listed})")

        await self._db.run(q, tx=False)

    async def keep_lease(self, node: str, ttl_ms: int, conn_floor: int = 0) -> None:
        async def q(cur: Cursor) -> None:
            await cur.execute(
                "INSERT INTO im_node_lease (node, expires_ms, claimed_by, conn_floor) "
                "VALUES (%s, %s, '', %s) ON DUPLICATE KEY UPDATE "
                "expires_ms=VALUES(expires_ms), claimed_by='', conn_floor=VALUES(conn_floor)",
                (node, self._clock() + ttl_ms, conn_floor),
            )

        await self._db.run(q, tx=False)

    async def claim_lapsed(self, me: str, ttl_ms: int) -> list[str]:
        now = self._clock()

        async def q(cur: Cursor) -> list[str]:
            await cur.execute(
                "SELECT node FROM im_node_lease WHERE expires_ms < %s ORDER BY expires_ms LIMIT 16",
                (now,),
            )
            claimed = []
            for (node,) in await cur.fetchall():
                n = await cur.execute(
                    "UPDATE im_node_lease SET expires_ms=%s, claimed_by=%s "
                    "WHERE node=%s AND expires_ms < %s",
                    (now + ttl_ms, me, node, now),
                )
                if n:
                    claimed.append(str(node))
            return claimed

        return await self._db.run(q, tx=False)

    async def leases(self) -> dict[str, NodeLease]:
        now = self._clock()

        async def q(cur: Cursor) -> list[Row]:
            await cur.execute("SELECT node, expires_ms, claimed_by, conn_floor FROM im_node_lease")
            return list(await cur.fetchall())

        rows = await self._db.run(q, tx=False)
        return {
            str(n): NodeLease(int(exp) >= now and not by, int(floor)) for n, exp, by, floor in rows
        }

    async def owed(self, node: str, limit: int) -> list[OutboxRow]:
        async def q(cur: Cursor) -> list[Row]:
            await cur.execute(
                "SELECT id, entries FROM im_outbox WHERE node=%s ORDER BY id LIMIT %s",
                (node, limit),
            )
            return list(await cur.fetchall())

        rows = await self._db.run(q, tx=False)
        return [OutboxRow(int(i), node, _entries(e)) for i, e in rows]

    async def release(self, node: str, me: str) -> bool:
        async def q(cur: Cursor) -> int:
            return int(
                await cur.execute(
                    "DELETE FROM im_node_lease WHERE node=%s AND claimed_by=%s "
                    "AND NOT EXISTS (SELECT 1 FROM im_outbox WHERE node=%s)",
                    (node, me, node),
                )
            )

        return bool(await self._db.run(q, tx=False))


class ShardedOutbox:
    """The outbox of a store whose shards may span several servers: each server's
    commits write their rows in that server's `im_outbox` (the same transaction as the
    messages); the leases stay in the metadata database. Clearing asks every server
    (row ids are snowflakes, unique across them); a dead node's rows are read from all.
    With the metadata database as the only server, each call is the MySQLOutbox's.
    """

    def __init__(self, meta: MySQLOutbox, servers: Sequence[MySQLOutbox]) -> None:
        self._meta = meta
        self._servers: list[MySQLOutbox] = []
        self.use(servers)

    @property
    def node(self) -> str:
        return self._meta.node

    def use(self, servers: Sequence[MySQLOutbox]) -> None:
        """The servers holding shards now (the shard map changed). Servers that left
        the map stay swept: their rows may still be owed."""
        for s in servers:
            if all(s is not x for x in self._servers):
                s.record_for(self._meta.node)
                self._servers.append(s)

    def _single(self) -> bool:
        return len(self._servers) == 1 and self._servers[0] is self._meta

    def record_for(self, node: str) -> None:
        self._meta.record_for(node)
        for s in self._servers:
            s.record_for(node)

    async def clear(self, ids: Sequence[int]) -> None:
        if self._single():
            await self._meta.clear(ids)
        elif ids:
            await asyncio.gather(*(s.clear(ids) for s in self._servers))

    async def keep_lease(self, node: str, ttl_ms: int, conn_floor: int = 0) -> None:
        await self._meta.keep_lease(node, ttl_ms, conn_floor)

    async def claim_lapsed(self, me: str, ttl_ms: int) -> list[str]:
        return await self._meta.claim_lapsed(me, ttl_ms)

    async def leases(self) -> dict[str, NodeLease]:
        return await self._meta.leases()

    async def owed(self, node: str, limit: int) -> list[OutboxRow]:
        if self._single():
            return await self._meta.owed(node, limit)
        pages = await asyncio.gather(*(s.owed(node, limit) for s in self._servers))
        return sorted((r for p in pages for r in p), key=lambda r: r.id)[:limit]

    async def release(self, node: str, me: str) -> bool:
        """Drop the lease once no server holds a row of `node` (the metadata database's
        own rows are checked in the same DELETE)."""
        others = [s for s in self._servers if s is not self._meta]
        owed = await asyncio.gather(*(s.owed(node, 1) for s in others))
        if any(owed):
            return False
        return await self._meta.release(node, me)
