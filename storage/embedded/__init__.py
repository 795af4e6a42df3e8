"""The embedded default backend: SQLite store, in-process routes and bus."""

from storage.embedded.bus import LocalBus
from storage.embedded.routes import MemoryRouteStore
from storage.embedded.store import EmbeddedStore

__all__ = ["EmbeddedStore", "LocalBus", "MemoryRouteStore"]
