"""`--preload N`: store N messages over many conversations and users before a bench
measures, so that it measures the store as it will be next month, not empty.

The rows are written straight into the store's database (the embedded SQLite file, or
every table and shard of a MySQL database after `imgw db migrate`), in bulk, before the
gateway starts: the same tables and indexes the gateway's own writes fill.

- conversations: p2p, conversation c between users `PRELOAD_UID0 + c` and `+ c + 1`, so
  every user is in two conversations; conv_ids 1..C (the bench's own come after);
- messages: message i goes to conversation i % C with the next seq there, sent by its
  members in turn, with a unique client_msg_id, spread over the last 20 hours (so each
  one is still inside the 24-hour idempotency window and has its dedup record);
- read positions a few messages behind the end, and a delivered cursor per member.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from storage.snowflake import EPOCH_MS, MAX_WORKER, SEQ_BITS, WORKER_BITS

DEFAULT_MESSAGES: Final = 1_000_000
DEFAULT_CONVERSATIONS: Final = 100_000
PRELOAD_UID0: Final = 7_000_000_000_000  # far from the bench's own uids
DEVICE: Final = "phone"
SPAN_MS: Final = 20 * 3600 * 1000
CHUNK: Final = 20_000  # messages generated and committed at a time
UNREAD: Final = 3  # read_seq this far behind max_seq


@dataclass(frozen=True)
class Volume:
    messages: int
    conversations: int

    @classmethod
    def of(cls, messages: int, conversations: int | None) -> Volume:
        if conversations is None:
            conversations = min(DEFAULT_CONVERSATIONS, max(1, messages // 10))
        if messages < 0 or conversations < 1:
            raise ValueError("need --preload >= 0 and --preload-convs >= 1")
        return cls(messages, conversations)

    def members(self, conv: int) -> tuple[int, int]:
        return PRELOAD_UID0 + conv, PRELOAD_UID0 + conv + 1

    def max_seq(self, conv: int) -> int:
        """Messages of conversation `conv` (1-based): message i goes to i % C + 1."""
        base, extra = divmod(self.messages, self.conversations)
        return base + (1 if conv - 1 < extra else 0)


@dataclass(frozen=True)
class Row:
    conv_id: int
    seq: int
    msg_id: int
    sender: int
    content: bytes
    send_ms: int
    client_msg_id: bytes


def messages(vol: Volume, start_ms: int, lo: int, hi: int) -> Iterator[Row]:
    """Messages lo..hi-1 in send order."""
    step = max(1, SPAN_MS // max(1, vol.messages))
    for i in range(lo, hi):
        conv = i % vol.conversations + 1
        seq = i // vol.conversations + 1
        a, b = vol.members(conv)
        ms = start_ms + i * step
        msg_id = ((ms - EPOCH_MS) << (WORKER_BITS + SEQ_BITS)) | (MAX_WORKER << SEQ_BITS)
        msg_id |= i & ((1 << SEQ_BITS) - 1)
        content = b"preloaded message %d of conversation %d" % (seq, conv)
        yield Row(conv, seq, msg_id, a if seq % 2 else b, content, ms, b"pre.%d.%d" % (conv, seq))


def preload(store_url: str, vol: Volume, *, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fill the store at `store_url` (already migrated when it is MySQL); a summary."""
    t0 = time.monotonic()
    start_ms = int(time.time() * 1000) - SPAN_MS - 60_000
    if store_url.startswith("sqlite:"):
        _Sqlite(store_url).fill(vol, start_ms, log)
    elif store_url.startswith("mysql://"):
        _MySQL(store_url).fill(vol, start_ms, log)
    else:
        raise ValueError(f"--preload does not know the store {store_url!r}")
    took = time.monotonic() - t0
    log(f"preloaded {vol.messages:,} messages in {vol.conversations:,} conversations "
        f"({took:.0f} s, {vol.messages / max(took, 1e-3):,.0f} messages/s)")  # fmt: skip
    return {
        "messages": vol.messages,
        "conversations": vol.conversations,
        "users": vol.conversations + 1,
        "seconds": round(took, 1),
    }


def _progress(log: Callable[[str], None], done: int, total: int, t0: float) -> None:
    rate = done / max(time.monotonic() - t0, 1e-3)
    log(f"preload: {done:,}/{total:,} messages ({rate:,.0f}/s)")


