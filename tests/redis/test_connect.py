"""Opening clients from URLs, and what callers see when Redis is down or hung."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from storage.errors import CacheUnavailable
from storage.models import Route, StoredMessage
from storage.redis import MemberSnapshot, RedisCache, RedisRouteStore, redis_from_url
from storage.redis.errors import op_timeout
from storage.redis.recent import RecentCache

ROUTE = Route(1, "phone", "n1", 1, 1)


async def test_url_options() -> None:
    client, prefix = redis_from_url("redis://10.1.2.3:6380/4?prefix=t1:&timeout=0.25")
    try:
        kw = client.connection_pool.connection_kwargs
        assert prefix == "t1:"
        assert (kw["host"], kw["port"], kw["db"]) == ("10.1.2.3", 6380, 4)
        assert kw["socket_connect_timeout"] == op_timeout(client) == 0.25
        assert kw["socket_timeout"] is None  # each operation is bounded as a whole instead
        assert kw["retry_on_timeout"] is False and kw["decode_responses"] is False
        assert client.connection_pool.max_connections == 64
    finally:
        await client.aclose()
    client, prefix = redis_from_url("redis://localhost?max_connections=8")
    try:
        assert prefix == ""
        assert op_timeout(client) == 1.0
        assert client.connection_pool.max_connections == 8
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:6379",
        "redis://localhost?prefix={t}:",
        "redis://localhost?timeout=0",
        "redis://localhost?timeout=soon",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        redis_from_url(url)


def test_prefix_with_braces_is_refused() -> None:
    client, _ = redis_from_url("redis://localhost")
    with pytest.raises(ValueError):
        RedisRouteStore(client, prefix="a{b}")
    with pytest.raises(ValueError):
        RedisCache(client, prefix="a}")


Call = Callable[[RedisRouteStore, RedisCache, RecentCache], Awaitable[Any]]

CALLS: list[Call] = [
    lambda r, c, rc: r.register(ROUTE),
    lambda r, c, rc: r.renew([ROUTE]),
    lambda r, c, rc: r.remove(ROUTE),
    lambda r, c, rc: r.get(1, "phone"),
    lambda r, c, rc: r.online([1, 2]),
    lambda r, c, rc: c.get_sent(1, "x"),
    lambda r, c, rc: c.put_members(MemberSnapshot(1, 1, {1: (1, None)}, [1])),
    lambda r, c, rc: c.get_reads(1, [1]),
    lambda r, c, rc: c.advance_read(1, 1, 2),
    lambda r, c, rc: c.get_delivered(1, "phone", [1]),
    lambda r, c, rc: rc.add([StoredMessage(1, 1, 1, 1, 1, b"", 1, "x")]),
    lambda r, c, rc: rc.range(1, 1, 2),
]


@pytest.fixture
async def hung_port() -> AsyncIterator[int]:
    """A server that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for w in held:
        w.close()
    server.close()
    await server.wait_closed()


@pytest.mark.parametrize("call", range(len(CALLS)))
async def test_refused_connection_fails_fast(call: int) -> None:
    client, prefix = redis_from_url("redis://127.0.0.1:1/0?timeout=1.0")
    routes, cache = RedisRouteStore(client, prefix=prefix), RedisCache(client, prefix=prefix)
    started = time.monotonic()
    with pytest.raises(CacheUnavailable, match=r"redis: .* failed"):
        await CALLS[call](routes, cache, RecentCache(client, prefix=prefix))
    assert time.monotonic() - started < 2.0
    assert await cache.ping() is False
    await routes.close()


@pytest.mark.parametrize("call", range(len(CALLS)))
async def test_hung_redis_times_out(hung_port: int, call: int) -> None:
    """A Redis that accepts and never answers: every operation fails within its bound."""
    client, prefix = redis_from_url(f"redis://127.0.0.1:{hung_port}/0?timeout=0.3")
    routes, cache = RedisRouteStore(client, prefix=prefix), RedisCache(client, prefix=prefix)
    started = time.monotonic()
    with pytest.raises(CacheUnavailable, match="Timeout"):
        await CALLS[call](routes, cache, RecentCache(client, prefix=prefix))
    assert time.monotonic() - started < 1.0
    await routes.close()


async def test_cluster_url_options() -> None:
    from redis.asyncio.cluster import RedisCluster

    client, prefix = redis_from_url(
        "redis+cluster://u:p%40w@10.0.0.1:7000,[::1]:7001/?prefix=t1:&timeout=0.5"
    )
    try:
        assert isinstance(client, RedisCluster)
        assert prefix == "t1:"
        kw = client.get_connection_kwargs()
        assert kw["socket_connect_timeout"] == op_timeout(client) == 0.5
        assert kw["socket_timeout"] is None and kw["decode_responses"] is False
        assert (kw["username"], kw["password"]) == ("u", "p@w")
        starts = client.nodes_manager.startup_nodes
        assert sorted(starts) == ["10.0.0.1:7000", "::1:7001"]
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://h:7000/3",  # no db in cluster mode
        "redis+cluster://h,h2:7000/",
        "redis+cluster://h:7000/?prefix={t}",
        "redis+cluster://h:7000/?health=1",
        "redis+cluster://h:7000/?timeout=-1",
    ],
)
def test_bad_cluster_urls(url: str) -> None:
    with pytest.raises(ValueError):
        redis_from_url(url)


async def test_sentinel_url_options() -> None:
    from redis.asyncio.sentinel import SentinelConnectionPool

    client, prefix = redis_from_url(
        "redis+sentinel://u:p%40w@10.0.0.1:26379,[::1]:26380/mymaster/2"
        "?prefix=t1:&timeout=0.5&sentinel_password=s3&max_connections=8"
    )
    try:
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "mymaster"
        assert prefix == "t1:"
        kw = pool.connection_kwargs
        assert kw["socket_connect_timeout"] == op_timeout(client) == 0.5
        assert kw["socket_timeout"] is None and kw["decode_responses"] is False
        assert (kw["username"], kw["password"], kw["db"]) == ("u", "p@w", 2)
        assert pool.max_connections == 8
        sentinels = pool.sentinel_manager.sentinels
        addresses = [s.connection_pool.connection_kwargs for s in sentinels]
        assert [(a["host"], a["port"]) for a in addresses] == [("10.0.0.1", 26379), ("::1", 26380)]
        assert {a["password"] for a in addresses} == {"s3"}
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://h:26379/",  # no service
        "redis+sentinel://h:26379/svc/x",  # db not a number
        "redis+sentinel://h,h2:26379/svc",
        "redis+sentinel://h:26379/svc?prefix={t}",
        "redis+sentinel://h:26379/svc?health=1",
    ],
)
def test_bad_sentinel_urls(url: str) -> None:
    with pytest.raises(ValueError):
        redis_from_url(url)
