"""Retention on MariaDB, Redis in front: messages past it leave the shards and the
archive (file:// and s3://), the recent cache forgets them, no page returns them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storage.archive.index_mysql import MySQLIndex
from storage.archive.run import archive_run
from storage.mysql import MySQLSettings, MySQLStore
from storage.mysql_redis import MySQLRedisStore
from storage.redis import RedisCache, redis_from_url
from storage.redis.recent import RecentCache
from tests.archive.common import DAY, T0, Clock, History, all_pages, fill, mysql_tables
from tests.archive.test_archive_embedded import moto_server  # noqa: F401 (a fixture)
from tests.archive.test_archive_mysql import mysql_url  # noqa: F401 (a fixture)
from tests.archive.test_retention import Row, check_after, check_pages, tiers
from tests.support.services import fresh_redis_url


async def _run(url: str, clock: Clock, **kw: Any) -> Any:
    index = MySQLIndex(MySQLSettings.from_url(url), clock=clock)
    await index.open()
    try:
        report = await archive_run(index, kw.pop("to", ""), **kw)
    finally:
        await index.close()
    assert not report.failures, report.failures
    return report


async def _tiers(url: str) -> tuple[list[Row], dict[int, int]]:
    hot, index = await mysql_tables(url)
    return tiers(list(index), [(int(r[0]), int(r[1]), int(r[6])) for r in hot])


async def _retention(url: str, to: str) -> None:
    clock = Clock()
    store = MySQLStore(MySQLSettings.from_url(url), clock=clock)
    client, prefix = redis_from_url(fresh_redis_url())
    recent = RecentCache(client, prefix=prefix)
    prod = MySQLRedisStore(
        MySQLStore(MySQLSettings.from_url(url), clock=clock),
        RedisCache(client, prefix=prefix),
        recent,
    )
    await store.start()
    await prod.start()
    try:
        h: History = await fill(prod, clock)
        await prod.cache_settled()
        for conv in h.convs:  # the recent cache holds every message of each conv
            msgs, _ = await store.read_after(conv, 0, 1000, min_seq=0, max_seq=None)
            await client.delete(recent.key(conv), recent.floor_key(conv))
            await recent.add(msgs)
            assert [m.seq for m in await recent.range(conv, 1, len(msgs))] == [m.seq for m in msgs]
        original, _ = await _tiers(url)
        clock.ms = T0 + 20 * DAY
        await _run(url, clock, to=to, older_than_ms=15 * DAY)
        for cutoff, files in ((T0 + 2 * DAY + DAY // 2, "rewritten"), (T0 + 7 * DAY, "gone")):
            report = await _run(
                url, clock, older_than_ms=None, retention_ms=clock.ms - cutoff, recent=recent
            )
            x = report.expired
            if files == "rewritten":
                assert x.files_rewritten == len(h.convs) and x.hot_rows == 0
            else:
                assert x.files_deleted == len(h.convs) and x.hot_rows > 0
            visible, expired = await _tiers(url)
            check_after(original, visible, expired, cutoff)
            check_pages(await all_pages(store, h), cutoff)
            check_pages(await all_pages(prod, h), cutoff)  # the recent cache forgot them
    finally:
        await prod.close()
        await store.close()
        await client.aclose()


async def test_mysql_retention_file(mysql_url: str, tmp_path: Path) -> None:  # noqa: F811
    await _retention(mysql_url, (tmp_path / "arch").as_uri())


async def test_mysql_retention_s3(mysql_url: str, moto_server: str) -> None:  # noqa: F811
    await _retention(mysql_url, f"s3://imgw/cold?endpoint={moto_server}&region=us-east-1")
