"""The archive index, in the store's own database, and the commit that moves a batch.

`im_archive` (created by the store's migration) holds one row per archived batch:
`(conv_id, seq_lo)` -> `seq_hi`, the archive URL and the file's key, its rows and bytes.
A conversation's archived batches are always one contiguous run from seq 1 up: the
mover takes the oldest hot messages first, so every seq at or below the top archived seq
is in the archive and every seq above it is hot.

Crash safety rests on one transaction: the index row and the delete of the hot rows
commit together (`ArchiveIndex.commit`), after the file was written and read back. A
crash before that commit leaves the hot rows and a file no index row names: readers
never open it, and the next run writes the same batch again (overwriting it when the
range is the same). A crash after it leaves the batch archived. So nothing is lost and
nothing is counted twice, wherever the process dies.

The commit re-reads the batch's rows under a write lock (MySQL: `FOR UPDATE`; SQLite:
`BEGIN IMMEDIATE`) and gives up when any row changed since it was read (a recall that
landed meanwhile), or when another mover archived the range first: the next loop reads
the rows again.

Retention (storage/archive/retain.py) deletes a conversation's oldest seqs from both
tiers; the index then holds one "expired" row for them, `(conv_id, 1) -> top expired
seq` with no file (`file_key` ''), so the archived run still starts at seq 1 and every
seq above the index's top is still hot. Readers skip it (storage/archive/tiered.py).

`im_archive_unread` keeps what unread counts need of each archived batch (one row per
file, by its seq_hi, and sender: the seqs of the messages that count; storage/rules.py,
`unread_runs`), written in the same commit and swapped with the file by retention:
SYNC counts a reader's unread messages in the archive from it, without opening a file,
so archiving changes no unread count.

`im_archive_sent` keeps, for the idempotency window (48 h), the send of every archived
client message sent within it, so a retried SEND still gets its original ack (or a
conflict) when its message was archived at once (`--older-than 0s`); the stores'
housekeeping prunes it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from storage.errors import StoreUnavailable
from storage.models import StoredMessage
from storage.rules import UnreadRun, unread_runs
from storage.sqlitethread import SqliteThread

T = TypeVar("T")

SENT_KEEP_MS: Final = 48 * 3600 * 1000  # as im_send_dedup (storage/mysql/store.py)
LAST_RUN_PREFIX: Final = "archive_last_run."

# The files of a conversation overlapping seqs [lo, hi], in seq order: a range of the
# primary key (conv_id, seq_lo). Parameters: conv_id, hi, lo. Rows: `indexed_files`.
FILES_SQL: Final = (
    "SELECT seq_lo, seq_hi, root, file_key, n_rows FROM im_archive "
    "WHERE conv_id={p} AND seq_lo<={p} AND seq_hi>={p} ORDER BY seq_lo"
)
# The unread runs of an archived batch. Parameters: conv_id, seq_hi, then those of a run.
UNREAD_INSERT_SQL: Final = (
    "INSERT INTO im_archive_unread (conv_id, seq_hi, sender_uid, n, first_seq, last_seq, "
    "seqs) VALUES ({p},{p},{p},{p},{p},{p},{p})"
)
# The unread runs of a conversation's files ending above seq `after` (a range of the
# primary key), of senders other than the reader, reaching (after, upto]. Parameters:
# conv_id, after, reader uid, after, upto. Rows: (n, first_seq, last_seq, seqs), for
# `storage.rules.count_in_runs`.
UNREAD_RUNS_SQL: Final = (
    "SELECT n, first_seq, last_seq, seqs FROM im_archive_unread WHERE conv_id={p} "
    "AND seq_hi>{p} AND sender_uid<>{p} AND last_seq>{p} AND first_seq<={p}"
)
# The idempotency record of an archived send. Parameters: sender_uid, client_msg_id.
SENT_SQL: Final = (
    "SELECT conv_id, seq, msg_id, sender_uid, msg_type, content, send_ms, client_msg_id "
    "FROM im_archive_sent WHERE sender_uid={p} AND client_msg_id={p}"
)


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """A message as archived: the stored message and its recall mark (0, or the seq of
    the RECALL that recalled it)."""

    msg: StoredMessage
    recall_seq: int


@dataclass(frozen=True, slots=True)
class ArchiveFile:
    """One archived batch: seqs seq_lo..seq_hi of conversation `conv_id`, `n_rows` rows
    in `key` under `root`, as the index row says. A file is only believed when it holds
    exactly that (storage/archive/objects.py: `read_indexed`)."""

    seq_lo: int
    seq_hi: int
    root: str
    key: str
    conv_id: int
    n_rows: int


def indexed_files(conv_id: int, rows: Sequence[Sequence[Any]]) -> list[ArchiveFile]:
    """The files of FILES_SQL's rows."""
    return [ArchiveFile(int(a), int(b), str(r), str(k), conv_id, int(n)) for a, b, r, k, n in rows]


