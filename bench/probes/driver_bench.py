"""The MySQL driver's own CPU per send batch: aiomysql (PyMySQL's pure-Python protocol)
against asyncmy (the same protocol compiled with Cython), on the exact SQL of one group
commit (storage.mysql.sql): BEGIN + idempotency lookup + seq locks + members, then seqs +
message INSERT + idempotency rows + COMMIT (`--separate-commit`: COMMIT in a round trip
of its own, where the store sends it with the writes). The client process's CPU time per batch
is what the driver costs the gateway; MariaDB's time is not in it.

    python -m bench.probes.driver_bench --batches 2000 --batch-size 20
    (asyncmy is the store's driver; aiomysql is still installed for the bench and the tests)
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from typing import Any

from storage.models import StoredMessage
from storage.mysql import MySQLSettings, migrate, sql
from storage.mysql.schema import message_table

MULTI_STATEMENTS = 1 << 16


def _batch_sql(batch: int, size: int, shards: int, separate_commit: bool = False) -> list[str]:
    """The round trips of batch number `batch` (fresh keys every time)."""
    now = int(time.time() * 1000)
    msgs = [
        StoredMessage(1 + (i % 8), batch * size + i + 1, (batch * size + i) << 22, 1000 + i,
                      1, b"x" * 64, now, f"c{batch}.{i}")
        for i in range(size)
    ]  # fmt: skip
    convs = {m.conv_id for m in msgs}
    first = ";".join(
        ("BEGIN", sql.find_sent([(m.sender_uid, m.client_msg_id) for m in msgs]),
         sql.lock_seqs(convs), sql.current_members(convs))
    )  # fmt: skip
    by_shard: dict[int, list[StoredMessage]] = {}
    for m in msgs:
        by_shard.setdefault(m.conv_id % shards, []).append(m)
    top = {c: max(m.seq for m in msgs if m.conv_id == c) for c in convs}
    writes = [sql.set_seqs(top, now)]
    for shard, rows in by_shard.items():
        writes += sql.insert_messages(message_table(shard), rows)
    writes.append(sql.insert_sent(msgs, now))
    if separate_commit:
        return [first, ";".join(writes), "COMMIT"]
    return [first, ";".join([*writes, "COMMIT"])]


async def _run_aiomysql(s: MySQLSettings, queries: list[list[str]]) -> float:
    import aiomysql

    conn = await aiomysql.connect(host=s.host, port=s.port, user=s.user, password=s.password,
                                  db=s.database, autocommit=True)  # fmt: skip
    return await _drive(conn, queries)


async def _run_asyncmy(s: MySQLSettings, queries: list[list[str]]) -> float:
    import asyncmy

    conn = await asyncmy.connect(host=s.host, port=s.port, user=s.user, password=s.password,
                                 database=s.database, autocommit=True,
                                 client_flag=MULTI_STATEMENTS)  # fmt: skip
    return await _drive(conn, queries)


async def _drive(conn: Any, queries: list[list[str]]) -> float:
    """CPU seconds of this process for all batches."""
    cpu0 = time.process_time()
    async with conn.cursor() as cur:
        for rounds in queries:
            for q in rounds:
                await cur.execute(q)
                await cur.fetchall()
                while await cur.nextset():
                    await cur.fetchall()
    cpu = time.process_time() - cpu0
    conn.close()
    return cpu


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.driver_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="alternating runs per driver (3)")
    p.add_argument("--server", default="mysql://root:@127.0.0.1:3306/")
    p.add_argument(
        "--separate-commit",
        action="store_true",
        help="COMMIT in a round trip of its own (the store sends it with the writes)",
    )
    args = p.parse_args(argv)
    shards = 4
    db = f"imgw_driver_{secrets.token_hex(4)}"
    settings = MySQLSettings.from_url(f"{args.server.rstrip('/')}/{db}?shards={shards}")
    await migrate(settings)
    drivers = {"aiomysql": _run_aiomysql, "asyncmy": _run_asyncmy}
    results: dict[str, list[float]] = {name: [] for name in drivers}
    batch = 0
    try:
        for _ in range(args.rounds):
            for name, run in drivers.items():
                queries = [_batch_sql(batch + i, args.batch_size, shards, args.separate_commit)
                           for i in range(args.batches)]  # fmt: skip
                batch += args.batches
                try:
                    cpu = await run(settings, queries)
                except ImportError:
                    print(f"{name} is not installed (pip install {name})", file=sys.stderr)
                    continue
                us = 1e6 * cpu / args.batches
                results[name].append(us)
                print(f"{name:9} {us:7.0f} µs of client CPU per batch of {args.batch_size}"
                      f" ({us / args.batch_size:.1f} µs per message)")  # fmt: skip
    finally:
        import aiomysql

        conn = await aiomysql.connect(host=settings.host, port=settings.port,
                                      user=settings.user, password=settings.password)  # fmt: skip
        async with conn.cursor() as cur:
            await cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
    for name, runs in results.items():
        if runs:
            print(f"{name}: median {sorted(runs)[len(runs) // 2]:.0f} µs per batch")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
