"""The prune lease on MariaDB: two stores (two nodes) on one database, one prunes at a
time; the other takes over when the holder stops renewing; batches are bounded; and
`imgw db prune` prunes without a lease."""

from __future__ import annotations

import asyncio
import time

import aiomysql
import pytest

from gateway import cli
from storage.mysql import MySQLSettings, MySQLStore
from storage.mysql.store import DEDUP_KEEP_MS
from tests.support.services import drop_mysql, fresh_mysql

HOUR = 3_600_000


async def _old_dedup_rows(url: str, n: int, *, age_ms: int = DEDUP_KEEP_MS + HOUR) -> None:
    """`n` idempotency records `age_ms` old (and one fresh one, which stays: the same
    one at every call)."""
    s = MySQLSettings.from_url(url)
    conn = await aiomysql.connect(
        host=s.host, port=s.port, user=s.user, password=s.password, db=s.database,
        autocommit=True,
    )  # fmt: skip
    try:
        now = int(time.time() * 1000)
        rows = [(7, f"old-{age_ms}-{i}".encode(), 1, i + 1, now - age_ms) for i in range(n)]
        rows.append((7, b"fresh", 1, n + 1, now))
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO im_send_dedup (sender_uid, client_msg_id, conv_id, seq, "
                "created_ms) VALUES (%s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE seq=seq",
                rows,
            )
    finally:
        conn.close()


async def _count(url: str) -> int:
    s = MySQLSettings.from_url(url)
    conn = await aiomysql.connect(
        host=s.host, port=s.port, user=s.user, password=s.password, db=s.database
    )
    try:
        async with conn.cursor() as cur:
            await cur.execute("SELECT COUNT(*) FROM im_send_dedup")
            (n,) = await cur.fetchone()
            return int(n)
    finally:
        conn.close()


async def test_one_node_prunes_and_the_other_takes_over() -> None:
    url = await fresh_mysql()
    settings = MySQLSettings.from_url(url)
    a = MySQLStore(settings, lease_owner="node-a", prune_lease_ttl_ms=1_000)
    b = MySQLStore(settings, lease_owner="node-b", prune_lease_ttl_ms=1_000)
    await a.start()
    await b.start()
    try:
        await a.maintain()
        assert a.prune_lease.held
        await _old_dedup_rows(url, 10)
        await b.maintain()  # a holds the lease: b does not prune
        assert not b.prune_lease.held
        assert await _count(url) == 11
        await a.maintain()  # a renews and prunes
        assert a.prune_lease.held and a.last_prune.dedup == 10
        assert await _count(url) == 1
        for _ in range(3):  # a keeps renewing: b never gets it
            await asyncio.sleep(0.4)
            await a.maintain()
            await b.maintain()
            assert a.prune_lease.held and not b.prune_lease.held
        assert await b.prune_lease.holder() == ("node-a", True)
        # a stops renewing (a paused or dead node): b takes over once it expires
        await _old_dedup_rows(url, 5, age_ms=DEDUP_KEEP_MS + 2 * HOUR)
        await asyncio.sleep(1.2)
        await b.maintain()
        assert b.prune_lease.held and b.prune_lease.taken == 1
        assert b.last_prune.dedup == 5
        await a.maintain()  # a comes back: it has lost the lease
        assert not a.prune_lease.held
    finally:
        await a.close()
        await b.close()
        await drop_mysql(url)


async def test_a_closed_holder_hands_over_at_once() -> None:
    url = await fresh_mysql()
    settings = MySQLSettings.from_url(url)
    a = MySQLStore(settings, lease_owner="node-a")  # the default ttl: 150 s
    b = MySQLStore(settings, lease_owner="node-b")
    await a.start()
    await b.start()
    try:
        await a.maintain()
        await b.maintain()
        assert a.prune_lease.held and not b.prune_lease.held
        await a.close()  # releases the lease
        await b.maintain()
        assert b.prune_lease.held
    finally:
        await b.close()
        await drop_mysql(url)


