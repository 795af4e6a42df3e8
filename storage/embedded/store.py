"""The embedded ChatStore: SQLite in WAL mode with synchronous=FULL.

All writes run on one writer thread (one connection, explicit transactions), reads on one
reader thread with its own connection, and WAL checkpoints on a third (each a
`storage.sqlitethread.SqliteThread`), so the event loop never blocks on SQLite and a
commit never waits behind a slow read. Being the only writer, the store keeps the seq
counters and the member lists in memory and updates them after each commit.
"""

from __future__ import annotations

import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import msgpack

from protocol.ops import ConvKind, MsgType
from storage.archive import tiered
from storage.archive.index_sqlite import (
    FILES_SQL,
    SENT_KEEP_MS,
    SENT_SQL,
    UNREAD_RUNS_SQL,
    ArchiveFile,
    indexed_files,
)
from storage.badges import BadgeCounts
from storage.embedded import push
from storage.embedded.schema import connect, open_migrated
from storage.hooks import DONE_KEYS_PER_QUERY, HOOK_BACKLOG_CAP, batches, hook_values
from storage.membership import plan_change, shown_up_sql, start_read_seq
from storage.models import (
    AppendResult,
    Conversation,
    HookRow,
    Membership,
    MembershipChange,
    NewMessage,
    PushDevice,
    RecallResult,
    RecallStatus,
    SentRecord,
    StoredMessage,
    SyncPage,
    SyncRow,
    SystemEvent,
)
from storage.rules import (
    UNREAD_TYPES_SQL,
    RecallTarget,
    SendKey,
    append_results,
    count_in_runs,
    plan_append,
    recall_content,
    recall_refusal,
)
from storage.snowflake import Snowflake
from storage.sqlitethread import SqliteThread, transaction

T = TypeVar("T")
# One result row. Any: its values are what SQLite holds in the columns the query selected
# (int, str, bytes, None); each reader converts them itself.
Row = Sequence[Any]

_MSG_COLS = "conv_id, seq, id, sender_uid, msg_type, content, send_ms, client_msg_id"
# hooks_backlog: the rows pending, counted up to the cap (a bounded walk of an index);
# the oldest row's time, as each node's first entry in the (node, created_ms) index,
# the nodes found one index search each (SQLite has no loose index scan of its own).
_HOOK_COUNT_SQL: Final = "SELECT COUNT(*) FROM (SELECT 1 FROM im_hook LIMIT ?) AS pending"
_HOOK_OLDEST_SQL: Final = """
WITH RECURSIVE nodes(node) AS (
  SELECT MIN(node) FROM im_hook
  UNION ALL
  SELECT (SELECT h.node FROM im_hook h WHERE h.node > nodes.node ORDER BY h.node LIMIT 1)
  FROM nodes WHERE nodes.node IS NOT NULL
)
SELECT MIN((SELECT MIN(h.created_ms) FROM im_hook h WHERE h.node = nodes.node))
FROM nodes WHERE nodes.node IS NOT NULL
"""


_I64_MAX = (1 << 63) - 1
CHECKPOINT_EVERY_S = 0.5
BACKSTOP_CHECKPOINT_PAGES = 16_384  # 64 MiB of WAL: the writer checkpoints itself


def _s(uid: int) -> int:
    """A u64 id as the signed 64-bit integer SQLite stores (a bijection; order is not kept,
    which no query needs for uids)."""
    return uid - (1 << 64) if uid > _I64_MAX else uid


def _u(value: int) -> int:
    """The u64 id back from its stored form."""
    return value + (1 << 64) if value < 0 else value


def _msg(row: Row) -> StoredMessage:
    return StoredMessage(row[0], row[1], row[2], _u(row[3]), row[4], bytes(row[5]), row[6], row[7])


def _now_ms() -> int:
    return int(time.time() * 1000)


MEMBER_CACHE_ROWS: Final = 500_000  # member rows cached at most (~100 B each)
SEQ_CACHE_MAX: Final = 200_000  # conversations whose max seq the writer keeps in memory


class _Members:
    """A conversation's member rows, current and former, in join order."""

    __slots__ = ("rows",)

    def __init__(self, rows: dict[int, Membership]) -> None:
        self.rows = rows

    def active(self) -> list[int]:
        return [uid for uid, m in self.rows.items() if m.left_seq is None]


