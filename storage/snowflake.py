"""Snowflake message ids: 41 bits of ms since EPOCH_MS, 10 bits of worker id, 12 bits of
sequence. Monotonic per generator even if the wall clock steps back."""

from __future__ import annotations

import time
from typing import Final

from storage.errors import StoreUnavailable

EPOCH_MS: Final = 1_704_067_200_000  # 2024-01-01T00:00:00Z
WORKER_BITS: Final = 10
SEQ_BITS: Final = 12
MAX_WORKER: Final = (1 << WORKER_BITS) - 1
_SEQ_MASK: Final = (1 << SEQ_BITS) - 1


class Snowflake:
    __slots__ = ("_last_ms", "_seq", "_worker")

    def __init__(self, worker_id: int) -> None:
        if not 0 <= worker_id <= MAX_WORKER:
            raise ValueError(f"worker id must be 0..{MAX_WORKER}, got {worker_id}")
        self._worker = worker_id
        self._last_ms = 0
        self._seq = 0

    @property
    def worker_id(self) -> int:
        return self._worker

    @worker_id.setter
    def worker_id(self, worker_id: int) -> None:
        """Move to another worker id (a lease changed hands); ids stay monotonic."""
        if not 0 <= worker_id <= MAX_WORKER:
            raise ValueError(f"worker id must be 0..{MAX_WORKER}, got {worker_id}")
        self._worker = worker_id

    def suspend(self) -> None:
        """Stop minting (the leased worker id was lost): next_id raises StoreUnavailable
        until a worker id is set again."""
        self._worker = -1

    def next_id(self, now_ms: int | None = None) -> int:
        if self._worker < 0:
            raise StoreUnavailable("no snowflake worker id (lease lost); retry shortly")
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        if ms <= self._last_ms:
            # Same ms, or the clock stepped back: keep counting on the last ms.
            ms = self._last_ms
            self._seq = (self._seq + 1) & _SEQ_MASK
            if self._seq == 0:
                ms += 1  # borrow the next ms rather than wait
        else:
            self._seq = 0
        self._last_ms = ms
        shifted_ms = (ms - EPOCH_MS) << (WORKER_BITS + SEQ_BITS)
        return shifted_ms | (self._worker << SEQ_BITS) | self._seq
