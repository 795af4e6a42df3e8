"""Archive URLs and the Parquet files of archived messages.

Two schemes (storage/objecturl.py reads them):

- `file:///abs/path`: a directory on this machine (the default for the embedded store:
  `<data-dir>/archive`);
- `s3://bucket/prefix?endpoint=http://host:9000&region=us-east-1`: S3 or an
  S3-compatible store (MinIO, Ceph), through pyarrow's S3 filesystem. Credentials are
  never part of the URL (it is stored in the archive index): the usual AWS sources
  (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, profiles, instance roles) apply.

A conversation's messages go to `<prefix>/conv_id=<n>/<seq_lo>-<seq_hi>.parquet`, one file
per batch, holding every column of the hot row (recalled messages as recalled). Every
function here blocks: callers run them in a thread.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from storage.archive.index_sqlite import ArchivedMessage, ArchiveFile
from storage.models import StoredMessage
from storage.objecturl import FileUrl, parse_object_url

SCHEMA: Final = pa.schema(
    [
        ("conv_id", pa.uint64()),
        ("seq", pa.uint64()),
        ("msg_id", pa.uint64()),
        ("sender_uid", pa.uint64()),
        ("msg_type", pa.uint8()),
        ("content", pa.binary()),
        ("server_ms", pa.int64()),
        ("client_msg_id", pa.string()),
        ("recall_seq", pa.uint64()),  # 0, or the seq of the RECALL that recalled it
    ]
)


class ArchiveUrlError(ValueError):
    """An archive URL this build cannot open."""


@dataclass(frozen=True)
class Location:
    """Where an archive lives: a pyarrow filesystem and the base path in it."""

    url: str
    fs: Any  # pyarrow.fs.FileSystem (untyped library)
    base: str

    def path(self, key: str) -> str:
        return f"{self.base.rstrip('/')}/{key}"


def file_key(conv_id: int, seq_lo: int, seq_hi: int) -> str:
    """The key (relative to the archive's base) of a batch's file."""
    return f"conv_id={conv_id}/{seq_lo}-{seq_hi}.parquet"


_locations: dict[str, Location] = {}
_lock = threading.Lock()


def open_location(url: str) -> Location:
    """The location of an archive URL (filesystems are cached per URL)."""
    with _lock:
        loc = _locations.get(url)
        if loc is None:
            loc = _locations[url] = _open(url)
        return loc


def _open(url: str) -> Location:
    where = parse_object_url(url, "archive", ArchiveUrlError)
    if isinstance(where, FileUrl):
        return Location(url, pafs.LocalFileSystem(), where.root)
    kwargs: dict[str, Any] = {}
    if where.endpoint:
        kwargs["endpoint_override"] = where.endpoint
    if where.region:
        kwargs["region"] = where.region
    try:
        fs = pafs.S3FileSystem(**kwargs)
    except (ValueError, OSError) as e:
        raise ArchiveUrlError(f"cannot open {url!r}: {e}") from e
    base = f"{where.bucket}/{where.prefix}" if where.prefix else where.bucket
    return Location(url, fs, base)


def _table(rows: Sequence[ArchivedMessage]) -> pa.Table:
    return pa.table(
        {
            "conv_id": [r.msg.conv_id for r in rows],
            "seq": [r.msg.seq for r in rows],
            "msg_id": [r.msg.msg_id for r in rows],
            "sender_uid": [r.msg.sender_uid for r in rows],
            "msg_type": [r.msg.msg_type for r in rows],
            "content": [r.msg.content for r in rows],
            "server_ms": [r.msg.server_ms for r in rows],
            "client_msg_id": [r.msg.client_msg_id for r in rows],
            "recall_seq": [r.recall_seq for r in rows],
        },
        schema=SCHEMA,
    )


def write_file(loc: Location, key: str, rows: Sequence[ArchivedMessage]) -> int:
    """Write `rows` to `key` (replacing a file left there by an interrupted run), read it
    back and check it holds exactly these rows; the file's size in bytes. Raises OSError
    (or ValueError when the read-back differs) and then the hot rows must stay."""
    path = loc.path(key)
    if isinstance(loc.fs, pafs.LocalFileSystem):  # S3 has no directories (nor markers)
        loc.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(_table(rows), path, filesystem=loc.fs, compression="zstd")
    if isinstance(loc.fs, pafs.LocalFileSystem):
        _fsync(path)  # on disk before the index row commits: a power cut keeps it too
    back = read_file(loc, key)
    if len(back) != len(rows):
        raise ValueError(f"{path}: read back {len(back)} rows, wrote {len(rows)}")
    if [(b.msg, b.recall_seq) for b in back] != [(r.msg, r.recall_seq) for r in rows]:
        raise ValueError(f"{path}: read back differs from what was written")
    size: int = loc.fs.get_file_info(path).size
    return size


def _fsync(path: str) -> None:
    """Flush a local file, its entry in its directory (`conv_id=<n>`) and that
    directory's entry in the archive's directory to disk."""
    conv_dir = os.path.dirname(path)
    for target in (path, conv_dir, os.path.dirname(conv_dir)):
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ArchiveMismatch(ValueError):
    """A file that does not hold what its index row says: another conversation's rows,
    other seqs, or another number of rows (a file replaced, truncated or mixed up). It
    is never served."""


def check_rows(f: ArchiveFile, rows: Sequence[ArchivedMessage]) -> None:
    """Raise ArchiveMismatch unless `rows` (in seq order) are exactly the index row's:
    `f.n_rows` rows, each of conversation `f.conv_id`, distinct seqs from `f.seq_lo` to
    `f.seq_hi`."""
    where = f"archive file {f.key} (conversation {f.conv_id}, seqs {f.seq_lo}-{f.seq_hi})"
    if len(rows) != f.n_rows:
        raise ArchiveMismatch(f"{where}: {len(rows)} rows, the index says {f.n_rows}")
    others = {r.msg.conv_id for r in rows} - {f.conv_id}
    if others:
        raise ArchiveMismatch(f"{where}: holds rows of conversation {min(others)}")
    seqs = [r.msg.seq for r in rows]
    if seqs and (seqs[0] != f.seq_lo or seqs[-1] != f.seq_hi):
        raise ArchiveMismatch(f"{where}: holds seqs {seqs[0]}-{seqs[-1]}")
    if any(a == b for a, b in itertools.pairwise(seqs)):  # sorted by read_file
        raise ArchiveMismatch(f"{where}: a seq appears twice")


def read_indexed(loc: Location, f: ArchiveFile) -> list[ArchivedMessage]:
    """Every row of the file an index row names, in seq order, checked against that row
    (`check_rows`): OSError when it cannot be read, ArchiveMismatch when it is not the
    file the index names."""
    rows = read_file(loc, f.key)
    check_rows(f, rows)
    return rows


def read_file(loc: Location, key: str) -> list[ArchivedMessage]:
    """Every row of one archive file, in seq order, unchecked (`read_indexed` checks
    them against the index)."""
    table = pq.read_table(loc.path(key), filesystem=loc.fs, schema=SCHEMA)
    cols = table.to_pydict()
    out = [
        ArchivedMessage(
            StoredMessage(conv, seq, mid, sender, mtype, content, ms, cmid or ""), recall
        )
        for conv, seq, mid, sender, mtype, content, ms, cmid, recall in zip(
            cols["conv_id"], cols["seq"], cols["msg_id"], cols["sender_uid"],
            cols["msg_type"], cols["content"], cols["server_ms"], cols["client_msg_id"],
            cols["recall_seq"], strict=True,
        )
    ]  # fmt: skip
    out.sort(key=lambda a: a.msg.seq)
    return out


def delete_file(loc: Location, key: str) -> None:
    """Delete one archive file (retention; a file no index row names any more). Missing
    already: nothing to do."""
    with contextlib.suppress(FileNotFoundError):
        loc.fs.delete_file(loc.path(key))
