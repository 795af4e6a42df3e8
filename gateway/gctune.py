"""Garbage-collector settings for the long-running event-loop processes (gateway
workers, bench generators)."""

from __future__ import annotations

import gc
from typing import Final

GC_THRESHOLD: Final = (50_000, 20, 100)


def quiet_gc() -> None:
    """Fewer and shorter garbage collections on the hot path: what exists after start
    (modules, pools, config) moves to the permanent generation, so a full collection no
    longer walks it, and a young collection runs every 50,000 net allocations instead of
    700 (a send allocates a few dozen objects; cycles are rare on it). Embedded chat at
    3,000 msg/s, 5 runs each: gateway CPU median 146 vs 157 µs per message, p99
    send→ACK median 43 vs 54 ms."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
