"""The URL schemes of the backends, for the code that picks one without importing it."""

from __future__ import annotations

from typing import Final

# --cache schemes that name Redis: one server, a cluster, or a master found by Sentinels
REDIS_SCHEMES: Final = (
    "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"
)  # fmt: skip
