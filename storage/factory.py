"""Backends by URL: `--store sqlite:///path | mysql://…`, `--cache memory:// | redis://…`,
`--bus local:// | amqp://…`.

`mysql://` with `redis://` is the production store (MySQL authority, Redis accelerator;
`redis+cluster://h:p,h:p/` puts all of it on Redis Cluster, `redis+sentinel://h:p,h:p/name`
on the master that Redis Sentinels name);
`mysql://` with `memory://` runs on MySQL alone; the cache URL also names the route
store. `local://` is the in-process bus of a single node; `amqp://` (or `amqps://`) is the
RabbitMQ bus that several nodes share (options in `storage.amqp.bus`).

Whatever the cache, token revocations are kept in the store (`storage.revocations`): the
route store comes wrapped in `DurableRevocations` over the store's revocation log."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from storage.embedded import EmbeddedStore, LocalBus, MemoryRouteStore
from storage.embedded.revocations import SqliteRevocationLog
from storage.ports import Bus, ChatStore, RateBudgets, RouteStore
from storage.revocations import DurableRevocations, RevocationLog
from storage.schemes import REDIS_SCHEMES
from storage.snowflake import Snowflake


class BackendError(ValueError):
    """A backend URL that this build cannot open; the message says what to use."""


@dataclass
class Backends:
    store: ChatStore
    routes: RouteStore
    bus: Bus
    budgets: RateBudgets | None = None  # shared rate budgets (with a shared cache)


def sqlite_path(url: str) -> tuple[str, dict[str, str]]:
    """`sqlite:///rel/path` is relative, `sqlite:////abs/path` absolute (as SQLAlchemy);
    options follow as a query (`?busy_timeout_ms=200`)."""
    rest, _, query = url[len("sqlite://") :].partition("?")
    if not rest.startswith("/") or len(rest) < 2:
        raise BackendError(f"bad store URL {url!r}: use sqlite:///relative.db or sqlite:////abs.db")
    return rest[1:], dict(parse_qsl(query))


def _embedded(url: str, ids: Snowflake) -> tuple[EmbeddedStore, SqliteRevocationLog]:
    path, opts = sqlite_path(url)
    try:
        busy_ms = int(opts.pop("busy_timeout_ms", "5000"))
    except ValueError as e:
        raise BackendError(f"bad busy_timeout_ms in {url!r}") from e
    if opts:
        raise BackendError(f"unknown sqlite options {sorted(opts)} in {url!r}")
    store = EmbeddedStore(path, ids=ids, busy_timeout_ms=busy_ms)
    return store, SqliteRevocationLog(path, busy_timeout_ms=busy_ms)


def import_backends(store_url: str, cache_url: str, bus_url: str) -> None:
    """Import the modules `open_backends` will need for these URLs, now: a supervisor
    does it once before forking its workers. Imported by each worker after its fork,
    they would cost ~0.45 s of CPU each (7 workers on 2 cores: a second more before a
    restarted node listens). Imports only: no connection, no thread."""
    if urlsplit(cache_url).scheme in REDIS_SCHEMES:
        import storage.redis
        import storage.redis.budgets
        import storage.redis.recent
    if urlsplit(store_url).scheme == "mysql":
        import storage.mysql
        import storage.mysql_redis
    if urlsplit(bus_url).scheme in ("amqp", "amqps"):
        import storage.amqp  # noqa: F401


def open_backends(
    store_url: str, cache_url: str, bus_url: str, *, ids: Snowflake | None = None
) -> Backends:
    """The backends named by the URLs; message ids come from `ids` (a leased worker id)."""
    ids = ids or Snowflake(0)
    cache_scheme = urlsplit(cache_url).scheme
    cache = None
    recent = None
    budgets: RateBudgets | None = None
    if cache_scheme in REDIS_SCHEMES:
        from storage.redis import RedisCache, RedisRouteStore, redis_from_url
        from storage.redis.budgets import RedisRateBudgets
        from storage.redis.recent import RecentCache

        try:
            client, prefix = redis_from_url(cache_url)
        except ValueError as e:
            raise BackendError(str(e)) from e
        routes: RouteStore = RedisRouteStore(client, prefix=prefix)
        cache = RedisCache(client, prefix=prefix)
        recent = RecentCache(client, prefix=prefix)
        budgets = RedisRateBudgets(client, prefix=prefix)
    elif cache_scheme == "memory":
        routes = MemoryRouteStore()
    else:
        raise BackendError(
            f"unsupported cache {cache_url!r}: use memory:// or redis://host:port/db"
        )

    store_scheme = urlsplit(store_url).scheme
    revocations: RevocationLog
    if store_scheme == "sqlite":
        embedded, revocations = _embedded(store_url, ids)
        store: ChatStore = embedded
    elif store_scheme == "mysql":
        from storage.mysql import MySQLSettings, MySQLStore
        from storage.mysql_redis import MySQLRedisStore

        try:
            mysql = MySQLStore(MySQLSettings.from_url(store_url), ids=ids)
        except ValueError as e:
            raise BackendError(str(e)) from e
        store = mysql if cache is None else MySQLRedisStore(mysql, cache, recent)
        revocations = mysql.revocations
    else:
        raise BackendError(
            f"unsupported store {store_url!r}: use sqlite:///path or mysql://user:pw@host/db"
        )

    bus_scheme = urlsplit(bus_url).scheme
    if bus_scheme == "local":
        bus: Bus = LocalBus()
    elif bus_scheme in ("amqp", "amqps"):
        from storage.amqp import AmqpBus

        try:
            bus = AmqpBus(bus_url)
        except ValueError as e:
            raise BackendError(str(e)) from e
    else:
        raise BackendError(
            f"unsupported bus {bus_url!r}: use local:// or amqp://user:pw@host:5672/vhost"
        )
    return Backends(store, DurableRevocations(routes, revocations), bus, budgets)
