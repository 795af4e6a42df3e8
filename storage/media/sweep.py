"""The delayed cleanup of the seed: an upload that no message references `orphan_ms`
after its upload URL was handed out is deleted, object first, then its row (a crash
between leaves a row whose object is gone: the next sweep deletes nothing and drops
the row). Bounded batches; the clock is injected (tests pass their own)."""

from __future__ import annotations

from typing import Final

from storage.media.index import MediaIndex
from storage.media.objects import MediaObjects

SWEEP_BATCH: Final = 200  # uploads per batch
SWEEP_BATCHES: Final = 5  # batches per call (the node calls it about once a minute)


async def sweep_orphans(
    index: MediaIndex,
    objects: MediaObjects,
    *,
    now_ms: int,
    orphan_ms: int,
    batch: int = SWEEP_BATCH,
    batches: int = SWEEP_BATCHES,
) -> int:
    """Delete up to `batch * batches` orphaned uploads; how many were deleted."""
    cutoff = now_ms - orphan_ms
    deleted = 0
    for _ in range(batches):
        found = await index.orphans(cutoff, batch)
        for upload in found:
            # re-read: a message may have referenced it, or a new upload URL renewed it
            now = await index.get_upload(upload.key)
            if now is None or now.referenced or now.created_ms >= cutoff:
                continue
            await objects.delete(upload.key)
            if await index.forget(upload.key, cutoff):
                deleted += 1
        if len(found) < batch:
            break
    return deleted
