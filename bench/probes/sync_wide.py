"""The first SYNC page of a user in very many conversations, on both stores.

    python -m bench.probes.sync_wide [--convs 40000] [--mysql mysql://root:@127.0.0.1:3306/]

Loads one user into `--convs` groups (rows written straight into the tables, as
bench.preload does), then times `ChatStore.sync(since=0, limit=100)` three times on the
embedded store and on MariaDB (a fresh database, dropped afterwards). The target: under
200 ms with 40,000 conversations.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sqlite3
import tempfile
import time

import asyncmy

from storage.embedded import EmbeddedStore
from storage.mysql import MySQLSettings, MySQLStore, migrate
from storage.ports import ChatStore

UID = 7
OTHER = 1


async def _time(store: ChatStore, label: str) -> list[float]:
    out = []
    for _ in range(3):
        t = time.perf_counter()
        page = await store.sync(UID, "d", changed_since_ms=0, after=None, limit=100)
        out.append(round((time.perf_counter() - t) * 1000, 1))
        assert len(page.rows) == 100
    print(f"{label}: first SYNC page (100 rows) in {out} ms")
    return out


async def embedded(n: int) -> list[float]:
    path = os.path.join(tempfile.mkdtemp(prefix="imgw-sync-wide-"), "s.db")
    store = EmbeddedStore(path)
    await store.start()
    await store.close()
    now = int(time.time() * 1000)
    db = sqlite3.connect(path)
    ids = range(1, n + 1)
    db.executemany(
        "INSERT INTO im_conversation (conv_id, kind, title, owner_uid, created_ms) "
        "VALUES (?, 2, 'g', ?, ?)",
        [(i, OTHER, now) for i in ids],
    )
    for uid, read in ((UID, 0), (OTHER, 1)):
        db.executemany(
            "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, updated_ms) "
            "VALUES (?, ?, 0, 1, ?, ?)",
            [(i, uid, read, now) for i in ids],
        )
    db.executemany(
        "INSERT INTO im_conv_seq (conv_id, max_seq, last_active_ms) VALUES (?, 1, ?)",
        [(i, now - i) for i in ids],
    )
    db.commit()
    db.execute("ANALYZE")
    db.close()
    store = EmbeddedStore(path)
    await store.start()
    try:
        return await _time(store, f"embedded, {n:,} conversations")
    finally:
        await store.close()


async def mysql(url: str, n: int) -> list[float]:
    name = f"imgw_bench_{secrets.token_hex(4)}"
    settings = MySQLSettings.from_url(url.rstrip("/") + f"/{name}")
    await migrate(settings)
    conn = await asyncmy.connect(
        host=settings.host, port=settings.port, user=settings.user,
        password=settings.password, db=name,
    )  # fmt: skip
    try:
        now = int(time.time() * 1000)
        async with conn.cursor() as cur:
            for lo in range(1, n + 1, 5000):
                ids = range(lo, min(n + 1, lo + 5000))
                await cur.executemany(
                    "INSERT INTO im_conversation (conv_id, kind, title, owner_uid, created_ms) "
                    "VALUES (%s, 2, 'g', %s, %s)",
                    [(i, OTHER, now) for i in ids],
                )
                for uid, read in ((UID, 0), (OTHER, 1)):
                    await cur.executemany(
                        "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, "
                        "updated_ms) VALUES (%s, %s, 0, 1, %s, %s)",
                        [(i, uid, read, now) for i in ids],
                    )
                await cur.executemany(
                    "INSERT INTO im_conv_seq (conv_id, max_seq, last_active_ms) VALUES (%s, 1, %s)",
                    [(i, now - i) for i in ids],
                )
            await conn.commit()
            await cur.execute("ANALYZE TABLE im_conversation, im_conv_member, im_conv_seq")
        store = MySQLStore(settings)
        await store.start()
        try:
            return await _time(store, f"MariaDB, {n:,} conversations")
        finally:
            await store.close()
    finally:
        async with conn.cursor() as cur:
            await cur.execute(f"DROP DATABASE `{name}`")
        conn.close()


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probes.sync_wide", description=__doc__)
    p.add_argument("--convs", type=int, default=40_000, help="conversations (40000)")
    p.add_argument("--mysql", default="mysql://root:@127.0.0.1:3306/", help="server URL")
    p.add_argument("--no-mysql", action="store_true", help="the embedded store only")
    args = p.parse_args()
    await embedded(args.convs)
    if not args.no_mysql:
        await mysql(args.mysql, args.convs)


if __name__ == "__main__":
    asyncio.run(main())
