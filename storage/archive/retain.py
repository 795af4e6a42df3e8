"""Message retention (`imgw archive run --retention 365d`): messages sent before the
retention cutoff are deleted from every tier, conversation by conversation.

A conversation's seqs past retention are always a prefix: seqs 1..n, oldest first (the
rule the archiver follows too: the consecutive seqs sent at or before the cutoff). So
retention only ever moves one number per conversation up, the top of its expired range,
which the archive index keeps as a row without a file (storage/archive/index_sqlite.py).
Per conversation:

1. Archive files, lowest first. A file whose rows are all past retention: its index row
   goes (and the expired range takes its seqs) in one transaction, then the file is
   deleted. A file partly past retention is **rewritten** without those rows (a new
   file `<first kept seq>-<seq_hi>.parquet`, written and read back like the archiver's),
   then in one transaction the old index row goes, the new one comes and the expired
   range grows; then the old file is deleted. Readers never return a message past
   retention once a conversation is done (a file is never kept "until all its rows are
   past"). The first file with nothing past retention ends the conversation.
2. Hot rows, once no archive file is left below them: batches of the prefix past
   retention, each deleted in one transaction that also grows the expired range (the
   archiver's checks: the rows are as read, next above the index's top).

Batches and the rate limit are the archiver's (a file counts its rows). With Redis in
front (`--cache`), the recent cache is told to forget the seqs first (as a recall does):
its floor then refuses a late write of them.

Killed anywhere, nothing past retention comes back and nothing not past it is lost: each
step is one transaction; a rewritten file not yet indexed is named by no index row (the
next run writes it again), and a file whose index row is gone but which was not yet
deleted is read by nobody (left behind, as the archiver's unindexed files are).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from storage.archive import objects
from storage.archive.index_sqlite import (
    ArchivedMessage,
    ArchiveFile,
    ArchiveIndex,
    batch_runs,
    run_blocking,
)
from storage.errors import StoreUnavailable

MIN_RETENTION_MS: Final = 48 * 3600 * 1000  # the idempotency window: retries still dedupe
COMMIT_RETRIES: Final = 3
MAX_SEQ: Final = (1 << 63) - 1


class Forgets(Protocol):
    """The recent cache's `forget_upto` (storage/redis/recent.py)."""

    async def forget_upto(self, conv_id: int, seq: int) -> None: ...


class Limit(Protocol):
    async def take(self, n: int) -> None: ...


@dataclass
class Expired:
    """What retention deleted in one run."""

    rows: int = 0  # messages, hot and archived
    hot_rows: int = 0
    files_deleted: int = 0
    files_rewritten: int = 0
    conversations: int = 0


def past(rows: Sequence[ArchivedMessage], first: int, cutoff: int) -> int:
    """How many of `rows` (from seq `first`) are the prefix of consecutive seqs sent at
    or before `cutoff`."""
    n = 0
    for expect, row in enumerate(rows, start=first):
        if row.msg.seq != expect or row.msg.server_ms > cutoff:
            break
        n += 1
    return n


async def expire_conversation(
    index: ArchiveIndex,
    conv_id: int,
    cutoff: int,
    size: int,
    limit: Limit,
    report: Expired,
    recent: Forgets | None = None,
) -> int:
    """Delete conversation `conv_id`'s messages sent at or before `cutoff`; how many."""
    gone = 0
    for f in [f for f in await index.files(conv_id, 1, MAX_SEQ) if f.key]:
        n, done = await _expire_file(index, conv_id, f, cutoff, limit, report, recent)
        gone += n
        if not done:
            return gone  # this file keeps messages: everything above is newer
    retries = 0
    top = await index.archived_top(conv_id)
    while True:
        batch = await index.hot_batch(conv_id, top, size)
        rows = batch[: past(batch, top + 1, cutoff)]
        if not rows:
            return gone
        await limit.take(len(rows))
        if recent is not None:
            await recent.forget_upto(conv_id, rows[-1].msg.seq)
        if not await index.expire_hot(conv_id, rows):
            retries += 1  # a recall, or the archiver took them first
            if retries > COMMIT_RETRIES:
                raise StoreUnavailable("rows kept changing under retention")
            if await index.files(conv_id, top + 1, MAX_SEQ):
                return gone  # archived meanwhile: the next run expires the file
            top = await index.archived_top(conv_id)
            continue
        retries = 0
        top = rows[-1].msg.seq
        gone += len(rows)
        report.rows += len(rows)
        report.hot_rows += len(rows)
        if len(rows) < len(batch) or len(batch) < size:
            return gone


async def _expire_file(
    index: ArchiveIndex,
    conv_id: int,
    f: ArchiveFile,
    cutoff: int,
    limit: Limit,
    report: Expired,
    recent: Forgets | None,
) -> tuple[int, bool]:
    """Expire the past-retention rows of file `f`; (rows, whether the whole file went)."""
    loc = objects.open_location(f.root)
    try:
        rows = await run_blocking(objects.read_indexed, loc, f)
    except objects.ArchiveMismatch as e:
        raise StoreUnavailable(str(e)) from e
    take = past(rows, f.seq_lo, cutoff)
    if take == 0:
        return 0, False
    through = rows[take - 1].msg.seq
    await limit.take(take)
    if recent is not None:
        await recent.forget_upto(conv_id, through)
    new: ArchiveFile | None = None
    nbytes = 0
    if take < len(rows):
        key = objects.file_key(conv_id, through + 1, f.seq_hi)
        new = ArchiveFile(through + 1, f.seq_hi, f.root, key, conv_id, len(rows) - take)
        nbytes = await run_blocking(objects.write_file, loc, new.key, rows[take:])
    kept = batch_runs(rows[take:]) if new is not None else []
    if not await index.expire_file(conv_id, f, through, new, len(rows) - take, nbytes, kept):
        raise StoreUnavailable("the archive index changed under retention (another run?)")
    await run_blocking(objects.delete_file, loc, f.key)
    report.rows += take
    if new is None:
        report.files_deleted += 1
    else:
        report.files_rewritten += 1
    return take, new is None
