"""`imgw db add-server`: move message shards to a new server with the gateways running.

For the shards moving from server S to the new server N:

1. N's tables are created (and cleared of the moving shards' rows a failed earlier
   attempt left there: N holds no shard yet, nothing else writes them).
2. The change log starts on S (storage/mysql/changes.py): triggers on the moving message
   tables and on the colocated tables (conversation copy, seq, members, idempotency
   records, delivered cursors, archive index) write a log row in every transaction that
   changes a row of a moving shard. From here on every change of the shards on S is
   either visible to the copy or in the log.
3. The copy: each table in primary key order, `BATCH` rows a query (keyset pagination:
   `WHERE pk > last ORDER BY pk LIMIT n`), each batch written to N before the next is
   read: the tool holds one batch at a time, however large the shard. Sends go on
   meanwhile; what they change after a batch was read is in the log.
4. Catch-up: the log is applied in batches (each logged row's current version copied,
   or deleted on N when gone) until one pass leaves fewer than `CAUGHT_UP` rows behind.
5. The freeze: on S the shards' message tables are renamed
   (`im_message_0002` → `im_message_0002_moving`, all of S's moving shards in one atomic
   RENAME). RENAME waits until no transaction holds the table, and from then on every
   transaction of the shard fails on S ("no such table": the store answers
   `unavailable`, the client retries with the same id). That covers every write: a
   send, membership change, recall or archive run writes the message table itself, and
   the writes that do not — read positions, delivered cursors (`set_read`,
   `set_delivered`, the flushes of the positions Redis accepted) and a p2p
   conversation's rows — first read the message table of their shard in the same
   transaction (`sql.hold_shards`, a `LIMIT 0` read: it takes the table's metadata lock
   until commit, and fails once the table is renamed). So after the RENAME nothing of
   the shards commits on S any more.
6. The last catch-up drains the log; the triggers go.
7. The map is switched in one transaction in the metadata database. The freeze lasts
   from step 5 to here: the last catch-up (a few rows) and this transaction.
8. Every store reads the map each second (storage/mysql/store.py), and one whose write
   fails on a renamed shard table reads it at once; a write routed by the old map still
   fails on S (step 5) and is retried: a client retries its send, the position flush
   keeps what it could not write and writes it at its next flush, to N. Nothing written
   after the freeze is lost, and nothing written before it: read and delivered positions
   included.
9. The copy is checked: the row counts of each table on S (frozen) against N's as of
   the switch (a consistent snapshot taken on N before it). A difference keeps the old
   copy on S and fails the command.
10. After `grace_s`, the old copy goes: the renamed tables are dropped and the colocated
    rows deleted on S in batches (the metadata database keeps its `im_conversation`
    rows: they allocate conv_ids and keep p2p pairs unique). The message tables keep
    refusing: a store still on the old map finds no table of the shard on S.

A failure before the switch undoes the freeze and the log: the shards stay on S. One
move at a time: the change log of a server is the running move's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import resource
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Final

from storage.mysql.changes import (
    COLOCATED,
    ChangeLog,
    key_of,
    shard_filter,
    trigger_names,
    triggers,
)
from storage.mysql.schema import SCHEMA_VERSION, _connect, _create_on, message_table, read_map
from storage.mysql.settings import MySQLSettings
from storage.mysql.shardmap import (
    check_url,
    masked,
    owners,
    ranges_of,
    same_place,
    server_settings,
)

if TYPE_CHECKING:
    from asyncmy.connection import Connection
    from asyncmy.cursors import Cursor

BATCH: Final = 2000  # rows a query reads or writes: the tool's memory stays flat
CAUGHT_UP: Final = 200  # log rows left behind by a pass, at most, before the freeze
CATCH_UP_S: Final = 120.0  # then the shards freeze however far behind the log is
LOCK_WAIT_S: Final = 10  # DDL (trigger, rename) waits this long for running transactions
# A table of the moving shards whose count on S may differ from N's after the switch:
# the idempotency records expire on S as everywhere (`prune` deletes them, frozen or not).
_PRUNED: Final = ("im_send_dedup", "im_archive_sent")


def plan(owner: Sequence[str], url: str, take: int | None) -> list[str]:
    """The per-shard owners after adding server `url`: it takes `take` shards (an even
    share by default), each time the highest-numbered shard of the server holding the
    most (so every server keeps at least one)."""
    servers = list(dict.fromkeys(owner))
    share = len(owner) // (len(servers) + 1) if take is None else take
    if share < 1:
        raise ValueError(f"{len(owner)} shards over {len(servers)} servers: none left to move")
    new = list(owner)
    for _ in range(share):
        counts = {s: new.count(s) for s in servers}
        source = max(servers, key=lambda s: (counts[s], servers.index(s)))
        if counts[source] <= 1:
            raise ValueError(f"cannot move {share} shards: every server would keep fewer than 1")
        shard = max(i for i, s in enumerate(new) if s == source)
        new[shard] = url
    return new


def after(cols: Sequence[str]) -> str:
    """Keyset pagination: rows whose key `cols` is above the `%s` values (expanded, so
    that MariaDB reads it as a primary key range)."""
    terms = []
    for i, col in enumerate(cols):
        terms.append(" AND ".join([*(f"{c} = %s" for c in cols[:i]), f"{col} > %s"]))
    return "(" + " OR ".join(f"({t})" for t in terms) + ")"


def after_params(last: Sequence[object]) -> list[object]:
    return [v for i in range(len(last)) for v in last[: i + 1]]


async def pages(
    cur: Cursor, table: str, cols: Sequence[str], where: str, batch: int
) -> AsyncIterator[list[tuple[object, ...]]]:
    """`cols` of `table`'s rows matching `where`, in primary key order, `batch` rows a
    query; `cols` starts with the primary key."""
    pk = [c for c, _ in key_of(table.removesuffix("_moving"))]
    last: list[object] | None = None
    while True:
        cond = where if last is None else f"{where} AND {after(pk)}"
        await cur.execute(
            f"SELECT {', '.join(cols)} FROM {table} WHERE {cond} "
            f"ORDER BY {', '.join(pk)} LIMIT {int(batch):d}",
            [] if last is None else after_params(last),
        )
        rows = list(await cur.fetchall())
        if not rows:
            return
        yield rows
        last = list(rows[-1][: len(pk)])
        if len(rows) < batch:
            return


async def _rows(cur: Cursor, query: str) -> list[tuple[object, ...]]:
    await cur.execute(query)
    return list(await cur.fetchall())


async def _count(cur: Cursor, table: str, where: str) -> int:
    await cur.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _delete_rows(cur: Cursor, table: str, where: str, batch: int) -> int:
    """Delete `table`'s rows matching `where`, a page of primary keys at a time: each
    DELETE a range of the key's first column (which may reach past the page: those rows
    are to go too)."""
    pk = [c for c, _ in key_of(table)]
    gone = 0
    async for keys in pages(cur, table, pk, where, batch):
        await cur.execute(
            f"DELETE FROM {table} WHERE {where} AND {pk[0]} BETWEEN %s AND %s",
            (keys[0][0], keys[-1][0]),
        )
        gone += len(keys)
    return gone


@dataclasses.dataclass
class _Move:
    """The shards moving from one server S to N, and the connections doing it."""

    src: MySQLSettings
    dst: MySQLSettings
    shards: list[int]
    total: int
    batch: int
    log: Callable[[str], None]
    lines: list[str] = dataclasses.field(default_factory=list)
    frozen_at: float = 0.0
    renamed: bool = False
    last_changes: int = 0  # applied by the last catch-up, in the freeze
    _sconn: Connection | None = None
    _dconn: Connection | None = None
    s: Cursor = dataclasses.field(init=False)  # on S
    d: Cursor = dataclasses.field(init=False)  # on N
    changes: ChangeLog = dataclasses.field(init=False)

    @property
    def where(self) -> str:
        return shard_filter(self.shards, self.total)

    @property
    def name(self) -> str:
        return f"{self.src.host}:{self.src.port}/{self.src.database}"

    def tables(self) -> list[str]:
        return [*(message_table(i) for i in self.shards), *COLOCATED]

    async def open(self) -> tuple[Cursor, Cursor]:
        self._sconn, self._dconn = await _connect(self.src), await _connect(self.dst)
        s, d = self._sconn.cursor(), self._dconn.cursor()
        await s.execute(f"USE `{self.src.database}`")
        await d.execute(f"USE `{self.dst.database}`")
        await s.execute(f"SET SESSION lock_wait_timeout = {LOCK_WAIT_S:d}")
        await s.execute("SET SESSION sql_notes = 0")  # no "trigger does not exist" warnings
        self.s, self.d = s, d
        self.changes = ChangeLog(s, d)
        present = {str(t) for (t,) in await _rows(s, "SHOW TABLES LIKE 'im\\_message\\_%'")}
        left = [
            f"{message_table(i)}_moving TO {message_table(i)}"
            for i in self.shards
            if message_table(i) not in present and f"{message_table(i)}_moving" in present
        ]
        if left:  # frozen by an attempt that died: writable again
            await s.execute("RENAME TABLE " + ", ".join(left))
        return s, d

    def close(self) -> None:
        for conn in (self._sconn, self._dconn):
            if conn is not None:
                conn.close()

    async def start(self, *, dst_is_meta: bool) -> None:
        """Steps 1-2: N cleared of the shards' rows, the change log started on S."""
        s, d = self.s, self.d
        await s.execute("SHOW TABLES LIKE 'im\\_shard\\_change'")
        if await s.fetchone() is None:
            raise ValueError(
                f"{self.name}: schema older than {SCHEMA_VERSION}: run `imgw db migrate`"
            )
        for i in self.shards:
            await d.execute(f"TRUNCATE TABLE {message_table(i)}")
        for table in COLOCATED:
            if not (table == "im_conversation" and dst_is_meta):
                await _delete_rows(d, table, self.where, self.batch)
        await self.stop_log()
        await s.execute("DELETE FROM im_shard_change")
        for table in self.tables():
            for stmt in triggers(table, self.shards, self.total):
                await s.execute(stmt)
        self.log(f"{self.name}: change log of shards {self.shards} started")

    async def stop_log(self) -> None:
        for table in self.tables():
            for name in trigger_names(table):
                await self.s.execute(f"DROP TRIGGER IF EXISTS {name}")

    async def copy(self) -> None:
        """Step 3."""
        for table in self.tables():
            cols = await self.changes.columns(table)
            pk = [c for c, _ in key_of(table)]
            cols = [*pk, *(c for c in cols if c not in pk)]
            where = "1=1" if table.startswith("im_message_") else self.where
            marks = ", ".join(["%s"] * len(cols))
            copied = 0
            started = time.monotonic()
            async for rows in pages(self.s, table, cols, where, self.batch):
                await self.d.executemany(
                    f"REPLACE INTO {table} ({', '.join(cols)}) VALUES ({marks})", rows
                )
                copied += len(rows)
                if copied % (self.batch * 50) == 0:
                    self.log(f"{self.name}: {table}: {copied} rows copied")
            took = time.monotonic() - started
            self.lines.append(f"{table}: {copied} rows copied in {took:.1f} s")

    async def catch_up(self) -> None:
        """Step 4: apply the log until a pass leaves at most CAUGHT_UP rows."""
        started = time.monotonic()
        passes = 0
        while True:
            passes += 1
            while await self.changes.apply(self.batch) == self.batch:
                pass
            lag = await self.changes.lag(CAUGHT_UP + 1)
            if lag <= CAUGHT_UP or time.monotonic() - started > CATCH_UP_S:
                break
        self.log(
            f"{self.name}: caught up: {self.changes.applied} changes applied in {passes} "
            f"passes, {lag} behind"
        )

    async def freeze(self) -> None:
        """Step 5."""
        renames = ", ".join(f"{message_table(i)} TO {message_table(i)}_moving" for i in self.shards)
        await self.s.execute(f"RENAME TABLE {renames}")
        self.frozen_at = time.monotonic()
        self.renamed = True
        self.changes.source.update(
            {message_table(i): f"{message_table(i)}_moving" for i in self.shards}
        )

    async def drain(self) -> None:
        """Step 6: the log applied to its end (nothing of the shards commits on S now)."""
        before = self.changes.applied
        while await self.changes.apply(self.batch):
            pass
        await self.stop_log()
        await self.s.execute("DELETE FROM im_shard_change")
        self.last_changes = self.changes.applied - before

    async def undo(self) -> None:
        """Before the switch: the shards stay on S, writable, with no log."""
        if self._sconn is None:
            return
        if self.renamed:
            back = ", ".join(
                f"{message_table(i)}_moving TO {message_table(i)}" for i in self.shards
            )
            await self.s.execute(f"RENAME TABLE {back}")
            self.renamed = False
        await self.stop_log()
        await self.s.execute("DELETE FROM im_shard_change")

    async def counts_on_src(self, *, src_is_meta: bool) -> dict[str, int]:
        out = {}
        for i in self.shards:
            out[message_table(i)] = await _count(self.s, f"{message_table(i)}_moving", "1=1")
        for table in COLOCATED:
            if not (table == "im_conversation" and src_is_meta):
                out[table] = await _count(self.s, table, self.where)
        return out

    async def drop_old(self, *, src_is_meta: bool) -> None:
        """Step 10."""
        await self.s.execute(
            "DROP TABLE IF EXISTS " + ", ".join(f"{message_table(i)}_moving" for i in self.shards)
        )
        for table in COLOCATED:
            if not (table == "im_conversation" and src_is_meta):
                await _delete_rows(self.s, table, self.where, self.batch)