class EmbeddedStore:
    # One writer thread: a second batch gathers while one commits; more would only
    # queue smaller batches behind it.
    commit_slots = 2

    def __init__(
        self,
        path: str,
        *,
        ids: Snowflake | None = None,
        busy_timeout_ms: int = 5000,
        clock: Callable[[], int] = _now_ms,
    ):
        self._path = path
        self._busy_ms = busy_timeout_ms
        self._clock = clock
        self._ids = ids or Snowflake(0)
        self._writer = SqliteThread("imgw-sqlite-w", self._open_writer, transaction=self._tx)
        self._reader = SqliteThread("imgw-sqlite-r", self._open_reader)
        self._checkpointer = SqliteThread("imgw-sqlite-ckpt", self._open_checkpointer)
        self._ckpt_due = 0.0  # writer thread: when the next checkpoint may be asked for
        self._ckpt_running = False
        self._seqs: dict[int, int] = {}  # writer thread only
        self._badges = BadgeCounts()  # push badges' last counts (storage/badges.py)
        self._seq_undo: dict[int, int | None] = {}  # this transaction's seqs before it
        # Member rows of recently used conversations (event loop only), least recently
        # used first, at most MEMBER_CACHE_ROWS rows in all.
        self._members: OrderedDict[int, _Members] = OrderedDict()
        self._member_rows = 0
        self._member_writes = 0  # membership writes so far: a read racing one is not cached
        self._hook_node = ""  # set: every message written gets a hook row of this node

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        await self._writer.open()
        await self._reader.open()
        if self._path != ":memory:":
            await self._checkpointer.open()

    def _open_writer(self) -> sqlite3.Connection:
        conn = open_migrated(self._path, self._busy_ms)
        if self._path != ":memory:":
            conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_CHECKPOINT_PAGES}")
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        conn = connect(self._path, self._busy_ms)
        conn.execute("PRAGMA query_only=ON")
        return conn

    def _open_checkpointer(self) -> sqlite3.Connection:
        return connect(self._path, self._busy_ms)

    async def close(self) -> None:
        await self._writer.close()
        await self._reader.close()
        await self._checkpointer.close()

    def now_ms(self) -> int:
        return self._clock()

    async def maintain(self) -> None:
        """The idempotency records are the message rows themselves; those of archived
        messages (im_archive_sent) go once past the window."""

        def body(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM im_archive_sent WHERE send_ms < ?", (self._clock() - SENT_KEEP_MS,)
            )

        await self._writer.tx(body)

    def durability(self) -> dict[str, str]:
        return {"engine": "sqlite", "journal_mode": "wal", "synchronous": "full"}

    def outbox(self) -> None:
        """None: one process holds the embedded store, so its fan-out dies with it."""
        return None

    def _tx(self, conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
        """On the writer thread: `body` in one write transaction (`transaction`), the seqs
        it handed out given back if it rolls back."""
        self._seq_undo = {}
        try:
            result = transaction(conn, body)
        except BaseException:
            for conv_id, before in self._seq_undo.items():
                if before is None:
                    self._seqs.pop(conv_id, None)
                else:
                    self._seqs[conv_id] = before
            raise
        if len(self._seqs) > SEQ_CACHE_MAX:  # committed, so im_conv_seq holds them all
            self._seqs.clear()
        self._ask_checkpoint()  # after the commit: nothing here may fail the transaction
        return result

    def _ask_checkpoint(self) -> None:
        """Writer thread, after a commit: at most every CHECKPOINT_EVERY_S, have the
        checkpointer thread copy the WAL back into the database (PASSIVE: it blocks no
        reader or writer). The writer's own auto-checkpoint, which stalls a commit for
        tens of ms every ~4 MB of WAL, is only the backstop."""
        now = time.monotonic()
        if self._checkpointer.conn is None or self._ckpt_running or now < self._ckpt_due:
            return
        self._ckpt_due = now + CHECKPOINT_EVERY_S
        self._ckpt_running = True
        try:
            self._checkpointer.submit(self._checkpoint)
        except RuntimeError:  # closing: the checkpointer is shut down
            self._ckpt_running = False

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            pass  # busy or closing: the next one (or the backstop) catches up
        finally:
            self._ckpt_running = False

    # -- writer-thread helpers ----------------------------------------------------------

    def _next_seq(self, conn: sqlite3.Connection, conv_id: int) -> int:
        cur = self._seqs.get(conv_id)
        if conv_id not in self._seq_undo:
            self._seq_undo[conv_id] = cur
        if cur is None:
            row = conn.execute(
                "SELECT max_seq FROM im_conv_seq WHERE conv_id=?", (conv_id,)
            ).fetchone()
            cur = row[0] if row else 0
        self._seqs[conv_id] = cur + 1
        return cur + 1

    def _new(
        self,
        conn: sqlite3.Connection,
        conv_id: int,
        sender: int,
        msg_type: int,
        content: bytes,
        client_msg_id: str,
        now: int,
    ) -> StoredMessage:
        """The next message of the conversation, not written yet (see _write)."""
        seq = self._next_seq(conn, conv_id)
        return StoredMessage(
            conv_id, seq, self._ids.next_id(now), sender, msg_type, content, now, client_msg_id
        )

    def _write(self, conn: sqlite3.Connection, msgs: Sequence[StoredMessage], now: int) -> None:
        """Insert messages (in seq order per conversation), their hook rows when hooks
        are on, and raise each conversation's max_seq once: a statement each, run by
        SQLite's own loop, whatever the batch size. Every message a transaction stores
        is written here."""
        conn.executemany(
            f"INSERT INTO im_message ({_MSG_COLS}) VALUES (?,?,?,?,?,?,?,?)",
            [
                (m.conv_id, m.seq, m.msg_id, _s(m.sender_uid), m.msg_type, m.content, m.server_ms,
                 m.client_msg_id)
                for m in msgs
            ],
        )  # fmt: skip
        if node := self._hook_node:
            conn.executemany(
                "INSERT INTO im_hook (conv_id, seq, node, created_ms) VALUES (?,?,?,?)",
                hook_values(msgs, node),
            )
        top: dict[int, int] = {}
        for m in msgs:
            top[m.conv_id] = max(m.seq, top.get(m.conv_id, 0))
        conn.executemany(
            "INSERT INTO im_conv_seq (conv_id, max_seq, last_active_ms) VALUES (?,?,?) "
            "ON CONFLICT(conv_id) DO UPDATE SET max_seq=excluded.max_seq, "
            "last_active_ms=MAX(last_active_ms, excluded.last_active_ms)",
            [(conv_id, seq, now) for conv_id, seq in top.items()],
        )

    def _system(
        self, conn: sqlite3.Connection, conv_id: int, event: SystemEvent, now: int
    ) -> StoredMessage:
        content = msgpack.packb(event, use_bin_type=True)
        msg = self._new(conn, conv_id, 0, MsgType.SYSTEM, content, "", now)
        self._write(conn, [msg], now)
        return msg

    # -- conversations and members --------------------------------------------------------

    async def get_conversation(self, conv_id: int) -> Conversation | None:
        if conv_id > _I64_MAX:
            return None  # conv_ids are allocated by SQLite: never this large

        def q(conn: sqlite3.Connection) -> Conversation | None:
            row = conn.execute(
                "SELECT conv_id, kind, title, owner_uid, created_ms FROM im_conversation "
                "WHERE conv_id=?",
                (conv_id,),
            ).fetchone()
            return Conversation(row[0], row[1], row[2], _u(row[3]), row[4]) if row else None

        return await self._reader.call(q)

    async def _load_members(self, conv_id: int) -> _Members:
        cached = self._members.get(conv_id)
        if cached is not None:
            self._members.move_to_end(conv_id)
            return cached
        if conv_id > _I64_MAX:
            return _Members({})
        gen = self._member_writes

        def q(conn: sqlite3.Connection) -> list[tuple[int, int, int | None]]:
            return conn.execute(
                "SELECT uid, joined_seq, left_seq FROM im_conv_member WHERE conv_id=? "
                "ORDER BY joined_seq, pos",
                (conv_id,),
            ).fetchall()

        rows = await self._reader.call(q)
        members = _Members(
            {_u(uid): Membership(conv_id, _u(uid), j, left) for uid, j, left in rows}
        )
        if rows and self._member_writes == gen and conv_id not in self._members:
            self._members[conv_id] = members  # no write raced this read
            self._member_rows += len(rows)
            while self._member_rows > MEMBER_CACHE_ROWS:
                _, old = self._members.popitem(last=False)
                self._member_rows -= len(old.rows)
        return members

    def _invalidate_members(self, conv_id: int) -> None:
        gone = self._members.pop(conv_id, None)
        if gone is not None:
            self._member_rows -= len(gone.rows)
        self._member_writes += 1

    async def get_membership(self, conv_id: int, uid: int) -> Membership | None:
        return (await self._load_members(conv_id)).rows.get(uid)

    async def member_uids(self, conv_id: int) -> list[int]:
        return (await self._load_members(conv_id)).active()

    async def find_p2p(self, a: int, b: int) -> int | None:
        lo, hi = min(a, b), max(a, b)

        def q(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "SELECT conv_id FROM im_conversation WHERE kind=? AND p2p_lo=? AND p2p_hi=?",
                (ConvKind.P2P, _s(lo), _s(hi)),
            ).fetchone()
            return None if row is None else int(row[0])

        return await self._reader.call(q)

    async def open_p2p(self, a: int, b: int) -> int:
        lo, hi = min(a, b), max(a, b)

        def body(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT conv_id FROM im_conversation WHERE kind=? AND p2p_lo=? AND p2p_hi=?",
                (ConvKind.P2P, _s(lo), _s(hi)),
            ).fetchone()
            if row:
                return int(row[0])
            now = self._clock()
            cur = conn.execute(
                "INSERT INTO im_conversation (kind, p2p_lo, p2p_hi, created_ms) VALUES (?,?,?,?)",
                (ConvKind.P2P, _s(lo), _s(hi), now),
            )
            conv_id = int(cur.lastrowid or 0)
            conn.execute(
                "INSERT INTO im_conv_seq (conv_id, max_seq, last_active_ms) VALUES (?,0,?)",
                (conv_id, now),
            )
            conn.executemany(
                "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, updated_ms)"
                " VALUES (?,?,?,1,0,?)",
                [(conv_id, _s(lo), 0, now), (conv_id, _s(hi), 1, now)],
            )
            return conv_id

        conv_id = await self._writer.tx(body)
        self._invalidate_members(conv_id)
        return conv_id

    async def create_group(
        self, owner: int, title: str, uids: Sequence[int]
    ) -> tuple[int, StoredMessage]:
        members = list(dict.fromkeys([owner, *uids]))

        def body(conn: sqlite3.Connection) -> tuple[int, StoredMessage]:
            now = self._clock()
            cur = conn.execute(
                "INSERT INTO im_conversation (kind, title, owner_uid, created_ms) VALUES (?,?,?,?)",
                (ConvKind.GROUP, title, _s(owner), now),
            )
            conv_id = int(cur.lastrowid or 0)
            event: SystemEvent = {"event": "created", "by": owner, "uids": members, "title": title}
            msg = self._system(conn, conv_id, event, now)
            conn.executemany(
                "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, updated_ms)"
                " VALUES (?,?,?,?,?,?)",
                [
                    (conv_id, _s(u), i, msg.seq, start_read_seq(i, msg.seq), now)
                    for i, u in enumerate(members)
                ],
            )
            return conv_id, msg

        conv_id, msg = await self._writer.tx(body)
        self._invalidate_members(conv_id)
        return conv_id, msg

    async def change_members(
        self,
        conv_id: int,
        by: int,
        add: Sequence[int],
        remove: Sequence[int],
        *,
        max_members: int = 1000,
    ) -> MembershipChange:
        def body(conn: sqlite3.Connection) -> MembershipChange:
            now = self._clock()
            rows = conn.execute(
                "SELECT uid FROM im_conv_member WHERE conv_id=? AND left_seq IS NULL "
                "ORDER BY joined_seq, pos",
                (conv_id,),
            ).fetchall()
            owner = conn.execute(
                "SELECT owner_uid FROM im_conversation WHERE conv_id=?", (conv_id,)
            ).fetchone()[0]
            plan = plan_change(
                [_u(r[0]) for r in rows], _u(owner), by, add, remove, max_members=max_members
            )
            out: list[StoredMessage] = []
            for event, uids in plan.events:
                msg = self._system(conn, conv_id, {"event": event, "by": by, "uids": uids}, now)
                out.append(msg)
                if event == "added":
                    conn.executemany(
                        "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, left_seq, "
                        "left_ms, read_seq, updated_ms) VALUES (?,?,?,?,NULL,NULL,?,?) "
                        "ON CONFLICT(conv_id, uid) DO UPDATE SET pos=excluded.pos, "
                        "joined_seq=excluded.joined_seq, left_seq=NULL, left_ms=NULL, "
                        "read_seq=excluded.read_seq, updated_ms=excluded.updated_ms",
                        [
                            (conv_id, _s(u), i, msg.seq, msg.seq - 1, now)
                            for i, u in enumerate(uids)
                        ],
                    )
                else:
                    conn.executemany(
                        "UPDATE im_conv_member SET left_seq=?, left_ms=?, updated_ms=? "
                        "WHERE conv_id=? AND uid=?",
                        [(msg.seq, now, now, conv_id, _s(u)) for u in uids],
                    )
            if plan.owner_changed:
                conn.execute(
                    "UPDATE im_conversation SET owner_uid=? WHERE conv_id=?",
                    (_s(plan.owner), conv_id),
                )
            return MembershipChange(out, plan.owner)

        change = await self._writer.tx(body)
        self._invalidate_members(conv_id)
        return change

    async def set_title(self, conv_id: int, by: int, title: str) -> StoredMessage | None:
        def body(conn: sqlite3.Connection) -> StoredMessage | None:
            row = conn.execute(
                "SELECT owner_uid FROM im_conversation WHERE conv_id=? AND kind=?",
                (conv_id, ConvKind.GROUP),
            ).fetchone()
            if row is None or _u(row[0]) != by:
                return None
            now = self._clock()
            conn.execute("UPDATE im_conversation SET title=? WHERE conv_id=?", (title, conv_id))
            event: SystemEvent = {"event": "titled", "by": by, "uids": [], "title": title}
            return self._system(conn, conv_id, event, now)

        if conv_id > _I64_MAX:
            return None
        return await self._writer.tx(body)

    # -- messages ------------------------------------------------------------------------

    async def append(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        def body(conn: sqlite3.Connection) -> list[AppendResult]:
            now = self._clock()
            members = self._current_members(conn, {m.conv_id for m in batch})
            sent: dict[SendKey, StoredMessage] = {}
            for m in batch:
                key = (m.sender_uid, m.client_msg_id)
                if key not in sent and (found := self._find_sent(conn, *key)) is not None:
                    sent[key] = found
            plan = plan_append(batch, sent, members)
            stored: dict[int, StoredMessage] = {}
            for i in plan.store:
                m = batch[i]
                stored[i] = self._new(
                    conn, m.conv_id, m.sender_uid, m.msg_type, m.content, m.client_msg_id, now
                )
            if stored:
                self._write(conn, list(stored.values()), now)
            return append_results(batch, plan, sent, stored, members)

        return await self._writer.tx(body)

    @staticmethod
    def _current_members(conn: sqlite3.Connection, conv_ids: set[int]) -> dict[int, list[int]]:
        ids = [c for c in conv_ids if c <= _I64_MAX]
        out: dict[int, list[int]] = {}
        if not ids:
            return out
        rows = conn.execute(
            f"SELECT conv_id, uid FROM im_conv_member WHERE conv_id IN ({','.join('?' * len(ids))})"
            " AND left_seq IS NULL ORDER BY conv_id, joined_seq, pos",
            ids,
        ).fetchall()
        for conv_id, uid in rows:
            out.setdefault(conv_id, []).append(_u(uid))
        return out

    @staticmethod
    def _find_sent(conn: sqlite3.Connection, sender: int, cmid: str) -> StoredMessage | None:
        # `client_msg_id <> ''` lets SQLite use the partial index im_message_dedup: it takes a
        # partial index only when the WHERE implies the index's own condition. Without it
        # every SEND scanned the whole message table. Client ids are never empty.
        row = conn.execute(
            f"SELECT {_MSG_COLS} FROM im_message "
            "WHERE sender_uid=? AND client_msg_id=? AND client_msg_id <> ''",
            (_s(sender), cmid),
        ).fetchone()
        if row is None:  # archived within the idempotency window (storage/archive)
            row = conn.execute(SENT_SQL.format(p="?"), (_s(sender), cmid)).fetchone()
        return _msg(row) if row else None

    async def find_sent(self, sender_uid: int, client_msg_id: str) -> SentRecord | None:
        def q(conn: sqlite3.Connection) -> StoredMessage | None:
            return self._find_sent(conn, sender_uid, client_msg_id)

        msg = await self._reader.call(q)
        return None if msg is None else SentRecord.of(msg)

    async def read_after(
        self, conv_id: int, after_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        lo = min(max(after_seq + 1, min_seq), _I64_MAX)  # client seqs may be any u64
        hi = max_seq if max_seq is not None else _I64_MAX

        def q(conn: sqlite3.Connection) -> list[Row]:
            return conn.execute(
                f"SELECT {_MSG_COLS} FROM im_message WHERE conv_id=? AND seq BETWEEN ? AND ? "
                "ORDER BY seq LIMIT ?",
                (conv_id, lo, hi, limit + 1),
            ).fetchall()

        rows = await self._reader.call(q)
        hot = [_msg(r) for r in rows[:limit]], len(rows) > limit
        return await tiered.read_after(conv_id, lo, hi, limit, hot, self._archived)

    async def _archived(self, conv_id: int, lo: int, hi: int) -> list[ArchiveFile]:
        """The archive files holding seqs lo..hi of the conversation (storage/archive)."""

        def q(conn: sqlite3.Connection) -> list[ArchiveFile]:
            rows = conn.execute(
                FILES_SQL.format(p="?"), (conv_id, min(hi, _I64_MAX), lo)
            ).fetchall()
            return indexed_files(conv_id, rows)

        return await self._reader.call(q)

    async def read_before(
        self, conv_id: int, before_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        hi = _I64_MAX if before_seq == 0 else min(before_seq - 1, _I64_MAX)
        if max_seq is not None:
            hi = min(hi, max_seq)

        def q(conn: sqlite3.Connection) -> list[Row]:
            return conn.execute(
                f"SELECT {_MSG_COLS} FROM im_message WHERE conv_id=? AND seq BETWEEN ? AND ? "
                "ORDER BY seq DESC LIMIT ?",
                (conv_id, min_seq, hi, limit + 1),
            ).fetchall()

        rows = await self._reader.call(q)
        hot = [_msg(r) for r in reversed(rows[:limit])], len(rows) > limit
        return await tiered.read_before(conv_id, min_seq, hi, limit, hot, self._archived)

    async def recall(
        self, conv_id: int, seq: int, by: int, *, window_ms: int, min_seq: int
    ) -> RecallResult:
        def body(conn: sqlite3.Connection) -> RecallResult:
            now = self._clock()
            row = conn.execute(
                "SELECT sender_uid, msg_type, send_ms, recall_seq FROM im_message "
                "WHERE conv_id=? AND seq=?",
                (conv_id, min(seq, _I64_MAX)),
            ).fetchone()
            target = None
            if row is not None:
                sender, msg_type, send_ms, recall_seq = row
                target = RecallTarget(_u(sender), msg_type, send_ms, recall_seq or 0)
            refusal = recall_refusal(
                target, seq, by, now_ms=now, window_ms=window_ms, min_seq=min_seq
            )
            if refusal is not None:
                return refusal
            msg = self._new(conn, conv_id, by, MsgType.RECALL, recall_content(seq), "", now)
            self._write(conn, [msg], now)
            conn.execute(
                "UPDATE im_message SET msg_type=?, content=x'', recall_seq=? "
                "WHERE conv_id=? AND seq=?",
                (MsgType.RECALL, msg.seq, conv_id, seq),
            )
            return RecallResult(RecallStatus.RECALLED, msg.seq, msg)

        return await self._writer.tx(body)

    # -- positions and sync -----------------------------------------------------------------

    async def set_read(self, conv_id: int, uid: int, seq: int) -> int | None:
        def body(conn: sqlite3.Connection) -> int | None:
            target = min(seq, self._max_seq(conn, conv_id))
            cur = conn.execute(
                "UPDATE im_conv_member SET read_seq=?, updated_ms=? "
                "WHERE conv_id=? AND uid=? AND read_seq<? AND left_seq IS NULL",
                (target, self._clock(), conv_id, _s(uid), target),
            )
            return target if cur.rowcount else None

        return await self._writer.tx(body)

    async def set_delivered(self, conv_id: int, uid: int, device: str, seq: int) -> int | None:
        def body(conn: sqlite3.Connection) -> int | None:
            target = min(seq, self._max_seq(conn, conv_id))
            if target <= 0:
                return None
            cur = conn.execute(
                "INSERT INTO im_delivered (uid, device, conv_id, seq, updated_ms) "
                "VALUES (?,?,?,?,?) ON CONFLICT(uid, device, conv_id) DO UPDATE SET "
                "seq=excluded.seq, updated_ms=excluded.updated_ms WHERE seq<excluded.seq",
                (_s(uid), device, conv_id, target, self._clock()),
            )
            return target if cur.rowcount else None

        return await self._writer.tx(body)

    def _max_seq(self, conn: sqlite3.Connection, conv_id: int) -> int:
        cur = self._seqs.get(conv_id)
        if cur is not None:
            return cur
        row = conn.execute("SELECT max_seq FROM im_conv_seq WHERE conv_id=?", (conv_id,)).fetchone()
        return int(row[0]) if row else 0

    async def sync(
        self,
        uid: int,
        device: str,
        *,
        changed_since_ms: int,
        after: tuple[int, int] | None,
        limit: int,
    ) -> SyncPage:
        a_active, a_conv = after if after is not None else ((1 << 62), 0)
        sql = f"""
        SELECT conv_id, kind, max_seq, read_seq, delivered_seq, last_active, is_member,
          (SELECT COUNT(*) FROM im_message x WHERE x.conv_id = r.conv_id
             AND x.seq > r.read_seq AND x.seq <= r.max_seq AND x.sender_uid <> ?
             AND {UNREAD_TYPES_SQL}) AS unread
        FROM (
          SELECT m.conv_id AS conv_id, c.kind AS kind,
            COALESCE(m.left_seq, s.max_seq) AS max_seq, m.read_seq AS read_seq,
            COALESCE(d.seq, 0) AS delivered_seq,
            COALESCE(m.left_ms, s.last_active_ms) AS last_active,
            (m.left_seq IS NULL) AS is_member,
            MAX(COALESCE(m.left_ms, s.last_active_ms), m.updated_ms,
                COALESCE(d.updated_ms, 0)) AS changed
          FROM im_conv_member m
          JOIN im_conversation c ON c.conv_id = m.conv_id
          JOIN im_conv_seq s ON s.conv_id = m.conv_id
          LEFT JOIN im_delivered d
            ON d.uid = m.uid AND d.device = ? AND d.conv_id = m.conv_id
          WHERE m.uid = ?
        ) r
        WHERE changed >= ? AND (last_active < ? OR (last_active = ? AND conv_id < ?))
        ORDER BY last_active DESC, conv_id DESC
        LIMIT ?
        """
        su = _s(uid)
        params = (su, device, su, changed_since_ms, a_active, a_active, a_conv, limit + 1)
        runs_sql = UNREAD_RUNS_SQL.format(p="?")

        def q(conn: sqlite3.Connection) -> tuple[list[Row], dict[int, int]]:
            # one snapshot: an archive commit between the hot count and the archived
            # one would count its batch twice, or not at all
            conn.execute("BEGIN")
            try:
                rows = conn.execute(sql, params).fetchall()
                archived = {}
                for r in rows[:limit]:
                    conv_id, max_seq, read_seq = r[0], r[2], r[3]
                    if max_seq > read_seq:
                        found = conn.execute(
                            runs_sql, (conv_id, read_seq, su, read_seq, max_seq)
                        ).fetchall()
                        if found:
                            archived[conv_id] = count_in_runs(found, read_seq, max_seq)
            finally:
                conn.execute("COMMIT")
            return rows, archived

        rows, archived = await self._reader.call(q)
        out = [
            SyncRow(r[0], r[1], r[2], r[3], r[4], r[7] + archived.get(r[0], 0), r[5], bool(r[6]))
            for r in rows[:limit]
        ]
        return SyncPage(out, len(rows) > limit)

    async def conversation_counts(self, uids: Sequence[int]) -> dict[int, int]:
        wanted = sorted(set(uids))
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))

        def q(conn: sqlite3.Connection) -> dict[int, int]:
            rows = conn.execute(
                "SELECT m.uid, COUNT(*) FROM im_conv_member m "
                "JOIN im_conversation c ON c.conv_id = m.conv_id "
                f"WHERE m.uid IN ({marks}) AND m.left_seq IS NULL "
                f"AND (c.kind = ? OR {shown_up_sql('m')}) GROUP BY m.uid",
                (*map(_s, wanted), ConvKind.P2P),
            ).fetchall()
            return {_u(u): int(n) for u, n in rows}

        return await self._reader.call(q)

    async def shared_with(self, uid: int, others: Sequence[int]) -> set[int]:
        if not others:
            return set()
        marks = ",".join("?" * len(others))

        def q(conn: sqlite3.Connection) -> set[int]:
            rows = conn.execute(
                "SELECT DISTINCT b.uid FROM im_conv_member a JOIN im_conv_member b "
                "ON a.conv_id = b.conv_id WHERE a.uid=? AND a.left_seq IS NULL "
                f"AND b.left_seq IS NULL AND b.uid IN ({marks}) "
                f"AND {shown_up_sql('b')}",
                (_s(uid), *map(_s, others)),
            ).fetchall()
            return {_u(r[0]) for r in rows}

        return await self._reader.call(q)

    # -- hook rows (storage/hooks.py) -------------------------------------------------------

    def set_hook_node(self, node: str) -> None:
        self._hook_node = node

    async def hooks_of(self, node: str, limit: int) -> list[HookRow]:
        def q(conn: sqlite3.Connection) -> list[Row]:
            return conn.execute(
                "SELECT conv_id, seq, node, created_ms FROM im_hook WHERE node=? "
                "ORDER BY created_ms, conv_id, seq LIMIT ?",
                (node, limit),
            ).fetchall()

        if limit <= 0:
            return []
        return [
            HookRow(int(c), int(s), str(n), int(ms)) for c, s, n, ms in await self._reader.call(q)
        ]

    async def hooks_done(self, keys: Sequence[tuple[int, int]]) -> None:
        stored = [(c, s) for c, s in keys if 0 <= c <= _I64_MAX and 0 <= s <= _I64_MAX]
        for part in batches(stored, DONE_KEYS_PER_QUERY):

            def body(conn: sqlite3.Connection, part: list[tuple[int, int]] = part) -> None:
                conn.executemany("DELETE FROM im_hook WHERE conv_id=? AND seq=?", part)

            await self._writer.tx(body)

    async def hooks_adopt(self, from_node: str, to_node: str) -> int:
        def body(conn: sqlite3.Connection) -> int:
            cur = conn.execute("UPDATE im_hook SET node=? WHERE node=?", (to_node, from_node))
            return int(cur.rowcount)

        if from_node == to_node:
            return 0
        return await self._writer.tx(body)

    async def hooks_backlog(self) -> tuple[int, int]:
        def q(conn: sqlite3.Connection) -> tuple[int, int]:
            conn.execute("BEGIN")  # one snapshot for both
            try:
                (count,) = conn.execute(_HOOK_COUNT_SQL, (HOOK_BACKLOG_CAP,)).fetchone()
                (oldest,) = conn.execute(_HOOK_OLDEST_SQL).fetchone()
            finally:
                conn.execute("COMMIT")
            return int(count), int(oldest or 0)

        return await self._reader.call(q)

    # -- offline push (storage/embedded/push.py) -----------------------------------------

    async def push_register(
        self,
        uid: int,
        device: str,
        provider: str,
        token: str,
        *,
        preview: bool,
        locale: str,
        max_devices: int,
    ) -> list[tuple[int, str]]:
        def body(conn: sqlite3.Connection) -> list[tuple[int, str]]:
            return push.register(
                conn, uid, device, provider, token, preview=preview, locale=locale,
                now_ms=self._clock(), max_devices=max_devices,
            )  # fmt: skip

        return await self._writer.tx(body)

    async def push_unregister(self, uid: int, device: str) -> bool:
        return await self._writer.tx(lambda conn: push.unregister(conn, uid, device))

    async def push_devices(self, uids: Sequence[int]) -> dict[int, list[PushDevice]]:
        if not uids:
            return {}

        def q(conn: sqlite3.Connection) -> dict[int, list[PushDevice]]:
            return push.devices(conn, uids)

        return await self._reader.call(q)

    async def push_delete(self, provider: str, token: str) -> bool:
        return await self._writer.tx(lambda conn: push.delete_token(conn, provider, token))

    async def set_mute(self, conv_id: int, uid: int, until_ms: int) -> None:
        if conv_id > _I64_MAX:
            return  # conv_ids are allocated by SQLite: never this large
        await self._writer.tx(
            lambda conn: push.set_mute(conn, conv_id, uid, until_ms, self._clock())
        )

    async def muted(self, pairs: Sequence[tuple[int, int]], now_ms: int) -> set[tuple[int, int]]:
        if not pairs:
            return set()

        def q(conn: sqlite3.Connection) -> set[tuple[int, int]]:
            return push.muted(conn, pairs, now_ms)

        return await self._reader.call(q)

    async def unread_badges(self, uids: Sequence[int]) -> dict[int, int]:
        if not uids:
            return {}

        def q(conn: sqlite3.Connection) -> dict[int, int]:
            return push.unread_badges(conn, uids, self._badges)

        return await self._reader.call(q)
