"""SYNC on MySQL, coalesced: SYNCs asked together share one multi-statement query (up
to SYNC_BATCH_MAX), and one more for all their unread counts.

After a mass reconnect thousands arrive at once; one pooled connection per SYNC, held
while a saturated loop got round to each reply, left them queueing until the store
timeout answered `unavailable`. When a batch goes is a `Pacer`'s (storage/pacing.py):
at most SYNC_IN_FLIGHT out, at most one every SYNC_LINGER_S under load, at once when
idle. (One batch per event-loop iteration sent 1.3-1.5 SYNCs a batch in a reconnect
storm.)

A batch first asks which of its users have any conversation changed since their `since`
(one statement for the whole batch); a first page of a user with none is empty and costs
no statement of its own. After a mass reconnect that is nearly every user: a client
keeps the `next_since` of its last pass, and little changed while it was away.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

from storage.errors import StoreUnavailable
from storage.models import SyncPage, SyncRow
from storage.mysql import sql
from storage.mysql.transactions import Cursor, Row, Transactions, next_rows
from storage.pacing import Pacer
from storage.rules import count_in_runs

SYNC_BATCH_MAX: Final = 64  # SYNCs per multi-statement query
SYNC_IN_FLIGHT: Final = 3  # batches out at once
# Between batches, under load. A 100,000-client storm on 7 workers asks ~200 SYNCs a
# second of each: 2 ms made batches of about one (824 us of gateway CPU per reconnect),
# 20 ms 436 us, 40 ms 360 us (docs/decisions.md, "Coalescers are paced"). A ceiling: one
# batch of SYNC_BATCH_MAX per linger, 1,600 first pages a second per worker.
SYNC_LINGER_S: Final = 0.04
_SYNC_SQL: Final = """SELECT m.conv_id AS cid, c.kind, COALESCE(m.left_seq, s.max_seq) AS max_seq,
  m.read_seq, COALESCE(d.seq, 0), COALESCE(m.left_ms, s.last_active_ms) AS last_active,
  (m.left_seq IS NULL),
  GREATEST(COALESCE(m.left_ms, s.last_active_ms), m.updated_ms,
           COALESCE(d.updated_ms, 0)) AS changed
FROM im_conv_member m
JOIN im_conversation c ON c.conv_id = m.conv_id
JOIN im_conv_seq s ON s.conv_id = m.conv_id
LEFT JOIN im_delivered d ON d.uid = m.uid AND d.device = %s AND d.conv_id = m.conv_id
WHERE m.uid = %s
HAVING changed >= %s AND (last_active < %s OR (last_active = %s AND cid < %s))
ORDER BY last_active DESC, cid DESC
LIMIT %s"""

# A first SYNC (since 0) filters nothing by change time, so the page is chosen from the
# member and seq rows alone; the conversation and delivered rows are joined for the
# page's rows only (a user in 40,000 conversations: 3 lookups per row fewer, 1 in 3).
_SYNC_FIRST_SQL: Final = """SELECT p.cid, c.kind, p.max_seq, p.read_seq, COALESCE(d.seq, 0),
  p.last_active, p.is_member, p.last_active