async def _snapshot_counts(
    conn: Connection, moves: Sequence[_Move], *, meta_of: Callable[[_Move], bool]
) -> dict[int, dict[str, int]]:
    """N's counts of each move's tables in the snapshot `conn` holds (then ended)."""
    out: dict[int, dict[str, int]] = {}
    async with conn.cursor() as cur:
        for k, m in enumerate(moves):
            counts = {t: await _count(cur, t, "1=1") for t in map(message_table, m.shards)}
            for table in COLOCATED:
                if not (table == "im_conversation" and meta_of(m)):
                    counts[table] = await _count(cur, table, m.where)
            out[k] = counts
        await cur.execute("COMMIT")
    return out


def _differences(src: dict[str, int], dst: dict[str, int]) -> list[str]:
    out = []
    for table, n in src.items():
        ok = dst[table] >= n if table in _PRUNED else dst[table] == n
        if not ok:
            out.append(f"{table}: {n} rows on the old server, {dst[table]} on the new one")
    return out


async def add_server(
    meta: MySQLSettings,
    url: str,
    *,
    take: int | None = None,
    grace_s: float = 3.0,
    batch: int = BATCH,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Move shards to the server at `url` (steps in the module's docstring); the
    lines to report."""
    check_url(url)
    conn = await _connect(meta)
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"USE `{meta.database}`")
            await cur.execute("SELECT value FROM im_meta WHERE name='shards'")
            row = await cur.fetchone()
            if row is None:
                raise ValueError(f"{meta.database}: no imgw schema; run `imgw db migrate`")
            total = int(row[0])
            ranges = await read_map(cur)
    finally:
        conn.close()
    meta = dataclasses.replace(meta, shards=total)
    home = f"mysql://{meta.host}:{meta.port}/{meta.database}"
    owner = owners(ranges, total) if ranges else [home] * total
    target = server_settings(meta, url)
    if any(same_place(server_settings(meta, u), target) for u in owner):
        raise ValueError(f"{url} already holds shards (see `imgw db status`)")
    new = plan(owner, url, take)
    moving: dict[str, list[int]] = {}
    for i, (old, now) in enumerate(zip(owner, new, strict=True)):
        if old != now:
            moving.setdefault(old, []).append(i)
    created = await _create_on(target, sorted(i for v in moving.values() for i in v))
    lines = [f"{target.host}:{target.port}/{target.database}: {line}" for line in created]
    moves = [
        _Move(server_settings(meta, source), target, shards, total, batch, log)
        for source, shards in moving.items()
    ]

    def is_meta(m: _Move) -> bool:
        return same_place(m.src, meta)

    snapshot: Connection | None = None
    try:
        for m in moves:
            await m.open()
            await m.start(dst_is_meta=same_place(target, meta))
            await m.copy()
            await m.catch_up()
        for m in moves:
            await m.freeze()
            log(f"{m.name}: shards {m.shards} frozen (tables renamed)")
        for m in moves:
            await m.drain()
        snapshot = await _connect(target)
        async with snapshot.cursor() as cur:
            await cur.execute(f"USE `{target.database}`")
            await cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        await _switch(meta, new)
        switched = time.monotonic()
    except BaseException:
        for m in moves:
            try:
                await m.undo()
            finally:
                m.close()
        if snapshot is not None:
            snapshot.close()
        raise
    for m in moves:
        lines += m.lines
        lines.append(
            f"{m.name}: shards {m.shards} frozen {switched - m.frozen_at:.3f} s "
            f"(rename to map switch; {m.last_changes} changes applied meanwhile)"
        )
    ranges_now = ", ".join(f"{r.lo:04d}-{r.hi:04d} {masked(r.url)}" for r in ranges_of(new))
    lines.append(f"shard map switched: {ranges_now}")
    wrong: list[str] = []
    try:
        assert snapshot is not None
        on_dst = await _snapshot_counts(snapshot, moves, meta_of=is_meta)
        for k, m in enumerate(moves):
            on_src = await m.counts_on_src(src_is_meta=is_meta(m))
            wrong += _differences(on_src, on_dst[k])
        if wrong:
            for m in moves:
                m.close()
            raise RuntimeError(
                "shard map switched, but the copy differs (the old copy is kept, "
                "tables *_moving): " + "; ".join(wrong)
            )
        lines.append("row counts of every table agree")
        await asyncio.sleep(max(0.0, grace_s - (time.monotonic() - switched)))
        for m in moves:
            await m.drop_old(src_is_meta=is_meta(m))
            lines.append(f"{m.name}: old copy of {m.shards} dropped")
    finally:
        snapshot.close()
        for m in moves:
            m.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    lines.append(f"peak RSS of this process: {peak} MiB")
    return lines


async def _switch(meta: MySQLSettings, new: Sequence[str]) -> None:
    """Step 7: the map of `new` (per-shard owners), in one transaction."""
    conn = await _connect(meta)
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"USE `{meta.database}`")
            await cur.execute("BEGIN")
            await cur.execute("DELETE FROM im_shard_map")
            await cur.executemany(
                "INSERT INTO im_shard_map (lo, hi, url) VALUES (%s, %s, %s)",
                [(r.lo, r.hi, r.url) for r in ranges_of(new)],
            )
            await cur.execute("COMMIT")
    finally:
        conn.close()
