"""Opening a Redis client from a `--cache redis://…` URL.

    redis://[user:password@]host:port/db?prefix=imgw:&timeout=1.0
    rediss://…   (TLS)      unix:///path/to/redis.sock?db=0&prefix=…
    redis+cluster://[user:password@]host:port,host:port,…/?prefix=imgw:&timeout=1.0
    rediss+cluster://…   (Redis Cluster over TLS)

A `+cluster` URL opens redis-py's `RedisCluster` (`Client` is either kind): the listed
nodes are only where it starts; it learns the slots from them, sends each command to the
master of its key's slot and follows MOVED/ASK redirections. Cluster mode has no `db`
(always 0) and no unix sockets; `max_connections` (default 256) is per master, and a
command finding all of them busy fails at once instead of waiting.

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
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

DEFAULT_TIMEOUT_S: Final = 1.0
DEFAULT_MAX_CONNECTIONS: Final = 64
CLUSTER_MAX_CONNECTIONS: Final = 256
HEALTH_CHECK_INTERVAL_S: Final = 30
SCHEMES: Final = ("redis", "rediss", "unix")
CLUSTER_SCHEMES: Final = ("redis+cluster", "rediss+cluster")

# One Redis server (its own pool) or a Redis Cluster (a pool per node).
Client = aioredis.Redis | RedisCluster


def redis_from_url(url: str, **pool_options: object) -> tuple[Client, str]:
    """The client for `url` and the key prefix it names (`""` when none). The client owns
    its pool: `await client.aclose()` closes it. `pool_options` override the pool and
    connection settings (tests pass a `connection_class`)."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES + CLUSTER_SCHEMES:
        raise ValueError(
            f"bad Redis URL {url!r}: use redis://host:port/db?prefix=… or "
            "redis+cluster://host:port,host:port/?prefix=…"
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
    options: dict[str, object] = {
        "max_connections": DEFAULT_MAX_CONNECTIONS,
        "timeout": timeout,  # the wait for a free pooled connection
        "decode_responses": False,
        "socket_timeout": None,  # the adapters bound each operation (see above)
        "socket_connect_timeout": timeout,
        "health_check_interval": HEALTH_CHECK_INTERVAL_S,
        "retry_on_timeout": False,
        "retry": Retry(NoBackoff(), 1, (RedisConnectionError,)),
        "client_name": "imgw",
        **pool_options,
    }
    pool = aioredis.BlockingConnectionPool.from_url(
        urlunsplit(parts._replace(query=urlencode(rest))), **options
    )
    return aioredis.Redis.from_pool(pool), prefix


def _cluster(
    url: str, query: list[tuple[str, str]], timeout: float, pool_options: dict[str, object]
) -> RedisCluster:
    parts = urlsplit(url)
    if parts.path not in ("", "/"):
        raise ValueError(f"Redis Cluster URL {url!r} takes no database: it is always 0")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    nodes: list[ClusterNode] = []
    for hostport in hosts.split(","):
        host, _, port = hostport.rpartition(":")
        host = host.strip("[]")  # [::1]:7000
        if not host or not port.isdigit():
            raise ValueError(f"bad node {hostport!r} in Redis Cluster URL {url!r}: use host:port")
        nodes.append(ClusterNode(host, int(port)))
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
