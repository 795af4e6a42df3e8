"""`imgw archive run`: move messages older than a cutoff out of the hot store.

Conversation by conversation (ascending conv_id), oldest seqs first, in batches of at
most BATCH_MAX rows: read the next hot rows above the archived top, keep the prefix sent
at or before the cutoff, wait for the rate limit, write the batch's Parquet file, read it back
and check it, then commit the index row and the delete of the hot rows in one
transaction (storage/archive/index_sqlite.py says why a crash anywhere loses and duplicates
nothing). A batch that fails keeps its hot rows; the run goes on with the next
conversation, reports the failure, and the next run retries it.

The conversation's seq counter (`im_conv_seq`) is never touched: seqs keep counting from
where they were, and the archived seqs are still answered by HISTORY and PULL
(storage/archive/tiered.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import structlog

from storage.archive import objects
from storage.archive.index_sqlite import ArchiveIndex, run_blocking
from storage.archive.retain import Expired, Forgets, expire_conversation
from storage.errors import StoreUnavailable

BATCH_MAX: Final = 5_000
CONVERSATION_PAGE: Final = 1_000
COMMIT_RETRIES: Final = 3  # a batch that changed under the mover (a recall) is read again
log = structlog.get_logger("imgw.archive")


@dataclass
class RunReport:
    rows: int = 0
    files: int = 0
    bytes: int = 0
    conversations: int = 0
    failures: list[str] = field(default_factory=list)
    expired: Expired = field(default_factory=Expired)  # retention (storage/archive/retain.py)


class RateLimit:
    """At most `rate` rows a second on average (None: no limit)."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic):
        if rate is not None and not rate > 0:
            raise ValueError("--rate must be > 0 rows/s")
        self.rate = rate
        self._clock = clock
        self._start = clock()
        self._taken = 0

    async def take(self, n: int) -> None:
        if self.rate is None:
            return
        self._taken += n
        due = self._start + self._taken / self.rate
        wait = due - self._clock()
        if wait > 0:
            await asyncio.sleep(wait)


def batch_size(rate: float | None) -> int:
    """Rows a batch: BATCH_MAX, fewer under a low rate (about one batch a second)."""
    if rate is None:
        return BATCH_MAX
    return max(1, min(BATCH_MAX, int(rate)))


async def archive_run(
    index: ArchiveIndex,
    url: str,
    *,
    older_than_ms: int | None,
    rate: float | None = None,
    on_batch: Callable[[int, int, int], None] | None = None,
    retention_ms: int | None = None,
    recent: Forgets | None = None,
) -> RunReport:
    """Archive every hot message sent more than `older_than_ms` ago to `url` (None: do
    not archive); first, with `retention_ms`, delete every message sent longer ago than
    that from both tiers (`recent`: the Redis recent cache, told to forget them).
    `on_batch(conv_id, seq_lo, seq_hi)` is told of each committed batch."""
    # refuses a bad URL before anything moves (retention only: no URL needed)
    loc = objects.open_location(url) if older_than_ms is not None else None
    limit = RateLimit(rate)
    size = batch_size(rate)
    now = index.now_ms()
    cutoff = None if older_than_ms is None else now - older_than_ms
    expire_before = None if retention_ms is None else now - retention_ms
    report = RunReport()
    after = 0
    while True:
        convs = await index.conversations(after, CONVERSATION_PAGE)
        if not convs:
            break
        after = convs[-1]
        for conv_id in convs:
            try:
                if expire_before is not None:
                    expired = await expire_conversation(
                        index, conv_id, expire_before, size, limit, report.expired, recent
                    )
                    report.expired.conversations += expired > 0
                moved = 0
                if cutoff is not None and loc is not None:
                    moved = await _archive_conversation(
                        index, loc, conv_id, cutoff, size, limit, report, on_batch
                    )
            except Exception as e:
                # pyarrow raises OSError for I/O (S3 too), ValueError for a bad read-back;
                # the database StoreUnavailable, or its own error (a shard being moved by
                # `imgw db add-server` has no message table for a moment): whatever it
                # was, the batch's commit did not happen and its hot rows are there
                report.failures.append(f"conv {conv_id}: {e!r}")
                log.warning("archive batch failed; hot rows kept", conv_id=conv_id, error=str(e))
                continue
            if moved:
                report.conversations += 1
    return report


async def _archive_conversation(
    index: ArchiveIndex,
    loc: objects.Location,
    conv_id: int,
    cutoff: int,
    size: int,
    limit: RateLimit,
    report: RunReport,
    on_batch: Callable[[int, int, int], None] | None,
) -> int:
    oldest = await index.oldest_hot(conv_id)
    if oldest is None or oldest[1] > cutoff:
        return 0
    moved = 0
    retries = 0
    top = await index.archived_top(conv_id)
    while True:
        batch = await index.hot_batch(conv_id, top, size)
        if batch and batch[0].msg.seq != top + 1:
            # never by the archiver's own doing: seqs are gapless and it takes prefixes
            raise ValueError(
                f"hot seqs start at {batch[0].msg.seq} but the archive ends at {top}: "
                "refusing to leave a gap"
            )
        take = 0
        for expect, row in enumerate(batch, start=top + 1):
            if row.msg.seq != expect or row.msg.server_ms > cutoff:
                break  # the prefix of consecutive seqs sent by the cutoff
            take += 1
        rows = batch[:take]
        if not rows:
            return moved
        await limit.take(len(rows))
        lo, hi = rows[0].msg.seq, rows[-1].msg.seq
        key = objects.file_key(conv_id, lo, hi)
        nbytes = await run_blocking(objects.write_file, loc, key, rows)
        if not await index.commit(conv_id, rows, loc.url, key, nbytes):
            retries += 1
            if retries > COMMIT_RETRIES:
                raise StoreUnavailable("rows kept changing under the archiver")
            top = await index.archived_top(conv_id)
            continue
        retries = 0
        top = hi
        moved += len(rows)
        report.rows += len(rows)
        report.files += 1
        report.bytes += nbytes
        if on_batch is not None:
            on_batch(conv_id, lo, hi)
        if take < len(batch) or len(batch) < size:
            return moved
