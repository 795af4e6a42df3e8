"""Redis trouble as the storage layer's `CacheUnavailable` (storage/errors.py).

Every operation of the Redis adapters runs inside `async with unavailable(what, limit_s)`,
which bounds it as a whole (one timer per operation: redis-py's own per-reply timer, one
per command of a pipeline, cost 6 % of a worker's CPU at 4,000 msg/s), with more time
while the node's own event loop is late (storage/looplag.py). Connection refused
or reset, the timeout, READONLY replicas, LOADING after a restart and any other
`redis.exceptions.RedisError` (or `OSError` from the socket layer) leave the adapter as
`CacheUnavailable`, as do the cluster client's own errors (no node for a slot, a cluster
still reconfiguring after its redirections were followed), with the original chained as
`__cause__`. Callers decide what degrades.
A command cut off by the timeout closes its connection (redis-py drops a connection whose
reply was not read), so no later command reads a stale reply. `asyncio.CancelledError`
from outside is not an `Exception` and always passes through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from storage.errors import CacheUnavailable
from storage.looplag import Deadline
from storage.redis.connect import DEFAULT_TIMEOUT_S, Client


def op_timeout(client: Client) -> float:
    """The bound of one operation on `client`: the URL's `timeout` (see connect.py)."""
    if isinstance(client, RedisCluster):
        kwargs = client.get_connection_kwargs()
    else:
        kwargs = client.connection_pool.connection_kwargs
    value = kwargs.get("socket_connect_timeout")
    return float(value) if value else DEFAULT_TIMEOUT_S


@asynccontextmanager
async def unavailable(what: str, limit_s: float) -> AsyncIterator[None]:
    """Bound the block by `limit_s` seconds and re-raise Redis and socket errors (the timeout
    too: TimeoutError is an OSError) as `CacheUnavailable("redis: <what>…")`."""
    try:
        async with Deadline(limit_s):  # more time while the node itself is late
            yield
    except (RedisError, RedisClusterException, OSError) as e:
        raise CacheUnavailable(f"redis: {what} failed: {type(e).__name__}: {e}") from e
