"""PULL and HISTORY pages served by the Redis recent-message cache are exactly MySQL's,
and stay so when cache writes are lost, a recall rewrites a message, or Redis is cut
mid-recall (real MariaDB and Redis; the Redis link runs through a cutting proxy)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from itertools import product
from urllib.parse import urlsplit

import pytest

from protocol.ops import MsgType
from storage import mysql_redis
from storage.factory import open_backends
from storage.models import AppendStatus, NewMessage, RecallStatus
from storage.mysql import MySQLStore
from storage.mysql_redis import MySQLRedisStore
from storage.redis import RedisCache, redis_from_url
from storage.redis.recent import RecentCache
from tests.support.services import drop_mysql, drop_redis, fresh_mysql, fresh_redis_url
from tests.support.tcpproxy import TcpProxy


@pytest.fixture
async def redis_proxy() -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy("127.0.0.1", 6379)
    await proxy.start()
    yield proxy
    proxy.restore()
    await proxy.close()


@pytest.fixture
async def store(redis_proxy: TcpProxy) -> AsyncIterator[MySQLRedisStore]:
    mysql_url = await fresh_mysql()
    redis_url = fresh_redis_url()
    parts = urlsplit(redis_url)
    proxied = parts._replace(netloc=f"127.0.0.1:{redis_proxy.port}").geturl()
    backends = open_backends(mysql_url, proxied, "local://")
    s = backends.store
    assert isinstance(s, MySQLRedisStore) and s.recent is not None
    # Every message written at commit, p2p included (the default caches p2p pages when
    # read: test_p2p_pages_are_cached_when_read), so that these tests control the cache.
    s.write_through_members = 1
    await s.start()
    try:
        yield s
    finally:
        redis_proxy.restore()
        await s.close()
        await backends.routes.close()
        await drop_mysql(mysql_url)
        await drop_redis(redis_url)


async def send(store: MySQLRedisStore, conv: int, sender: int, n: int, tag: str) -> None:
    results = await store.append(
        [
            NewMessage(conv, sender, f"{tag}-{i}", MsgType.TEXT, f"{tag} {i}".encode())
            for i in range(n)
        ]
    )
    assert all(r.status is AppendStatus.STORED for r in results)
    await store.cache_settled()  # the cache write runs after the commit, not awaited


async def same_pages(store: MySQLRedisStore, conv: int, top: int) -> None:
    """Every page shape, from the store (cache first) and from MySQL alone."""
    for start, limit, min_seq, max_seq in product(
        range(0, top + 3, 4), (1, 5, 50), (0, 7), (None, top - 6)
    ):
        got = await store.read_after(conv, start, limit, min_seq=min_seq, max_seq=max_seq)
        want = await store.mysql.read_after(conv, start, limit, min_seq=min_seq, max_seq=max_seq)
        assert got == want, ("after", start, limit, min_seq, max_seq)
        got = await store.read_before(conv, start, limit, min_seq=min_seq, max_seq=max_seq)
        want = await store.mysql.read_before(conv, start, limit, min_seq=min_seq, max_seq=max_seq)
        assert got == want, ("before", start, limit, min_seq, max_seq)


async def test_pages_from_the_cache_are_mysqls(store: MySQLRedisStore) -> None:
    conv, _ = await store.create_group(1, "g", [2, 3])
    await send(store, conv, 1, 10, "a")
    await store.change_members(conv, 1, [4], [])  # a system message, cached too
    await send(store, conv, 4, 12, "b")
    top = await store.mysql.max_seq(conv)
    assert top == 24
    await same_pages(store, conv, top)
    assert store.recent_hits > 100  # the cache answered (the seqs are all in it)


async def test_a_lost_cache_write_never_hides_a_message(store: MySQLRedisStore) -> None:
    conv = await store.open_p2p(1, 2)
    await send(store, conv, 1, 5, "cached")
    # committed but never cached, as when the cache write after a commit failed
    await store.mysql.append([NewMessage(conv, 2, f"lost-{i}", 1, b"x") for i in range(3)])
    misses = store.recent_misses
    page, more = await store.read_after(conv, 3, 50, min_seq=0, max_seq=None)
    assert [m.seq for m in page] == [4, 5, 6, 7, 8] and not more
    assert store.recent_misses == misses + 1  # the cache stops at 5: MySQL answered
    await store.cache_settled()  # ... and the page it answered is cached (read-through)
    hits = store.recent_hits
    page, more = await store.read_after(conv, 0, 50, min_seq=0, max_seq=None)
    assert [m.seq for m in page] == list(range(1, 9)) and not more
    assert store.recent_hits == hits + 1
    await send(store, conv, 1, 2, "after")  # the next write starts the cache afresh
    await same_pages(store, conv, 10)


async def test_recalled_content_is_never_read_from_the_cache(store: MySQLRedisStore) -> None:
    conv = await store.open_p2p(1, 2)
    await send(store, conv, 1, 3, "m")
    page, _ = await store.read_after(conv, 0, 10, min_seq=0, max_seq=None)
    assert page[1].content == b"m 1"
    result = await store.recall(conv, 2, 1, window_ms=120_000, min_seq=0)
    assert result.status is RecallStatus.RECALLED
    await send(store, conv, 2, 1, "later")
    await same_pages(store, conv, 5)
    page, _ = await store.read_after(conv, 1, 1, min_seq=0, max_seq=None)
    assert (page[0].msg_type, page[0].content) == (MsgType.RECALL, b"")


async def test_a_cache_write_landing_after_the_recall(store: MySQLRedisStore) -> None:
    """Cache writes run beside the acks, so the write of a message can reach Redis after
    a recall of it (sent by a client that had its ack): the recalled content is still
    never served."""
    conv = await store.open_p2p(1, 2)
    await send(store, conv, 1, 3, "m")
    original = (await store.mysql.read_after(conv, 1, 1, min_seq=0, max_seq=None))[0][0]
    assert (await store.recall(conv, 2, 1, window_ms=120_000, min_seq=0)).status is (
        RecallStatus.RECALLED
    )
    assert store.recent is not None
    await store.recent.add([original])  # the late write of the original
    await same_pages(store, conv, 4)
    page, _ = await store.read_after(conv, 1, 1, min_seq=0, max_seq=None)
    assert (page[0].msg_type, page[0].content) == (MsgType.RECALL, b"")


async def test_redis_cut_from_the_recalling_node_only(
    store: MySQLRedisStore, redis_proxy: TcpProxy
) -> None:
    """Node A (the fixture's store, its Redis behind a proxy) recalls while cut off
    from Redis, so the original stays cached; node B, on a healthy link, still never
    serves it: pages reaching the recalled seq come from MySQL (its recalled_seq)."""
    conv = await store.open_p2p(1, 2)
    await send(store, conv, 1, 3, "m")
    assert store.recent is not None
    direct, _ = redis_from_url("redis://127.0.0.1:6379/0")  # not through the proxy
    prefix = store.recent.prefix
    node_b = MySQLRedisStore(
        MySQLStore(store.mysql.settings),
        RedisCache(direct, prefix=prefix),
        RecentCache(direct, prefix=prefix),
    )
    await node_b.start()
    try:
        redis_proxy.cut()
        result = await store.recall(conv, 2, 1, window_ms=120_000, min_seq=0)
        assert result.status is RecallStatus.RECALLED
        assert node_b.recent is not None
        assert [m.content for m in await node_b.recent.range(conv, 2, 2)] == [b"m 1"]
        await same_pages(node_b, conv, 4)  # MySQL's pages, the recalled form included
        redis_proxy.restore()
        await same_pages(store, conv, 4)
        await send(store, conv, 2, 3, "later")
        hits = node_b.recent_hits
        page, more = await node_b.read_after(conv, 4, 10, min_seq=0, max_seq=None)
        assert [m.seq for m in page] == [5, 6, 7] and not more
        assert node_b.recent_hits == hits + 1  # above the recall, the cache serves
    finally:
        await node_b.close()
        await direct.aclose()


async def test_refused_recalls_leave_the_cache_alone(store: MySQLRedisStore) -> None:
    """Any member may send RECALL for any seq; refused ones (no such message, not the
    sender) must not stop the conversation being served from the cache."""
    conv = await store.open_p2p(1, 2)
    await send(store, conv, 1, 3, "m")
    refused = await store.recall(conv, 10**15, 2, window_ms=120_000, min_seq=0)
    assert refused.status is RecallStatus.NO_SUCH_MESSAGE
    denied = await store.recall(conv, 2, 2, window_ms=120_000, min_seq=0)  # not the sender
    assert denied.status is RecallStatus.DENIED
    await send(store, conv, 1, 2, "after")
    hits = store.recent_hits
    page, more = await store.read_after(conv, 0, 10, min_seq=0, max_seq=None)
    assert [m.seq for m in page] == [1, 2, 3, 4, 5] and not more
    assert store.recent_hits == hits + 1


async def test_p2p_pages_are_cached_when_read(store: MySQLRedisStore) -> None:
    """By default a p2p message is not written to Redis at commit (it is PUSHed to the
    one peer and rarely read again); a page of them read from MySQL is cached, so the
    next reader of it is answered by Redis, and a recall still never serves the
    original."""
    store.write_through_members = mysql_redis.WRITE_THROUGH_MEMBERS
    assert store.recent is not None
    conv = await store.open_p2p(1, 2)
    await send(store, conv, 1, 5, "m")
    assert await store.recent.range(conv, 1, 5) == []  # not written at commit
    hits, misses = store.recent_hits, store.recent_misses
    first = await store.read_after(conv, 0, 50, min_seq=0, max_seq=None)
    assert [m.seq for m in first[0]] == [1, 2, 3, 4, 5] and store.recent_misses == misses + 1
    await store.cache_settled()
    assert await store.read_after(conv, 0, 50, min_seq=0, max_seq=None) == first
    assert store.recent_hits == hits + 1  # the page read from MySQL was cached
    await send(store, conv, 2, 2, "later")  # committed, not cached: the next read misses
    page, _ = await store.read_after(conv, 5, 50, min_seq=0, max_seq=None)
    assert [m.seq for m in page] == [6, 7] and store.recent_misses == misses + 2
    await store.cache_settled()
    assert [m.seq for m in await store.recent.range(conv, 1, 7)] == list(range(1, 8))
    assert (await store.recall(conv, 3, 1, window_ms=120_000, min_seq=0)).status is (
        RecallStatus.RECALLED
    )
    await same_pages(store, conv, 8)
    page, _ = await store.read_after(conv, 2, 1, min_seq=0, max_seq=None)
    assert (page[0].msg_type, page[0].content) == (MsgType.RECALL, b"")


async def test_groups_are_cached_at_commit(store: MySQLRedisStore) -> None:
    store.write_through_members = mysql_redis.WRITE_THROUGH_MEMBERS
    assert store.recent is not None
    conv, _ = await store.create_group(1, "g", [2, 3])
    await send(store, conv, 2, 3, "m")
    assert [m.seq for m in await store.recent.range(conv, 1, 4)] == [1, 2, 3, 4]
    hits = store.recent_hits
    page, more = await store.read_after(conv, 0, 50, min_seq=0, max_seq=None)
    assert [m.seq for m in page] == [1, 2, 3, 4] and not more and store.recent_hits == hits + 1
