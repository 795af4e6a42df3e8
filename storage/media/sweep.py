"""The delayed cleanup of uploads: an upload that no message references `orphan_ms`
after its upload URL was handed out is claimed (from then on no MEDIA_UPLOAD renews it
and no message may reference it), then deleted, object first, then its row (a crash
between leaves a claimed row: the next sweep deletes its object again and drops the
row). Bounded batches; the clock is injected (tests pass their own)."""

from __future__ import annotations

from typing import Final

from storage.media.index_sqlite import CLAIMED_MS, MediaIndex
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
            # claimed atomically: a message may have referenced it since it was listed, or
            # a new upload URL renewed it; once claimed, neither can happen any more
            claimed = upload.created_ms == CLAIMED_MS  # by a sweep that stopped midway
            if not claimed and not await index.claim(upload.key, cutoff):
                continue
            await objects.delete(upload.key)
            if await index.forget(upload.key, cutoff):
                deleted += 1
        if len(found) < batch:
            break
    return deleted