class _Sqlite:
    def __init__(self, url: str) -> None:
        from storage.factory import sqlite_path

        self.path, _ = sqlite_path(url)

    def fill(self, vol: Volume, start_ms: int, log: Callable[[str], None]) -> None:
        import os

        from storage.embedded.schema import connect, migrate

        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        conn = connect(self.path)
        try:
            migrate(conn)
            conn.execute("PRAGMA synchronous=OFF")  # a bulk load: durable at the end
            self._conversations(conn, vol, start_ms)
            t0, last = time.monotonic(), time.monotonic()
            for lo in range(0, vol.messages, CHUNK):
                hi = min(vol.messages, lo + CHUNK)
                conn.execute("BEGIN")
                conn.executemany(
                    "INSERT INTO im_message (conv_id, seq, id, sender_uid, msg_type, content, "
                    "send_ms, client_msg_id) VALUES (?,?,?,?,1,?,?,?)",
                    (
                        (r.conv_id, r.seq, r.msg_id, r.sender, r.content, r.send_ms,
                         r.client_msg_id.decode())
                        for r in messages(vol, start_ms, lo, hi)
                    ),
                )  # fmt: skip
                conn.execute("COMMIT")
                if time.monotonic() - last >= 5:
                    last = time.monotonic()
                    _progress(log, hi, vol.messages, t0)
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()

    @staticmethod
    def _conversations(conn: Any, vol: Volume, start_ms: int) -> None:
        end_ms = start_ms + SPAN_MS
        convs = range(1, vol.conversations + 1)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO im_conversation (conv_id, kind, p2p_lo, p2p_hi, created_ms) "
            "VALUES (?,1,?,?,?)",
            ((c, *vol.members(c), start_ms) for c in convs),
        )
        conn.executemany(
            "INSERT INTO im_conv_seq (conv_id, max_seq, last_active_ms) VALUES (?,?,?)",
            ((c, vol.max_seq(c), end_ms) for c in convs),
        )
        conn.executemany(
            "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, updated_ms)"
            " VALUES (?,?,?,1,?,?)",
            (
                (c, uid, pos, max(0, vol.max_seq(c) - UNREAD), end_ms)
                for c in convs
                for pos, uid in enumerate(vol.members(c))
            ),
        )
        conn.executemany(
            "INSERT INTO im_delivered (uid, device, conv_id, seq, updated_ms) VALUES (?,?,?,?,?)",
            (
                (uid, DEVICE, c, vol.max_seq(c), end_ms)
                for c in convs
                for uid in vol.members(c)
                if vol.max_seq(c) > 0
            ),
        )
        conn.execute("COMMIT")


class _MySQL:
    ROWS_PER_INSERT: Final = 2_000

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn_args = {
            "host": parts.hostname or "127.0.0.1",
            "port": parts.port or 3306,
            "user": parts.username or "root",
            "password": parts.password or "",
            "database": parts.path.lstrip("/"),
        }

    def fill(self, vol: Volume, start_ms: int, log: Callable[[str], None]) -> None:
        import pymysql

        from storage.mysql.schema import message_table
        from storage.mysql.sql import row

        conn = pymysql.connect(**self.conn_args, autocommit=False, connect_timeout=10)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT value FROM im_meta WHERE name='shards'")
                shards = int(cur.fetchone()[0])
                self._conversations(cur, vol, start_ms)
                conn.commit()
                t0, last = time.monotonic(), time.monotonic()
                for lo in range(0, vol.messages, CHUNK):
                    hi = min(vol.messages, lo + CHUNK)
                    by_shard: dict[int, list[str]] = {}
                    dedup: list[str] = []
                    for r in messages(vol, start_ms, lo, hi):
                        by_shard.setdefault(r.conv_id % shards, []).append(
                            row((r.conv_id, r.seq, r.msg_id, r.sender, 1, r.content,
                                 r.send_ms, r.client_msg_id))
                        )  # fmt: skip
                        dedup.append(row((r.sender, r.client_msg_id, r.conv_id, r.seq, r.send_ms)))
                    for shard, rows in by_shard.items():
                        self._insert(
                            cur,
                            f"INSERT INTO {message_table(shard)} (conv_id, seq, id, sender_uid,"
                            " msg_type, content, send_ms, client_msg_id) VALUES ",
                            rows,
                        )
                    self._insert(
                        cur,
                        "INSERT INTO im_send_dedup (sender_uid, client_msg_id, conv_id, seq, "
                        "created_ms) VALUES ",
                        dedup,
                    )
                    conn.commit()
                    if time.monotonic() - last >= 5:
                        last = time.monotonic()
                        _progress(log, hi, vol.messages, t0)
                log("preload: ANALYZE TABLE (fresh statistics for the optimizer)")
                tables = ["im_conversation", "im_conv_member", "im_conv_seq", "im_delivered",
                          "im_send_dedup", *(message_table(i) for i in range(shards))]  # fmt: skip
                cur.execute(f"ANALYZE TABLE {', '.join(tables)}")
                cur.fetchall()
        finally:
            conn.close()

    def _insert(self, cur: Any, head: str, rows: list[str]) -> None:
        for i in range(0, len(rows), self.ROWS_PER_INSERT):
            cur.execute(head + ",".join(rows[i : i + self.ROWS_PER_INSERT]))

    def _conversations(self, cur: Any, vol: Volume, start_ms: int) -> None:
        from storage.mysql.sql import row

        end_ms = start_ms + SPAN_MS
        convs = range(1, vol.conversations + 1)
        self._insert(
            cur,
            "INSERT INTO im_conversation (conv_id, kind, p2p_lo, p2p_hi, created_ms) VALUES ",
            [row((c, 1, *vol.members(c), start_ms)) for c in convs],
        )
        self._insert(
            cur,
            "INSERT INTO im_conv_seq (conv_id, reserved_seq, max_seq, last_active_ms) VALUES ",
            [row((c, vol.max_seq(c), vol.max_seq(c), end_ms)) for c in convs],
        )
        self._insert(
            cur,
            "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, updated_ms) "
            "VALUES ",
            [
                row((c, uid, pos, 1, max(0, vol.max_seq(c) - UNREAD), end_ms))
                for c in convs
                for pos, uid in enumerate(vol.members(c))
            ],
        )
        self._insert(
            cur,
            "INSERT INTO im_delivered (uid, device, conv_id, seq, updated_ms) VALUES ",
            [
                row((uid, DEVICE.encode(), c, vol.max_seq(c), end_ms))
                for c in convs
                for uid in vol.members(c)
                if vol.max_seq(c) > 0
            ],
        )
