"""Backends by URL: `--store sqlite:///path | mysql://…`, `--cache memory:// | redis://…`,
`--bus local:// | amqp://…`."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from storage.embedded import EmbeddedStore, LocalBus, MemoryRouteStore
from storage.ports import Bus, ChatStore, RouteStore


class BackendError(ValueError):
    """A backend URL that this build cannot open; the message says what to use."""


@dataclass
class Backends:
    store: ChatStore
    routes: RouteStore
    bus: Bus


def sqlite_path(url: str) -> str:
    """`sqlite:///rel/path` is relative, `sqlite:////abs/path` absolute (as SQLAlchemy)."""
    rest = url[len("sqlite://") :]
    if not rest.startswith("/") or len(rest) < 2:
        raise BackendError(f"bad store URL {url!r}: use sqlite:///relative.db or sqlite:////abs.db")
    return rest[1:]


def open_backends(store_url: str, cache_url: str, bus_url: str, *, worker_id: int = 0) -> Backends:
    scheme = urlsplit(store_url).scheme
    if scheme == "sqlite":
        store: ChatStore = EmbeddedStore(sqlite_path(store_url), worker_id=worker_id)
    else:
        raise BackendError(f"unsupported store {store_url!r}: this build supports sqlite:///")
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