FROM (
  SELECT m.conv_id AS cid, COALESCE(m.left_seq, s.max_seq) AS max_seq, m.read_seq,
    COALESCE(m.left_ms, s.last_active_ms) AS last_active, (m.left_seq IS NULL) AS is_member
  FROM im_conv_member m JOIN im_conv_seq s ON s.conv_id = m.conv_id
  WHERE m.uid = %s
  HAVING last_active < %s OR (last_active = %s AND cid < %s)
  ORDER BY last_active DESC, cid DESC
  LIMIT %s
) p
JOIN im_conversation c ON c.conv_id = p.cid
LEFT JOIN im_delivered d ON d.uid = %s AND d.device = %s AND d.conv_id = p.cid
ORDER BY p.last_active DESC, p.cid DESC"""


# Which asks of a batch (their first pages) have anything to list: the rows _SYNC_SQL
# would select, without the cursor. One derived row per ask (k, uid, device, since).
_CHANGED_SQL: Final = """SELECT a.k FROM ({asks}) a WHERE EXISTS (
  SELECT 1 FROM im_conv_member m
  JOIN im_conv_seq s ON s.conv_id = m.conv_id
  LEFT JOIN im_delivered d ON d.uid = m.uid AND d.device = a.device AND d.conv_id = m.conv_id
  WHERE m.uid = a.uid AND GREATEST(COALESCE(m.left_ms, s.last_active_ms), m.updated_ms,
    COALESCE(d.updated_ms, 0)) >= a.since)"""


@dataclass(slots=True)
class _SyncAsk:
    uid: int
    device: str
    since_ms: int
    after: tuple[int, int] | None
    limit: int
    fut: asyncio.Future[SyncPage]

    def query(self) -> tuple[str, tuple[int | str, ...]]:
        a_active, a_conv = self.after if self.after is not None else ((1 << 62), 0)
        if self.since_ms <= 0:
            return _SYNC_FIRST_SQL, (
                self.uid, a_active, a_active, a_conv, self.limit + 1, self.uid, self.device,
            )  # fmt: skip
        return _SYNC_SQL, (
            self.device, self.uid, self.since_ms, a_active, a_active, a_conv, self.limit + 1,
        )  # fmt: skip


def _sync_row(r: Row, unread: dict[int, int]) -> SyncRow:
    return SyncRow(
        int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), unread.get(int(r[0]), 0),
        int(r[5]), bool(r[6]),
    )  # fmt: skip


class SyncBatcher:
    """`ask` answers one SYNC page; the asks made together go together."""

    def __init__(self, db: Transactions, table_of: Callable[[int], str]) -> None:
        self._db = db
        self._table_of = table_of  # the message table (shard) of a conversation
        self._syncs: list[_SyncAsk] = []  # asked, not yet sent
        self._pacer = Pacer(
            self._next_batch,
            lambda: len(self._syncs),
            self._cancel_waiting,
            in_flight=SYNC_IN_FLIGHT,
            linger_s=SYNC_LINGER_S,
        )

    async def ask(
        self,
        uid: int,
        device: str,
        *,
        changed_since_ms: int,
        after: tuple[int, int] | None,
        limit: int,
    ) -> SyncPage:
        """One page of the user's conversations changed since `changed_since_ms`,
        asked together with the other SYNCs waiting for the next batch."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SyncPage] = loop.create_future()
        self._syncs.append(_SyncAsk(uid, device, changed_since_ms, after, limit, fut))
        # A next page does not wait out the linger: its client asks page after page.
        self._pacer.request(now=after is not None)
        return await fut

    def _next_batch(self) -> Coroutine[Any, Any, None]:
        asks = self._syncs[:SYNC_BATCH_MAX]
        del self._syncs[:SYNC_BATCH_MAX]
        return self._sync_batch(asks)

    def _cancel_waiting(self) -> None:  # shutdown: so are the asks still waiting
        asks, self._syncs = self._syncs, []
        for a in asks:
            a.fut.cancel()

    async def _sync_batch(self, asks: list[_SyncAsk]) -> None:
        async def q(cur: Cursor) -> tuple[list[list[Row]], list[dict[int, int]]]:
            todo = await self._changed(cur, asks)
            pages: list[list[Row]] = [[] for _ in asks]
            if todo:
                await cur.execute(";".join(cur.mogrify(*asks[k].query()) for k in todo))
                pages[todo[0]] = list(await cur.fetchall())
                for k in todo[1:]:
                    pages[k] = list(await next_rows(cur))
            return pages, await self._unread(cur, asks, pages)

        try:
            pages, unread = await self._db.run(q, tx=False)
        except Exception as e:
            for a in asks:
                if not a.fut.done():  # a fresh exception each: raised in many tasks
                    a.fut.set_exception(
                        StoreUnavailable(str(e)) if isinstance(e, StoreUnavailable) else e
                    )
            return
        except BaseException:
            for a in asks:
                a.fut.cancel()
            raise
        for a, rows, counts in zip(asks, pages, unread, strict=True):
            page = [_sync_row(r, counts) for r in rows[: a.limit]]
            if not a.fut.done():
                a.fut.set_result(SyncPage(page, len(rows) > a.limit))

    @staticmethod
    async def _changed(cur: Cursor, asks: Sequence[_SyncAsk]) -> list[int]:
        """The asks (indexes) that may list rows: every later page, and the first pages
        of users with a conversation changed since their `since`."""
        firsts = [(k, a) for k, a in enumerate(asks) if a.after is None]
        if not firsts:
            return list(range(len(asks)))
        row = "SELECT %s AS k, %s AS uid, %s AS device, %s AS since"
        asked = (cur.mogrify(row, (k, a.uid, a.device, a.since_ms)) for k, a in firsts)
        await cur.execute(_CHANGED_SQL.format(asks=" UNION ALL ".join(asked)))
        changed = {int(r[0]) for r in await cur.fetchall()}
        return [k for k, a in enumerate(asks) if a.after is not None or k in changed]

    async def _unread(
        self, cur: Cursor, asks: Sequence[_SyncAsk], pages: Sequence[Sequence[Row]]
    ) -> list[dict[int, int]]:
        """Unread counts of every page: range scans of (conv_id, seq), one query per
        shard per user, and of the archived batches' unread runs, one per user, all in
        one round trip (more only past 1 MiB of SQL). The archived runs are read first:
        a batch archived between the two reads is then missed once, never counted twice
        (its hot rows are gone when they are counted)."""
        archived: list[str] = []
        hot: list[str] = []
        owner: list[int] = []  # the ask each statement counts for: archived, then hot
        hot_owner: list[int] = []
        ranges_of: list[dict[int, tuple[int, int]]] = []  # per ask: conv_id -> range
        for n, (a, rows) in enumerate(zip(asks, pages, strict=True)):
            by_shard: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
            for r in rows[: a.limit]:
                conv_id, max_seq, read_seq = int(r[0]), int(r[2]), int(r[3])
                if max_seq > read_seq:
                    by_shard[self._table_of(conv_id)].append((conv_id, read_seq, max_seq))
            ranges = [x for shard in by_shard.values() for x in shard]
            ranges_of.append({c: (lo, hi) for c, lo, hi in ranges})
            if ranges:
                archived.append(sql.archived_unread_runs(a.uid, ranges))
                owner.append(n)
            for table, shard_ranges in by_shard.items():
                hot.append(sql.unread_counts(table, a.uid, shard_ranges))
                hot_owner.append(n)
        n_archived = len(archived)
        owner += hot_owner
        counts: list[dict[int, int]] = [{} for _ in asks]
        k = 0
        for query in sql.queries(archived + hot):
            await cur.execute(query)
            for m in range(query.count(";") + 1):
                rows = await cur.fetchall() if m == 0 else await next_rows(cur)
                mine = counts[owner[k]]
                if k < n_archived:
                    runs: dict[int, list[tuple[int, int, int, bytes]]] = defaultdict(list)
                    for c, n, first, last, seqs in rows:
                        runs[int(c)].append((int(n), int(first), int(last), bytes(seqs)))
                    for c, found in runs.items():
                        lo, hi = ranges_of[owner[k]][c]
                        mine[c] = mine.get(c, 0) + count_in_runs(found, lo, hi)
                else:
                    for c, n in rows:
                        mine[int(c)] = mine.get(int(c), 0) + int(n)
                k += 1
        return counts
