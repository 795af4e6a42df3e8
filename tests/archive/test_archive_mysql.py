"""`imgw archive` on MariaDB (and the production store, Redis in front): the move, the
pages across the boundary, retried sends, a recall racing the archiver, migrate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiomysql
import pytest

from gateway.cli import main as imgw
from protocol.ops import MsgType
from storage.archive import objects
from storage.archive.index_mysql import MySQLIndex
from storage.archive.run import archive_run
from storage.models import AppendStatus, NewMessage, RecallStatus
from storage.mysql import MySQLSettings, MySQLStore
from storage.mysql.schema import SCHEMA_VERSION
from storage.mysql_redis import MySQLRedisStore
from storage.redis import RedisCache, redis_from_url
from storage.redis.recent import RecentCache
from tests.archive.common import (
    DAY,
    T0,
    Clock,
    History,
    all_pages,
    diff_pages,
    fill,
    mysql_tables,
)
from tests.support.services import (
    downgrade_then_migrate,
    drop_mysql,
    drop_redis,
    fresh_mysql,
    fresh_redis_url,
)

SHARDS = 2


@pytest.fixture(params=["one-server", "two-servers"])
async def mysql_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh store: on one server, or with its shards over two (a shard map)."""
    url = await fresh_mysql(shards=SHARDS, sharded=request.param == "two-servers")
    try:
        yield url
    finally:
        await drop_mysql(url)