@dataclass(frozen=True, slots=True)
class Status:
    hot_rows: int
    hot_bytes: int
    oldest_hot_ms: int | None
    archived_rows: int
    archived_bytes: int
    archived_files: int
    archived_conversations: int
    last_run: dict[str, str]


class ArchiveIndex(Protocol):
    """What the mover needs from a store's database."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def now_ms(self) -> int: ...

    async def conversations(self, after: int, limit: int) -> list[int]:
        """Conversation ids above `after`, ascending, at most `limit`."""
        ...

    async def archived_top(self, conv_id: int) -> int:
        """The highest archived seq of the conversation (0: none)."""
        ...

    async def oldest_hot(self, conv_id: int) -> tuple[int, int] | None:
        """(seq, send_ms) of the conversation's oldest hot message."""
        ...

    async def hot_batch(self, conv_id: int, after_seq: int, limit: int) -> list[ArchivedMessage]:
        """The first `limit` hot messages above `after_seq`, ascending."""
        ...

    async def commit(
        self, conv_id: int, rows: Sequence[ArchivedMessage], root: str, key: str, size: int
    ) -> bool:
        """In one transaction: check the rows are still as read and the range is next
        to archive, add the index row, keep the recent sends, delete the hot rows.
        False (nothing changed) when a check failed."""
        ...

    async def files(self, conv_id: int, lo: int, hi: int) -> list[ArchiveFile]: ...

    async def expire_file(
        self,
        conv_id: int,
        old: ArchiveFile,
        through: int,
        new: ArchiveFile | None,
        n_rows: int,
        n_bytes: int,
        runs: Sequence[UnreadRun] = (),
    ) -> bool:
        """Retention, in one transaction: check `old` is the conversation's lowest file
        (just above the expired range, if any), drop its index row (and unread runs),
        extend the expired range to `through`, and index `new` (seqs through+1..
        old.seq_hi, rewritten, with its unread `runs`) if given. False (nothing changed)
        when a check failed."""
        ...

    async def expire_hot(self, conv_id: int, rows: Sequence[ArchivedMessage]) -> bool:
        """Retention, in one transaction: check the rows are still as read, next above
        the index's top and that no file is left, delete them, extend the expired range
        through them. False (nothing changed) when a check failed."""
        ...

    async def status(self) -> Status: ...

    async def set_last_run(self, fields: dict[str, str]) -> None: ...


def _expected(rows: Sequence[ArchivedMessage]) -> list[tuple[int, int, int]]:
    return [(r.msg.seq, r.msg.msg_type, r.recall_seq) for r in rows]


def expected_head(old: ArchiveFile) -> list[tuple[int, int, str]]:
    """The index rows at or below `old.seq_lo` when `old` is next to expire: the
    expired range, if any, then `old`."""
    head = [(old.seq_lo, old.seq_hi, old.key)]
    return head if old.seq_lo == 1 else [(1, old.seq_lo - 1, ""), *head]


def unread_rows(conv_id: int, seq_hi: int, runs: Sequence[UnreadRun]) -> list[tuple[Any, ...]]:
    """UNREAD_INSERT_SQL's parameters for the runs of file `seq_hi`."""
    return [(conv_id, seq_hi, r.sender_uid, r.n, r.first, r.last, r.seqs) for r in runs]


def batch_runs(rows: Sequence[ArchivedMessage]) -> list[UnreadRun]:
    """The unread runs of an archived batch."""
    return unread_runs(r.msg for r in rows)


def _recent_sends(rows: Sequence[ArchivedMessage], now: int) -> list[StoredMessage]:
    return [r.msg for r in rows if r.msg.client_msg_id and r.msg.server_ms > now - SENT_KEEP_MS]


# -- SQLite --------------------------------------------------------------------------------

_I64_MAX = (1 << 63) - 1


def _s(v: int) -> int:
    return v - (1 << 64) if v > _I64_MAX else v


