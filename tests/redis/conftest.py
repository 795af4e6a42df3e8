"""Fixtures for the Redis adapters: a real Redis, a private random key prefix per test,
and every key under that prefix deleted afterwards.

Redis is `IMGW_TEST_REDIS_URL` (default redis://127.0.0.1:6379/0). When it does not
answer, the tests fail (never skip) and say how to start it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from storage.redis import RedisCache, RedisRouteStore, redis_from_url
from tests.support.services import drop_redis

REDIS_URL = os.environ.get("IMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
START_REDIS = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log"
)


def url_with(**query: str) -> str:
    sep = "&" if "?" in REDIS_URL else "?"
    return REDIS_URL + sep + "&".join(f"{k}={v}" for k, v in query.items())


async def require_redis(client: aioredis.Redis) -> None:
    try:
        await client.ping()
    except (RedisError, OSError) as e:
        await client.aclose()
        why = f"Redis at {REDIS_URL} is not reachable ({type(e).__name__}: {e})"
        pytest.fail(f"{why}; these tests need it. Start it: {START_REDIS}")


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    """A private key prefix; every key under it is deleted at the end of the test."""
    p = f"imgwtest:{secrets.token_hex(6)}:"
    yield p
    with contextlib.suppress(RedisError, OSError):  # if down, the test failed or skipped
        await drop_redis(url_with(prefix=p))


@pytest.fixture
async def client(prefix: str) -> AsyncIterator[aioredis.Redis]:
    """A client on the test Redis, as production opens it (its prefix is the test's)."""
    c, parsed = redis_from_url(url_with(prefix=prefix))
    assert parsed == prefix
    await require_redis(c)
    yield c
    await c.aclose()


@pytest.fixture
async def routes(client: aioredis.Redis, prefix: str) -> RedisRouteStore:
    return RedisRouteStore(client, prefix=prefix)


@pytest.fixture
async def cache(client: aioredis.Redis, prefix: str) -> RedisCache:
    return RedisCache(client, prefix=prefix)


class CountingConnection(aioredis.Connection):
    """Counts what it sends: one send per command, one per whole pipeline (a round trip)."""

    sends: ClassVar[int] = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1
        await super().send_packed_command(command, check_health)


@pytest.fixture
async def counting_client(prefix: str) -> AsyncIterator[tuple[aioredis.Redis, Callable[[], int]]]:
    """A client whose round trips can be counted: `(client, sends)`, `sends()` so far."""
    counter = type("Counter", (CountingConnection,), {"sends": 0})
    c, _ = redis_from_url(REDIS_URL, connection_class=counter, socket_timeout=5)
    await require_redis(c)

    def sends() -> int:
        return int(counter.sends)

    yield c, sends
    await c.aclose()