async def rows_of(url: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """(hot rows, archived rows) as (conv_id, seq, id, sender, type, content, ms, cmid,
    recall seq), each sorted, over every server of the store."""
    hot, index = await mysql_tables(url)
    cold: list[tuple[object, ...]] = []
    for conv, lo, hi, root, key, n in index:
        got = objects.read_file(objects.open_location(root), key)
        assert [a.msg.seq for a in got] == list(range(lo, hi + 1)) == list(range(lo, lo + n))
        assert all(a.msg.conv_id == conv for a in got)
        cold += [(m.conv_id, m.seq, m.msg_id, m.sender_uid, m.msg_type, m.content, m.server_ms,
                  m.client_msg_id, a.recall_seq) for a in got for m in [a.msg]]  # fmt: skip
    return hot, sorted(cold)


async def archive(url: str, to: str, clock: Clock, older_than_ms: int) -> int:
    index = MySQLIndex(MySQLSettings.from_url(url), clock=clock)
    await index.open()
    try:
        report = await archive_run(index, to, older_than_ms=older_than_ms)
    finally:
        await index.close()
    assert not report.failures
    return report.rows


async def test_mysql_archive_and_pages_across(mysql_url: str, tmp_path: Path) -> None:
    clock = Clock()
    store = MySQLStore(MySQLSettings.from_url(mysql_url), clock=clock)
    await store.start()
    redis_url = fresh_redis_url()
    client, prefix = redis_from_url(redis_url)
    prod = MySQLRedisStore(
        MySQLStore(MySQLSettings.from_url(mysql_url), clock=clock),
        RedisCache(client, prefix=prefix),
        RecentCache(client, prefix=prefix),
    )
    await prod.start()
    try:
        h: History = await fill(prod, clock)  # the recent cache holds the newest 200
        await prod.cache_settled()
        hot0, _ = await rows_of(mysql_url)
        want = await all_pages(store, h)
        assert diff_pages(want, await all_pages(prod, h)) == []
        clock.ms = T0 + 20 * DAY
        url = (tmp_path / "arch").as_uri()
        assert await archive(mysql_url, url, clock, 15 * DAY) > 0
        hot, cold = await rows_of(mysql_url)
        assert sorted(hot + cold) == hot0 and hot and cold
        assert diff_pages(want, await all_pages(store, h)) == []
        assert diff_pages(want, await all_pages(prod, h)) == []
        assert await archive(mysql_url, url, clock, 0) > 0
        hot, cold = await rows_of(mysql_url)
        assert hot == [] and cold == hot0
        assert diff_pages(want, await all_pages(store, h)) == []
        assert diff_pages(want, await all_pages(prod, h)) == []
        # seqs go on from the untouched counter; a retried send of an archived message
        # (inside the 48 h window) gets its original ack, through MySQL and Redis alike
        conv = h.convs[0]
        top = max(r[1] for r in hot0 if r[0] == conv)
        (sent,) = await prod.append([NewMessage(conv, 1, "late", MsgType.TEXT, b"x")])
        assert sent.message is not None and sent.message.seq == top + 1
        assert await archive(mysql_url, url, clock, 0) == 1
        for s in (store, prod):
            (again,) = await s.append([NewMessage(conv, 1, "late", MsgType.TEXT, b"x")])
            assert again.status is AppendStatus.DUPLICATE and again.message == sent.message
            (other,) = await s.append([NewMessage(conv, 1, "late", MsgType.TEXT, b"y")])
            assert other.status is AppendStatus.CONFLICT
        got = await store.recall(conv, top + 1, 1, window_ms=10**12, min_seq=0)
        assert got.status is RecallStatus.NO_SUCH_MESSAGE  # archived: not there to recall
        (nxt,) = await prod.append([NewMessage(conv, 2, "next", MsgType.TEXT, b"z")])
        assert nxt.message is not None and nxt.message.seq == top + 2
        page, more = await prod.read_before(conv, 0, 3, min_seq=0, max_seq=None)
        assert [m.seq for m in page] == [top, top + 1, top + 2] and more
        # housekeeping drops the archived send records with the idempotency records
        clock.ms += 49 * 3600 * 1000
        await store.maintain()
        assert await store.find_sent(1, "late") is None
    finally:
        await prod.close()
        await store.close()
        await drop_redis(redis_url)
        await client.aclose()


async def test_a_recall_that_lands_first_is_archived_as_recalled(
    mysql_url: str, tmp_path: Path
) -> None:
    """The commit re-reads its rows under lock: a recall between the archiver's read and
    its commit makes it read the batch again, so the recalled form is what is archived."""
    clock = Clock()
    store = MySQLStore(MySQLSettings.from_url(mysql_url), clock=clock)
    await store.start()
    index = MySQLIndex(MySQLSettings.from_url(mysql_url), clock=clock)
    await index.open()
    try:
        conv = await store.open_p2p(1, 2)
        res = await store.append(
            [NewMessage(conv, 1, f"r{i}", MsgType.TEXT, b"t") for i in range(5)]
        )
        target = res[2].message
        assert target is not None
        real = index.hot_batch
        recalled = []

        async def read_then_recall(conv_id: int, after: int, limit: int):  # type: ignore[no-untyped-def]
            rows = await real(conv_id, after, limit)
            if not recalled:
                got = await store.recall(conv, target.seq, 1, window_ms=60_000, min_seq=0)
                recalled.append(got.status)
            return rows

        index.hot_batch = read_then_recall  # type: ignore[method-assign]
        report = await archive_run(index, (tmp_path / "a").as_uri(), older_than_ms=0)
        assert recalled == [RecallStatus.RECALLED] and not report.failures
        assert report.rows == 6  # the five and the RECALL message
        page, _ = await store.read_after(conv, 0, 10, min_seq=0, max_seq=None)
        assert [m.seq for m in page] == [1, 2, 3, 4, 5, 6]
        assert (page[2].msg_type, page[2].content) == (MsgType.RECALL, b"")
    finally:
        await index.close()
        await store.close()


async def test_migrate_adds_the_archive_tables_to_the_previous_schema(mysql_url: str) -> None:
    done = await downgrade_then_migrate(
        mysql_url, SCHEMA_VERSION - 1, "DROP TABLE im_archive, im_archive_sent, im_archive_unread"
    )
    assert done
    s = MySQLSettings.from_url(mysql_url)
    conn = await aiomysql.connect(host=s.host, port=s.port, user=s.user, password=s.password,
                                  db=s.database)  # fmt: skip
    try:
        async with conn.cursor() as cur:
            await cur.execute("SHOW TABLES LIKE 'im\\_archive%%'")
            tables = {r[0] for r in await cur.fetchall()}
            assert tables == {"im_archive", "im_archive_sent", "im_archive_unread"}
    finally:
        conn.close()


async def test_cli_on_mysql(
    mysql_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = MySQLStore(MySQLSettings.from_url(mysql_url))
    await store.start()
    try:
        conv = await store.open_p2p(1, 2)
        await store.append([NewMessage(conv, 1, f"s{i}", MsgType.TEXT, b"abc") for i in range(30)])
    finally:
        await store.close()

    async def cli(*argv: str) -> int:
        return await asyncio.to_thread(imgw, ["archive", *argv])

    assert await cli("status", "--store", mysql_url, "--json") == 0
    st = json.loads(capsys.readouterr().out)
    assert st["hot"]["rows"] == 30 and st["hot"]["oldest_ms"] and st["hot"]["bytes"] > 0
    assert st["archive"]["rows"] == 0 and st["last_run"] is None
    to = (tmp_path / "a").as_uri()
    assert await cli("run", "--store", mysql_url, "--older-than", "0s", "--to", to) == 0
    assert await cli("status", "--store", mysql_url, "--json") == 0
    out = capsys.readouterr().out
    assert out.startswith("archived 30 rows of 1 conversations in 1 files")
    st = json.loads(out[out.index("{") :])
    assert st["hot"]["rows"] == 0 and st["hot"]["oldest_ms"] is None
    assert st["archive"] == {"rows": 30, "bytes": st["archive"]["bytes"], "files": 1,
                             "conversations": 1}  # fmt: skip
    assert st["last_run"]["rows"] == "30" and st["last_run"]["to"] == to


async def test_pages_above_the_archive_never_ask_for_its_files(
    mysql_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MySQL reads the archived top with each page (same round trip): a PULL past the
    newest message, or any page above the archive, asks for no files."""
    clock = Clock()
    store = MySQLStore(MySQLSettings.from_url(mysql_url), clock=clock)
    await store.start()
    try:
        conv = await store.open_p2p(1, 2)
        await store.append([NewMessage(conv, 1, f"e{i}", MsgType.TEXT, b"e") for i in range(6)])
        clock.ms += 1000
        assert await archive(mysql_url, (tmp_path / "a").as_uri(), clock, 500) == 6
        await store.append([NewMessage(conv, 1, f"f{i}", MsgType.TEXT, b"f") for i in range(4)])
        asked: list[tuple[int, int, int]] = []
        real = store._archived

        async def counting(conv_id: int, lo: int, hi: int) -> list[object]:
            asked.append((conv_id, lo, hi))
            return await real(conv_id, lo, hi)  # type: ignore[return-value]

        monkeypatch.setattr(store, "_archived", counting)
        assert await store.read_after(conv, 10, 5, min_seq=0, max_seq=None) == ([], False)
        page, _ = await store.read_after(conv, 7, 5, min_seq=0, max_seq=None)
        assert [m.seq for m in page] == [8, 9, 10]
        page, more = await store.read_before(conv, 0, 3, min_seq=0, max_seq=None)
        assert [m.seq for m in page] == [8, 9, 10] and more
        assert asked == []
        # a full page down to the oldest hot seq: older ones exist, they are archived
        page, more = await store.read_before(conv, 0, 4, min_seq=0, max_seq=None)
        assert [m.seq for m in page] == [7, 8, 9, 10] and more
        assert asked == []
        page, more = await store.read_before(conv, 0, 5, min_seq=0, max_seq=None)
        assert [m.seq for m in page] == [6, 7, 8, 9, 10] and more
        assert asked == [(conv, 1, 6)]
    finally:
        await store.close()


async def test_the_archive_index_moves_with_its_shard(tmp_path: Path) -> None:
    """`imgw db add-server` moves a shard's archive index rows (and archived sends) with
    its messages: pages across the boundary read the same after the move."""
    from storage.mysql.move import add_server
    from tests.support.services import MYSQL2_PORT, second_mysql

    second_mysql()
    url = await fresh_mysql(shards=4)
    try:
        clock = Clock()
        store = MySQLStore(MySQLSettings.from_url(url), clock=clock)
        await store.start()
        try:
            h = await fill(store, clock, days=4)
            want = await all_pages(store, h)
        finally:
            await store.close()
        clock.ms = T0 + 10 * DAY
        assert await archive(url, (tmp_path / "a").as_uri(), clock, 8 * DAY) > 0
        hot0, cold0 = await rows_of(url)
        name = MySQLSettings.from_url(url).database
        await add_server(
            MySQLSettings.from_url(url), f"mysql://root@127.0.0.1:{MYSQL2_PORT}/{name}",
            grace_s=0.0, log=lambda _line: None,
        )  # fmt: skip
        hot, cold = await rows_of(url)  # each shard's rows read from its new server only
        assert (hot, cold) == (hot0, cold0)
        _, index = await mysql_tables(url)
        assert {c % 4 for c, *_ in index} >= {2, 3} or not any(c % 4 >= 2 for c in h.convs)
        store = MySQLStore(MySQLSettings.from_url(url), clock=clock)
        await store.start()
        try:
            assert diff_pages(want, await all_pages(store, h)) == []
        finally:
            await store.close()
    finally:
        await drop_mysql(url)