def _u(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


def _signed(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """unread_rows with the sender uid as SQLite stores uids (signed 64 bits)."""
    return [(c, hi, _s(sender), *rest) for c, hi, sender, *rest in rows]


class SqliteIndex:
    """The archive index of an embedded store's database file (another process, the
    gateway, may have it open: SQLite's locks and the busy timeout share it)."""

    def __init__(self, path: str, *, clock: Callable[[], int], busy_timeout_ms: int = 5000):
        self._path = path
        self._clock = clock
        self._busy_ms = busy_timeout_ms
        self._thread = SqliteThread("imgw-archive-sqlite", self._connect)

    def _connect(self) -> sqlite3.Connection:
        from storage.embedded.schema import open_migrated

        if not os.path.exists(self._path):
            raise StoreUnavailable(f"no embedded store at {self._path}")
        return open_migrated(self._path, self._busy_ms)

    async def open(self) -> None:
        await self._thread.open()

    async def close(self) -> None:
        await self._thread.close()

    def now_ms(self) -> int:
        return self._clock()

    async def conversations(self, after: int, limit: int) -> list[int]:
        def q(c: sqlite3.Connection) -> list[int]:
            rows = c.execute(
                "SELECT conv_id FROM im_conv_seq WHERE conv_id>? ORDER BY conv_id LIMIT ?",
                (after, limit),
            ).fetchall()
            return [int(r[0]) for r in rows]

        return await self._thread.call(q)

    async def archived_top(self, conv_id: int) -> int:
        def q(c: sqlite3.Connection) -> int:
            row = c.execute(
                "SELECT MAX(seq_hi) FROM im_archive WHERE conv_id=?", (conv_id,)
            ).fetchone()
            return int(row[0] or 0)

        return await self._thread.call(q)

    async def oldest_hot(self, conv_id: int) -> tuple[int, int] | None:
        def q(c: sqlite3.Connection) -> tuple[int, int] | None:
            row = c.execute(
                "SELECT seq, send_ms FROM im_message WHERE conv_id=? ORDER BY seq LIMIT 1",
                (conv_id,),
            ).fetchone()
            return None if row is None else (int(row[0]), int(row[1]))

        return await self._thread.call(q)

    async def hot_batch(self, conv_id: int, after_seq: int, limit: int) -> list[ArchivedMessage]:
        def q(c: sqlite3.Connection) -> list[ArchivedMessage]:
            rows = c.execute(
                "SELECT conv_id, seq, id, sender_uid, msg_type, content, send_ms, "
                "client_msg_id, recall_seq FROM im_message WHERE conv_id=? AND seq>? "
                "ORDER BY seq LIMIT ?",
                (conv_id, after_seq, limit),
            ).fetchall()
            return [
                ArchivedMessage(
                    StoredMessage(r[0], r[1], r[2], _u(r[3]), r[4], bytes(r[5]), r[6], r[7]),
                    int(r[8] or 0),
                )
                for r in rows
            ]

        return await self._thread.call(q)

    async def commit(
        self, conv_id: int, rows: Sequence[ArchivedMessage], root: str, key: str, size: int
    ) -> bool:
        lo, hi = rows[0].msg.seq, rows[-1].msg.seq
        now = self._clock()
        runs = batch_runs(rows)

        def tx(c: sqlite3.Connection) -> bool:
            found = c.execute(
                "SELECT seq, msg_type, recall_seq FROM im_message "
                "WHERE conv_id=? AND seq BETWEEN ? AND ? ORDER BY seq",
                (conv_id, lo, hi),
            ).fetchall()
            top = c.execute(
                "SELECT MAX(seq_hi) FROM im_archive WHERE conv_id=?", (conv_id,)
            ).fetchone()[0]
            if [tuple(r) for r in found] != _expected(rows) or (top or 0) != lo - 1:
                c.execute("ROLLBACK")
                return False
            c.execute(
                "INSERT INTO im_archive (conv_id, seq_lo, seq_hi, root, file_key, n_rows, "
                "n_bytes, created_ms) VALUES (?,?,?,?,?,?,?,?)",
                (conv_id, lo, hi, root, key, len(rows), size, now),
            )
            c.executemany(
                UNREAD_INSERT_SQL.format(p="?"),
                _signed(unread_rows(conv_id, hi, runs)),
            )
            c.executemany(
                "INSERT OR IGNORE INTO im_archive_sent (sender_uid, client_msg_id, conv_id, "
                "seq, msg_id, msg_type, content, send_ms) VALUES (?,?,?,?,?,?,?,?)",
                [
                    (_s(m.sender_uid), m.client_msg_id, m.conv_id, m.seq, m.msg_id,
                     m.msg_type, m.content, m.server_ms)
                    for m in _recent_sends(rows, now)
                ],
            )  # fmt: skip
            c.execute(
                "DELETE FROM im_message WHERE conv_id=? AND seq BETWEEN ? AND ?",
                (conv_id, lo, hi),
            )
            return True

        return await self._thread.tx(tx)

    def _expired_to(self, c: sqlite3.Connection, conv_id: int, through: int, now: int) -> None:
        c.execute(
            "INSERT INTO im_archive (conv_id, seq_lo, seq_hi, root, file_key, n_rows, n_bytes, "
            "created_ms) VALUES (?, 1, ?, '', '', 0, 0, ?) "
            "ON CONFLICT (conv_id, seq_lo) DO UPDATE SET seq_hi=excluded.seq_hi",
            (conv_id, through, now),
        )

    async def expire_file(
        self, conv_id: int, old: ArchiveFile, through: int, new: ArchiveFile | None,
        n_rows: int, n_bytes: int, runs: Sequence[UnreadRun] = (),
    ) -> bool:  # fmt: skip
        now = self._clock()

        def tx(c: sqlite3.Connection) -> bool:
            head = c.execute(
                "SELECT seq_lo, seq_hi, file_key FROM im_archive WHERE conv_id=? "
                "AND seq_lo<=? ORDER BY seq_lo",
                (conv_id, old.seq_lo),
            ).fetchall()
            if [tuple(r) for r in head] != expected_head(old):
                c.execute("ROLLBACK")
                return False
            c.execute("DELETE FROM im_archive WHERE conv_id=? AND seq_lo=?", (conv_id, old.seq_lo))
            c.execute(
                "DELETE FROM im_archive_unread WHERE conv_id=? AND seq_hi=?",
                (conv_id, old.seq_hi),
            )
            self._expired_to(c, conv_id, through, now)
            if new is not None:
                c.execute(
                    "INSERT INTO im_archive (conv_id, seq_lo, seq_hi, root, file_key, "
                    "n_rows, n_bytes, created_ms) VALUES (?,?,?,?,?,?,?,?)",
                    (conv_id, new.seq_lo, new.seq_hi, new.root, new.key, n_rows, n_bytes,
                     now),
                )  # fmt: skip
                c.executemany(
                    UNREAD_INSERT_SQL.format(p="?"),
                    _signed(unread_rows(conv_id, new.seq_hi, runs)),
                )
            return True

        return await self._thread.tx(tx)

    async def expire_hot(self, conv_id: int, rows: Sequence[ArchivedMessage]) -> bool:
        lo, hi = rows[0].msg.seq, rows[-1].msg.seq
        now = self._clock()

        def tx(c: sqlite3.Connection) -> bool:
            found = c.execute(
                "SELECT seq, msg_type, recall_seq FROM im_message "
                "WHERE conv_id=? AND seq BETWEEN ? AND ? ORDER BY seq",
                (conv_id, lo, hi),
            ).fetchall()
            top, files = c.execute(
                "SELECT MAX(seq_hi), SUM(file_key<>'') FROM im_archive WHERE conv_id=?",
                (conv_id,),
            ).fetchone()
            if (
                [tuple(r) for r in found] != _expected(rows)
                or (top or 0) != lo - 1
                or (files or 0) != 0
            ):
                c.execute("ROLLBACK")
                return False
            c.execute(
                "DELETE FROM im_message WHERE conv_id=? AND seq BETWEEN ? AND ?",
                (conv_id, lo, hi),
            )
            self._expired_to(c, conv_id, hi, now)
            return True

        return await self._thread.tx(tx)

    async def files(self, conv_id: int, lo: int, hi: int) -> list[ArchiveFile]:
        def q(c: sqlite3.Connection) -> list[ArchiveFile]:
            rows = c.execute(FILES_SQL.format(p="?"), (conv_id, hi, lo)).fetchall()
            return indexed_files(conv_id, rows)

        return await self._thread.call(q)

    async def status(self) -> Status:
        def q(c: sqlite3.Connection) -> Status:
            hot, oldest = c.execute("SELECT COUNT(*), MIN(send_ms) FROM im_message").fetchone()
            files, convs, rows, size = c.execute(
                "SELECT COUNT(*), COUNT(DISTINCT conv_id), COALESCE(SUM(n_rows), 0), "
                "COALESCE(SUM(n_bytes), 0) FROM im_archive WHERE file_key<>''"
            ).fetchone()
            last = c.execute(
                "SELECT name, value FROM im_meta WHERE name LIKE ?", (LAST_RUN_PREFIX + "%",)
            ).fetchall()
            db_bytes = sum(
                os.path.getsize(p) for p in (self._path, self._path + "-wal") if os.path.exists(p)
            )
            return Status(
                int(hot), db_bytes, None if oldest is None else int(oldest), int(rows),
                int(size), int(files), int(convs),
                {n[len(LAST_RUN_PREFIX):]: v for n, v in last},
            )  # fmt: skip

        return await self._thread.call(q)

    async def set_last_run(self, fields: dict[str, str]) -> None:
        def tx(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM im_meta WHERE name LIKE ?", (LAST_RUN_PREFIX + "%",))
            c.executemany(
                "INSERT INTO im_meta (name, value) VALUES (?,?)",
                [(LAST_RUN_PREFIX + k, v[:255]) for k, v in fields.items()],
            )

        await self._thread.tx(tx)


# -- MySQL ---------------------------------------------------------------------------------


def run_blocking(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """`fn(*args)` in the default thread pool (file I/O of the archive)."""
    return asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))
