"""A store of each kind for store-level tests: embedded (SQLite), MySQL on one server and
with its shards over two (`sharded`), and the production store (MySQL + Redis), each
fresh, on a clock the test moves."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from storage.embedded import EmbeddedStore
from storage.mysql import MySQLSettings, MySQLStore
from storage.mysql_redis import MySQLRedisStore
from storage.redis import RedisCache, redis_from_url
from tests.support.services import drop_mysql, drop_redis, fresh_mysql, fresh_redis_url

T0 = 1_800_000_000_000
KINDS = ("embedded", "mysql", "sharded", "production")


class Clock:
    """The store's clock, in ms: still unless the test moves it."""

    def __init__(self) -> None:
        self.ms = T0

    def __call__(self) -> int:
        return self.ms


@contextlib.asynccontextmanager
async def open_store(kind: str, clock: Clock, tmp_path: Path) -> AsyncIterator[Any]:
    """A started store of `kind` (one of KINDS); closed and dropped afterwards."""
    if kind == "embedded":
        store: Any = EmbeddedStore(str(tmp_path / "imgw.db"), clock=clock)
        await store.start()
        try:
            yield store
        finally:
            await store.close()
        return
    url = await fresh_mysql(shards=2, sharded=kind == "sharded")
    mysql = MySQLStore(MySQLSettings.from_url(url), clock=clock)
    redis_url = fresh_redis_url() if kind == "production" else ""
    store = mysql
    if redis_url:
        client, prefix = redis_from_url(redis_url)
        store = MySQLRedisStore(mysql, RedisCache(client, prefix=prefix))
    await store.start()
    try:
        yield store
    finally:
        await store.close()
        await drop_mysql(url)
        if redis_url:
            await client.aclose()
            await drop_redis(redis_url)


async def muted_uids(store: Any, conv_id: int, uids: Sequence[int], now_ms: int) -> set[int]:
    """Those of `uids` who muted `conv_id` until after `now_ms`."""
    found: set[tuple[int, int]] = await store.muted([(conv_id, u) for u in uids], now_ms)
    return {u for c, u in found if c == conv_id}
