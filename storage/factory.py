"""Backends by URL: `--store sqlite:///path | mysql://…`, `--cache memory:// | redis://…`,
`--bus local:// | amqp://…`."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from storage.embedded import EmbeddedStore, LocalBus, MemoryRouteStore
from storage.ports import Bus, ChatStore, RouteStore


class BackendError(ValueError):
    """A backend URL that this build cannot open; the message says what to use."""


@dataclass
class Backends:
    store: ChatStore
    routes: RouteStore
    bus: Bus


def sqlite_path(url: str) -> tuple[str, dict[str, str]]:
    """`sqlite:///rel/path` is relative, `sqlite:////abs/path` absolute (as SQLAlchemy);
    options follow as a query (`?busy_timeout_ms=200`)."""
    rest, _, query = url[len("sqlite://") :].partition("?")
    if not rest.startswith("/") or len(rest) < 2:
        raise BackendError(f"bad store URL {url!r}: use sqlite:///relative.db or sqlite:////abs.db")
    return rest[1:], dict(parse_qsl(query))


def open_backends(store_url: str, cache_url: str, bus_url: str, *, worker_id: int = 0) -> Backends:
    scheme = urlsplit(store_url).scheme
    if scheme == "sqlite":
        path, opts = sqlite_path(store_url)
        try:
            busy_ms = int(opts.pop("busy_timeout_ms", "5000"))
        except ValueError as e:
            raise BackendError(f"bad busy_timeout_ms in {store_url!r}") from e
        if opts:
            raise BackendError(f"unknown sqlite options {sorted(opts)} in {store_url!r}")
        store: ChatStore = EmbeddedStore(path, worker_id=worker_id, busy_timeout_ms=busy_ms)
    elif scheme == "mysql":
        from storage.mysql import MySQLSettings, MySQLStore

        try:
            settings = MySQLSettings.from_url(store_url)
        except ValueError as e:
            raise BackendError(str(e)) from e
        store = MySQLStore(settings, worker_id=worker_id)
    else:
        raise BackendError(
            f"unsupported store {store_url!r}: use sqlite:///path or mysql://user:pw@host/db"
        )
    scheme = urlsplit(cache_url).scheme
    if scheme == "memory":
        routes: RouteStore = MemoryRouteStore()
    else:
        raise BackendError(f"unsupported cache {cache_url!r}: this build supports memory://")
    scheme = urlsplit(bus_url).scheme
    if scheme == "local":
        bus: Bus = LocalBus()
    else:
        raise BackendError(f"unsupported bus {bus_url!r}: this build supports local://")
    return Backends(store, routes, bus)
