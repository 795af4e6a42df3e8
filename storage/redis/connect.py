"""Opening a Redis client from a `--cache redis://…` URL.

    redis://[user:password@]host:port/db?prefix=imgw:&timeout=1.0
    rediss://…   (TLS)      unix:///path/to/redis.sock?db=0&prefix=…
    redis+cluster://[user:password@]host:port,host:port,…/?prefix=imgw:&timeout=1.0
    rediss+cluster://…   (Redis Cluster over TLS)
    redis+sentinel://[user:password@]host:port,host:port,…/service[/db]?prefix=…
    rediss+sentinel://…  (the master over TLS)

A `+cluster` URL opens redis-py's `RedisCluster` (`Client` is either kind): the listed
nodes are only where it starts; it learns the slots from them, sends each command to the
master of its key's slot and follows MOVED/ASK redirections. Cluster mode has no `db`
(always 0) and no unix sockets; `max_connections` (default 256) is per master, and a
command finding all of them busy fails at once instead of waiting.

A `+sentinel` URL lists Sentinels and names the service they watch: the client asks a
Sentinel for the service's master before each new connection, and a master that turns
out to be a replica (demoted by a failover) closes the connection and is asked for
again, so a failover needs no restart. The user and password are the master's; a
Sentinel's own password goes in `sentinel_password`.

- `prefix` is prepended to every key the adapters write, so tests and tenants can share
  one server. It may not contain `{` or `}` (that would move the keys' hash tags).
- `timeout` (seconds, default 1.0) bounds connecting and each operation of the adapters
  as a whole (a command or a pipeline: `storage.redis.errors.unavailable`), so a dead or
  hung Redis fails fast as `CacheUnavailable` instead of stalling logins and sends. The
  client itself has no per-reply timeout (`socket_timeout=None`): that timer, one per
  command of a pipeline, cost 6 % of a worker's CPU at 4,000 msg/s.
- `max_connections` (default 64) caps the pool; a caller finding every connection busy
  waits for one up to `timeout` (a login storm queues instead of failing).
- Other query options are redis-py's own (`health_check_interval`, `db`…).

The client answers bytes (`decode_responses=False`: cached values are msgpack), never
retries on a timeout (the command may have run), retries once at once on a broken
connection (a pooled socket that died with a Redis restart), pings a connection idle for
30 s before using it, and parses replies with hiredis when it is installed (redis-py
picks its parser automatically).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

DEFAULT_TIMEOUT_S: Final = 1.0
DEFAULT_MAX_CONNECTIONS: Final = 64
CLUSTER_MAX_CONNECTIONS: Final = 256
HEALTH_CHECK_INTERVAL_S: Final = 30
SCHEMES: Final = ("redis", "rediss", "unix")
CLUSTER_SCHEMES: Final = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")

# One Redis server (its own pool) or a Redis Cluster (a pool per node).
Client = aioredis.Redis | RedisCluster


def redis_from_url(url: str, **pool_options: object) -> tuple[Client, str]:
    """The client for `url` and the key prefix it names (`""` when none). The client owns
    its pool: `await client.aclose()` closes it. `pool_options` override the pool and
    connection settings (tests pass a `connection_class`)."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES:
        raise ValueError(
            f"bad Redis URL {url!r}: use redis://host:port/db?prefix=…, "
            "redis+cluster://host:port,host:port/?prefix=… or "
            "redis+sentinel://host:port,host:port/service?prefix=…"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefix = ""
    timeout = DEFAULT_TIMEOUT_S
    rest: list[tuple[str, str]] = []
    for name, value in query:
        if name == "prefix":
            prefix = value
        elif name == "timeout":
            try:
                timeout = float(value)
            except ValueError:
                raise ValueError(f"bad timeout {value!r} in Redis URL {url!r}") from None
            if not timeout > 0:
                raise ValueError(f"timeout must be > 0 in Redis URL {url!r}")
        else:
            rest.append((name, value))
    check_prefix(prefix)
    if parts.scheme in CLUSTER_SCHEMES:
        return _cluster(url, rest, timeout, pool_options), prefix
    if parts.scheme in SENTINEL_SCHEMES:
        return _sentinel(url, rest, timeout, pool_options), prefix
    options = {**_server_options(timeout), **pool_options}
    pool = aioredis.BlockingConnectionPool.from_url(
        urlunsplit(parts._replace(query=urlencode(rest))), **options
    )
    return aioredis.Redis.from_pool(pool), prefix


def _server_options(timeout: float) -> dict[str, object]:
    """The pool and connection settings of one server's client (see the module
    docstring)."""
    return {
        "max_connections": DEFAULT_MAX_CONNECTIONS,
        "timeout": timeout,  # the wait for a free pooled connection
        "decode_responses": False,
        "socket_timeout": None,  # the adapters bound each operation (see above)
        "socket_connect_timeout": timeout,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "retry_on_timeout": False,
        "retry": Retry(NoBackoff(), 1, (RedisConnectionError,)),
        "client_name": "imgw",
    }


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The Sentinel's pool (the master's address asked before each new connection) that
    waits for a free connection up to `timeout`, as the single-server pool does."""


class _SentinelRedis(aioredis.Redis):
    """The master's client; closing it closes the Sentinels' connections too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        pool = self.connection_pool
        await super().aclose(close_connection_pool)
        if isinstance(pool, SentinelConnectionPool):
            await pool.sentinel_manager.aclose()


