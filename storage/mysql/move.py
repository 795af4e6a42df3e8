"""`imgw db add-server`: move message shards to a new server with the gateways running.

For each shard moving from server S to the new server N:

1. N's database and tables are created (empty).
2. On S the shard's message table is renamed (`im_message_0002` → `im_message_0002_moving`,
   all of S's moving shards in one atomic RENAME). RENAME waits until no transaction
   holds the table, and from then on every commit that would write a message of the
   shard fails (no such table: the gateway answers `unavailable`, the client retries with
   the same id): nothing is written to the shard while it moves. A commit of a
   conversation always writes a message in the same transaction as its seq row, members
   or idempotency record, so those freeze with it.
3. The message rows, then the conversations' colocated rows (conversation copy, seq,
   members, idempotency records, delivered cursors), are copied to N.
4. Row counts are compared, table by table; a difference aborts: the renames are undone
   and the map is unchanged.
5. The map is switched in one transaction in the metadata database. Every store reads
   the map each second (storage/mysql/store.py), so within about a second every gateway
   writes the shard on N; until then its commits still fail on S (step 2) and are retried.
6. After `grace_s`, the old copy goes: the renamed tables are dropped and the colocated
   rows deleted on S (the metadata database keeps its `im_conversation` rows: they
   allocate conv_ids and keep p2p pairs unique).

While a shard moves (steps 2-5) its conversations cannot be written: sends are answered
`unavailable` for about the time the copy takes. Read and delivered positions written to
S between the copy and a gateway's switch are lost (a client's next READ sets them again);
nothing acked is lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from storage.mysql.schema import _connect, _create_on, message_table, read_map
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
    from asyncmy.cursors import Cursor

# The tables whose rows of a conversation live on the server of its shard.
COLOCATED: Final = ("im_conversation", "im_conv_seq", "im_conv_member", "im_send_dedup",
                    "im_delivered", "im_archive", "im_archive_sent",
                    "im_archive_unread")  # fmt: skip
_PAGE: Final = 2000  # rows copied per INSERT


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


async def _rows(cur: Cursor, query: str) -> list[tuple[object, ...]]:
    await cur.execute(query)
    return list(await cur.fetchall())


async def _copy(src: Cursor, dst: Cursor, table: str, into: str, where: str, key: str) -> int:
    """Copy the rows of `table` on src matching `where` into `into` on dst (REPLACE: a
    rerun after a failed attempt overwrites what it copied), in pages by `key`."""
    await src.execute(f"SELECT * FROM {table} WHERE {where} LIMIT 0")
    cols = [d[0] for d in src.description or ()]
    await src.fetchall()
    names = ", ".join(cols)
    marks = ", ".join(["%s"] * len(cols))
    copied = 0
    await src.execute(f"SELECT {names} FROM {table} WHERE {where} ORDER BY {key}")
    while batch := list(await src.fetchmany(_PAGE)):
        await dst.executemany(f"REPLACE INTO {into} ({names}) VALUES ({marks})", batch)
        copied += len(batch)
    return copied


async def _count(cur: Cursor, table: str, where: str) -> int:
    await cur.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


_KEYS: Final = {
    "im_conversation": "conv_id",
    "im_conv_seq": "conv_id",
    "im_conv_member": "conv_id, uid",
    "im_send_dedup": "sender_uid, client_msg_id",
    "im_delivered": "uid, device, conv_id",
    "im_archive": "conv_id, seq_lo",  # storage/archive: the index travels with the shard
    "im_archive_sent": "sender_uid, client_msg_id",
    "im_archive_unread": "conv_id, seq_hi, sender_uid",
}


async def _move(
    src: MySQLSettings, dst: MySQLSettings, shards: Sequence[int], total: int,
    log: Callable[[str], None],
) -> list[str]:  # fmt: skip
    """Steps 2-4 for the shards moving from `src` to `dst`; the lines to report. On any
    failure the renames are undone: the shards stay on `src`."""
    where = f"MOD(conv_id, {total:d}) IN ({','.join(str(int(i)) for i in shards)})"
    lines: list[str] = []
    sconn, dconn = await _connect(src), await _connect(dst)
    try:
        async with sconn.cursor() as s, dconn.cursor() as d:
            await s.execute(f"USE `{src.database}`")
            await d.execute(f"USE `{dst.database}`")
            present = {str(t) for (t,) in await _rows(s, "SHOW TABLES LIKE 'im\\_message\\_%'")}
            renames = [
                f"{message_table(i)} TO {message_table(i)}_moving"
                for i in shards
                if message_table(i) in present
            ]
            if renames:  # absent: renamed by an earlier attempt
                await s.execute("RENAME TABLE " + ", ".join(renames))
            log(f"{src.host}:{src.port}: shards {list(shards)} frozen (tables renamed)")
            try:
                for i in shards:
                    t = message_table(i)
                    n = await _copy(s, d, f"{t}_moving", t, "1=1", "id")
                    if n != await _count(d, t, "1=1"):
                        raise RuntimeError(f"{t}: {n} rows copied, a different count arrived")
                    lines.append(f"{t}: {n} rows copied and counted")
                for table in COLOCATED:
                    # A p2p conversation opened meanwhile adds rows without a message:
                    # copy again until the counts agree.
                    for _ in range(3):
                        n = await _copy(s, d, table, table, where, _KEYS[table])
                        if await _count(s, table, where) == await _count(d, table, where):
                            break
                    else:
                        raise RuntimeError(f"{table}: row counts differ after the copy")
                    lines.append(f"{table}: {n} rows copied and counted")
            except BaseException:
                # undo: the shards stay where they were, writable again
                await s.execute(
                    "RENAME TABLE "
                    + ", ".join(f"{message_table(i)}_moving TO {message_table(i)}" for i in shards)
                )
                raise
    finally:
        sconn.close()
        dconn.close()
    return lines


async def _drop_old(
    src: MySQLSettings, shards: Sequence[int], total: int, *, is_meta: bool
) -> None:
    """Step 6 on `src`: the renamed tables and the moved conversations' rows go."""
    where = f"MOD(conv_id, {total:d}) IN ({','.join(str(int(i)) for i in shards)})"
    conn = await _connect(src)
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"USE `{src.database}`")
            await cur.execute(
                "DROP TABLE IF EXISTS " + ", ".join(f"{message_table(i)}_moving" for i in shards)
            )
            for table in COLOCATED:
                if table == "im_conversation" and is_meta:
                    continue  # the metadata rows stay: conv_id allocation, p2p pairs
                await cur.execute(f"DELETE FROM {table} WHERE {where}")
    finally:
        conn.close()


async def add_server(
    meta: MySQLSettings,
    url: str,
    *,
    take: int | None = None,
    grace_s: float = 3.0,
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
    for source, shards in moving.items():
        src = server_settings(meta, source)
        done = await _move(src, target, shards, total, log)
        lines += done
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
    switched = ", ".join(f"{r.lo:04d}-{r.hi:04d} {masked(r.url)}" for r in ranges_of(new))
    lines.append(f"shard map switched: {switched}")
    await asyncio.sleep(grace_s)  # every store follows the map within a second
    for source, shards in moving.items():
        src = server_settings(meta, source)
        await _drop_old(src, shards, total, is_meta=same_place(src, meta))
        lines.append(f"{src.host}:{src.port}/{src.database}: old copy of {shards} dropped")
    return lines