async def test_concurrent_takes_give_one_holder() -> None:
    url = await fresh_mysql()
    settings = MySQLSettings.from_url(url)
    stores = [MySQLStore(settings, lease_owner=f"node-{i}") for i in range(5)]
    for s in stores:
        await s.start()
    try:
        held = await asyncio.gather(*(s.prune_lease.take() for s in stores))
        assert sum(held) == 1
    finally:
        for s in stores:
            await s.close()
        await drop_mysql(url)


async def test_prune_is_bounded_per_batch_and_budget() -> None:
    url = await fresh_mysql()
    store = MySQLStore(MySQLSettings.from_url(url))
    await store.start()
    try:
        await _old_dedup_rows(url, 25)
        sizes: list[int] = []
        report = await store.prune(
            batch=10, pause_s=0, budget_s=None, on_batch=lambda r: sizes.append(r.dedup)
        )
        assert sizes == [10, 20, 25] and report.done and report.batches == 3
        assert await _count(url) == 1
        await _old_dedup_rows(url, 30, age_ms=DEDUP_KEEP_MS + 2 * HOUR)
        report = await store.prune(batch=10, pause_s=0.05, budget_s=0.0)
        assert (report.dedup, report.batches, report.done) == (10, 1, False)
    finally:
        await store.close()
        await drop_mysql(url)


async def test_db_prune_command(capsys: pytest.CaptureFixture[str]) -> None:
    url = await fresh_mysql()
    try:
        await _old_dedup_rows(url, 7)
        code = await asyncio.to_thread(
            cli.main, ["db", "prune", "--store", url, "--batch", "3", "--pause", "0"]
        )
        assert code == 0
        out = capsys.readouterr().out
        assert "pruned 7 idempotency records" in out and "in 3 batches," in out
        assert await _count(url) == 1
    finally:
        await drop_mysql(url)


def test_db_prune_command_embedded(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3
    from pathlib import Path

    from storage.embedded.schema import migrate

    path = Path(str(tmp_path)) / "imgw.db"
    conn = sqlite3.connect(path)
    migrate(conn)
    now = int(time.time() * 1000)
    conn.executemany(
        "INSERT INTO im_archive_sent (sender_uid, client_msg_id, conv_id, seq, msg_id, "
        "msg_type, content, send_ms) VALUES (?, ?, 1, ?, ?, 1, x'00', ?)",
        [(1, f"c{i}", i + 1, i + 1, now - DEDUP_KEEP_MS - HOUR) for i in range(4)]
        + [(1, "fresh", 9, 9, now)],
    )
    conn.commit()
    conn.close()
    assert cli.main(["db", "prune", "--data-dir", str(tmp_path)]) == 0
    assert "and 4 archived sends" in capsys.readouterr().out
    assert cli.main(["db", "prune", "--store", "redis://x"]) == 2


async def test_migrate_from_schema_5_adds_im_lease() -> None:
    from storage.mysql import migrate
    from storage.mysql.schema import SCHEMA_VERSION

    url = await fresh_mysql()
    s = MySQLSettings.from_url(url)
    conn = await aiomysql.connect(
        host=s.host, port=s.port, user=s.user, password=s.password, db=s.database,
        autocommit=True,
    )  # fmt: skip
    try:
        async with conn.cursor() as cur:
            await cur.execute("DROP TABLE im_lease")
            await cur.execute("UPDATE im_meta SET value='5' WHERE name='schema_version'")
        store = MySQLStore(s)
        with pytest.raises(Exception, match="imgw db migrate"):
            await store.start()
        await store.close()
        assert await migrate(s)
        async with conn.cursor() as cur:
            await cur.execute("SELECT value FROM im_meta WHERE name='schema_version'")
            assert (await cur.fetchone())[0] == str(SCHEMA_VERSION)  # 6, or above
        store = MySQLStore(s, lease_owner="node-a")
        await store.start()
        try:
            await store.maintain()
            assert store.prune_lease.held
        finally:
            await store.close()
    finally:
        conn.close()
        await drop_mysql(url)