def _sentinel(
    url: str, query: list[tuple[str, str]], timeout: float, pool_options: dict[str, object]
) -> aioredis.Redis:
    parts = urlsplit(url)
    service, _, db = parts.path.strip("/").partition("/")
    if not service or (db and not db.isdigit()):
        raise ValueError(
            f"Redis Sentinel URL {url!r} names the service after the Sentinels: "
            "redis+sentinel://host:port,host:port/service[/db]"
        )
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    sentinels = [_host_port(hostport, url) for hostport in hosts.split(",")]
    options: dict[str, object] = {
        **_server_options(timeout),
        "db": int(db or 0),
        "ssl": parts.scheme == "rediss+sentinel",
        "username": unquote(user) or None,
        "password": unquote(password) or None,
    }
    sentinel_options: dict[str, object] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
    }
    for name, value in query:
        if name == "max_connections":
            options[name] = int(value)
        elif name == "sentinel_password":
            sentinel_options["password"] = value
        else:
            raise ValueError(f"unknown option {name!r} in Redis Sentinel URL {url!r}")
    options.update(pool_options)
    manager = Sentinel(sentinels, sentinel_kwargs=sentinel_options)
    return manager.master_for(  # type: ignore[no-any-return]
        service,
        redis_class=_SentinelRedis,
        connection_pool_class=_BlockingSentinelPool,
        **options,
    )


def _host_port(hostport: str, url: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")  # [::1]:7000
    if not host or not port.isdigit():
        raise ValueError(f"bad node {hostport!r} in Redis URL {url!r}: use host:port")
    return host, int(port)


def _cluster(
    url: str, query: list[tuple[str, str]], timeout: float, pool_options: dict[str, object]
) -> RedisCluster:
    parts = urlsplit(url)
    if parts.path not in ("", "/"):
        raise ValueError(f"Redis Cluster URL {url!r} takes no database: it is always 0")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    nodes = [ClusterNode(*_host_port(hostport, url)) for hostport in hosts.split(",")]
    options: dict[str, object] = {
        # per master; redis-py's cluster pool does not wait for a free connection (past
        # the cap a command fails at once), so the cap is higher than a single pool's
        "max_connections": CLUSTER_MAX_CONNECTIONS,
        "decode_responses": False,
        "socket_timeout": None,  # the adapters bound each operation (see above)
        "socket_connect_timeout": timeout,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        # one more try on a broken connection or a cluster that is reconfiguring, after
        # re-reading the slots (MOVED/ASK/TRYAGAIN are followed apart from this)
        "retry": Retry(NoBackoff(), 1),
        "client_name": "imgw",
        # a MOVED reply patches that slot's owner and nothing else: redis-py's default
        # (every 5th MOVED re-reads the whole map by closing every node's connections,
        # those in use too) failed the commands of other tasks in flight during a reshard
        "reinitialize_steps": 0,
        "ssl": parts.scheme == "rediss+cluster",
        "username": unquote(user) or None,
        "password": unquote(password) or None,
    }
    for name, value in query:
        if name == "max_connections":
            options[name] = int(value)
        elif name == "require_full_coverage":
            options[name] = value.lower() in ("1", "true", "yes")
        else:
            raise ValueError(f"unknown option {name!r} in Redis Cluster URL {url!r}")
    options.update(pool_options)
    return RedisCluster(startup_nodes=nodes, **options)  # type: ignore[arg-type]


def check_prefix(prefix: str) -> str:
    """A prefix goes before each key's `{hash tag}`: braces in it would move the tag."""
    if "{" in prefix or "}" in prefix:
        raise ValueError(f"Redis key prefix {prefix!r} may not contain braces")
    return prefix
