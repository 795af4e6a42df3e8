"""HISTORY and PULL across the boundary between the hot store and the archive.

The stores read the hot rows first, as always. Seqs are gapless from 1 and a
conversation's archive is the run of seqs 1..top (storage/archive/index_sqlite.py), so a hot
page that starts at the lowest seq the reader may see (or that is full) needs nothing
more: only a page that comes up short below its first hot seq (or finds no hot rows at
all) asks the archive index for the files of the missing seqs, one primary-key range
read, and reads those files (slower: a Parquet file each, from object storage).

The reader's bounds (`min_seq`, `max_seq`: membership) are applied to the archived
seqs exactly as to the hot ones, and the archived rows are the rows as they stood
(recalled messages as recalled), so pages keep the same order, recall and membership
rules. A batch archived while a page is read shows up in both reads at most: rows are
merged by seq.

Every file is checked against its index row before a row of it is served (its rows'
conversation, seq range and count: `objects.read_indexed`); a file that differs fails
the page with StoreUnavailable (`unavailable` to the client) and an error log line.

Seqs removed by retention (storage/archive/retain.py) are named by the conversation's
"expired" index row (no file): it is left out here, so no page returns them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import structlog

from storage.archive.index_sqlite import ArchiveFile, run_blocking
from storage.errors import StoreUnavailable
from storage.models import StoredMessage

log = structlog.get_logger("imgw.archive")

Page = tuple[list[StoredMessage], bool]
FilesOf = Callable[[int, int, int], Awaitable[list[ArchiveFile]]]


def _read(files: Sequence[ArchiveFile], lo: int, hi: int) -> list[StoredMessage]:
    from storage.archive import objects

    out: list[StoredMessage] = []
    for f in files:
        loc = objects.open_location(f.root)
        out += [a.msg for a in objects.read_indexed(loc, f) if lo <= a.msg.seq <= hi]
    return out


async def _read_files(files: Sequence[ArchiveFile], lo: int, hi: int) -> list[StoredMessage]:
    """The archived messages lo..hi of `files`; StoreUnavailable when the archive cannot
    be read (object storage down, a file missing) or a file is not what its index row
    says (logged: someone must look): the page is refused, never short or wrong."""
    from storage.archive.objects import ArchiveMismatch

    try:
        return await run_blocking(_read, files, lo, hi)
    except ArchiveMismatch as e:
        _log_mismatch(str(e))
        raise StoreUnavailable(f"archive: {e}") from e
    except (OSError, ValueError) as e:  # pyarrow: OSError for I/O, S3 included
        raise StoreUnavailable(f"archive: {e}") from e


_MISMATCH_LOG_EVERY_S: Final = 60.0
_mismatch_logged: dict[str, float] = {}  # problem -> when it was last logged


def _log_mismatch(problem: str) -> None:
    """An error line per distinct problem a minute: readers retrying a page that names a
    bad file must not flood the log."""
    now = time.monotonic()
    if now - _mismatch_logged.get(problem, -_MISMATCH_LOG_EVERY_S) < _MISMATCH_LOG_EVERY_S:
        return
    if len(_mismatch_logged) >= 1000:
        _mismatch_logged.clear()
    _mismatch_logged[problem] = now
    log.error("archive file does not match its index row; not served", problem=problem)


def _live(files: list[ArchiveFile]) -> list[ArchiveFile]:
    """The files to read: without the expired range (retention), which has no file."""
    return [f for f in files if f.key]


def _merge(older: list[StoredMessage], hot: list[StoredMessage]) -> list[StoredMessage]:
    seen = {m.seq for m in hot}
    return sorted([m for m in older if m.seq not in seen] + hot, key=lambda m: m.seq)


async def read_after(
    conv_id: int,
    lo: int,
    hi: int,
    limit: int,
    hot: Page,
    files_of: FilesOf,
    archived_top: int | None = None,
) -> Page:
    """The first `limit` of seqs lo..hi, given the hot store's answer `hot` (and the
    conversation's highest archived seq, when the store read it with the page)."""
    rows, more = hot
    low = max(lo, 1)
    if limit <= 0 or (rows and rows[0].seq <= low):
        return hot
    if archived_top is not None and archived_top < low:
        return hot
    top = min(hi, rows[0].seq - 1) if rows else hi
    if top < low:
        return hot
    files = _live(await files_of(conv_id, low, top))
    if not files:
        return hot
    # the first limit + 1 archived seqs at most: the files are in seq order
    wanted: list[ArchiveFile] = []
    span = 0
    for f in files:
        wanted.append(f)
        span += min(f.seq_hi, top) - max(f.seq_lo, low) + 1
        if span > limit:
            break
    older = await _read_files(wanted, low, top)
    merged = _merge(older, rows)
    return merged[:limit], more or len(merged) > limit


async def read_before(
    conv_id: int,
    low_bound: int,
    hi: int,
    limit: int,
    hot: Page,
    files_of: FilesOf,
    archived_top: int | None = None,
) -> Page:
    """The last `limit` of seqs low_bound..hi, given the hot store's answer `hot` (and
    the conversation's highest archived seq, as read_after)."""
    rows, more = hot
    low = max(low_bound, 1)
    if limit <= 0 or more or (rows and rows[0].seq <= low):
        return hot
    if archived_top is not None and archived_top < low:
        return hot
    if rows and len(rows) >= limit:
        # seqs low..rows[0].seq - 1 exist (gapless) and none is hot: archived. The page
        # is full, and older ones exist, without opening a file.
        return rows, True
    top = rows[0].seq - 1 if rows else hi
    if top < low:
        return hot
    files = _live(await files_of(conv_id, low, top))
    if not files:
        return hot
    need = limit - len(rows) + 1  # one more than fits: whether older ones exist
    wanted: list[ArchiveFile] = []
    span = 0
    for f in reversed(files):
        wanted.append(f)
        span += min(f.seq_hi, top) - max(f.seq_lo, low) + 1
        if span >= need:
            break
    older = await _read_files(list(reversed(wanted)), low, top)
    merged = _merge(older, rows)
    return merged[-limit:], len(merged) > limit
