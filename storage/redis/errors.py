"""Redis trouble as the storage layer's `StoreUnavailable`.

Every operation of the Redis adapters runs inside `unavailable(...)`: connection refused or
reset, timeouts, READONLY replicas, LOADING after a restart and any other
`redis.exceptions.RedisError` (or `OSError` from the socket layer) leave the adapter as
`StoreUnavailable`, with the original chained as `__cause__`. Callers decide what degrades.
`asyncio.CancelledError` is not an `Exception` and always passes through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisError

from storage.models import StoreUnavailable


@contextmanager
def unavailable(what: str) -> Iterator[None]:
    """Re-raise Redis and socket errors of the block as `StoreUnavailable("redis: <what>…")`."""
    try:
        yield
    except (RedisError, OSError) as e:
        raise StoreUnavailable(f"redis: {what} failed: {type(e).__name__}: {e}") from e
