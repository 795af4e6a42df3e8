"""The storage layer's errors, in one place.

    BackendUnavailable           a backend did not answer: nothing was done, retry later
    ├── StoreUnavailable         the authoritative store (MySQL, SQLite): nothing committed
    │   └── StoreOutcomeUnknown  a COMMIT went unanswered: it may have landed
    ├── CacheUnavailable         Redis: the cache, routes, recent messages, budgets, the
    │                            snowflake worker-id lease
    ├── BusUnavailable           the message bus (AMQP) could not be started
    └── ObjectsUnavailable       the media object store (S3) did not answer

    GroupFull                    a refusal, not a failure: the change would take a group
                                 over its member limit; nothing changed
    Revoked                      a refusal: a revocation covers the login's token

Catch `BackendUnavailable` where any backend may have failed (a request handler: the
client is told `unavailable` and retries); catch one leaf where only that backend is
involved (the production store falls back to MySQL on `CacheUnavailable`). Every
`BackendUnavailable` raised for an underlying error chains it as `__cause__`.
`StoreOutcomeUnknown` is a `StoreUnavailable`, so code that only knows "the store did
not answer" still never reports "stored"; the send path tells it apart, because it must
not report "not stored" either.
"""

from __future__ import annotations


class BackendUnavailable(Exception):
    """A backend (store, Redis, bus) did not answer in time or refused the connection;
    the operation did nothing. Transient: retry later."""


class StoreUnavailable(BackendUnavailable):
    """The authoritative store could not complete the operation; nothing was committed."""


class StoreOutcomeUnknown(StoreUnavailable):
    """A commit was sent and the store could not tell whether it landed: it may be
    committed. Callers must not report "not stored"; a retry with the same idempotency
    key learns the outcome."""


class CacheUnavailable(BackendUnavailable):
    """Redis could not complete the operation (any Redis adapter: cache, routes, recent
    messages, budgets, the worker-id lease). Nothing authoritative depends on it: callers
    fall back to the store or degrade."""


class BusUnavailable(BackendUnavailable):
    """The message bus between nodes could not be reached."""


class GroupFull(Exception):
    """A membership change would take a group over its member limit; nothing changed."""


class Revoked(Exception):
    """A login whose token a revocation covers (RouteStore.register refused it)."""


__all__ = [
    "BackendUnavailable",
    "BusUnavailable",
    "CacheUnavailable",
    "GroupFull",
    "Revoked",
    "StoreOutcomeUnknown",
    "StoreUnavailable",
]


class ObjectsUnavailable(BackendUnavailable):
    """The media object store (S3 or S3-compatible) did not answer or failed: a request
    that needed it is told `unavailable`."""
