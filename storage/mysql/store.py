"""The MySQL/MariaDB ChatStore: the authority.

On its own it is a complete store (what runs when Redis is down); the production store
puts the Redis accelerator in front of it. Its parts, in storage/mysql/:

- settings.py: `MySQLSettings`, from a `mysql://` URL;
- schema.py: the tables, and `migrate` (`imgw db migrate`);
- transactions.py: the pool and the transaction runner (retries, `StoreUnavailable`,
  the COMMIT watch and fence);
- append.py: the group commit of a send batch (seqs under the seq row lock; see there);
- sync.py: SYNC pages, coalesced per event-loop iteration;
- sql.py: SQL text built from literals; outbox.py: the transactional outbox.

Seqs within a conversation follow commit order exactly (the original design's Redis-leased blocks
cannot give that across workers: two workers holding seqs 5 and 6 may commit 6 first;
see docs/decisions.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final

import msgpack
from asyncmy import errors as db_errors

from protocol.ops import ConvKind, MsgType
from storage.errors import StoreUnavailable
from storage.membership import plan_change
from storage.models import (
    AppendResult,
    Conversation,
    Membership,
    MembershipChange,
    NewMessage,
    RecallResult,
    RecallStatus,
    SentRecord,
    StoredMessage,
    SyncPage,
    SystemEvent,
)
from storage.mysql import sql
from storage.mysql.append import GroupCommit, find_sent_in
from storage.mysql.outbox import MySQLOutbox
from storage.mysql.schema import SCHEMA_VERSION, message_table
from storage.mysql.settings import MySQLSettings
from storage.mysql.sync import SyncBatcher
from storage.mysql.transactions import Cursor, Row, Transactions, rowcount
from storage.rules import RecallTarget, recall_content, recall_refusal
from storage.snowflake import Snowflake

DEDUP_KEEP_MS: Final = 48 * 3600 * 1000


def _now_ms() -> int:
    return int(time.time() * 1000)


class MySQLStore:
    def __init__(
        self,
        settings: MySQLSettings,
        *,
        ids: Snowflake | None = None,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._ids = ids or Snowflake(0)
        self._db = Transactions(settings)
        self._run = self._db.run
        self._shards = settings.shards
        self._durability: dict[str, str] = {}
        self._outbox = MySQLOutbox(self._db, clock)
        self._syncs = SyncBatcher(self._db, self.shard_of)
        self._appends = GroupCommit(self._db, self.shard_of, self._ids, clock, self._outbox)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        await self._db.open()

        async def inspect(cur: Cursor) -> None:
            await cur.execute("SELECT value FROM im_meta WHERE name='shards'")
            row = await cur.fetchone()
            if row is None:
                raise StoreUnavailable(
                    f"database {s.database} has no imgw schema: run `imgw db migrate`"
                )
            self._shards = int(row[0])
            await cur.execute("SELECT value FROM im_meta WHERE name='schema_version'")
            version = await cur.fetchone()
            if version is None or int(version[0]) < SCHEMA_VERSION:
                raise StoreUnavailable(
                    f"database {s.database} has an older imgw schema: run `imgw db migrate`"
                )
            await cur.execute(
                "SHOW GLOBAL VARIABLES WHERE Variable_name IN "
                "('innodb_flush_log_at_trx_commit', 'sync_binlog', 'log_bin', "
                "'innodb_doublewrite', 'version')"
            )
            self._durability = {k: str(v) for k, v in await cur.fetchall()}

        try:
            await self._run(inspect, tx=False)
        except db_errors.ProgrammingError as e:
            raise StoreUnavailable(
                f"database {s.database} has no imgw schema ({e}): run `imgw db migrate`"
            ) from e

    async def close(self) -> None:
        await self._db.close()

    def now_ms(self) -> int:
        return self._clock()

    async def maintain(self) -> None:
        await self.prune_dedup()

    async def prune_dedup(self, *, keep_ms: int = DEDUP_KEEP_MS, limit: int = 10_000) -> int:
        """Delete idempotency records older than `keep_ms` (48 h: the protocol promises
        24), at most `limit` rows a call so no transaction grows large. Returns how many
        went. The message rows keep UNIQUE(conv_id, sender, client_msg_id) for good."""

        async def body(cur: Cursor) -> int:
            await cur.execute(
                "DELETE FROM im_send_dedup WHERE created_ms < %s LIMIT %s",
                (self._clock() - keep_ms, limit),
            )
            return rowcount(cur)

        return await self._run(body)

    def durability(self) -> dict[str, str]:
        return {"engine": "mysql", **self._durability}

    def outbox(self) -> MySQLOutbox:
        return self._outbox

    def shard_of(self, conv_id: int) -> str:
        return message_table(conv_id % self._shards)

    # -- helpers ------------------------------------------------------------------------

    async def _next_seq(self, cur: Cursor, conv_id: int, now: int) -> int:
        """One seq for a server-written message, under the seq row lock (held until
        commit)."""
        await cur.execute(sql.lock_seqs([conv_id]))
        row = await cur.fetchone()
        seq = (int(row[1]) if row else 0) + 1
        await cur.execute(sql.set_seqs({conv_id: seq}, now))
        return seq

    async def _insert_messages(self, cur: Cursor, msgs: Sequence[StoredMessage]) -> None:
        for statement in sql.insert_sharded(msgs, self.shard_of):
            await cur.execute(statement)

    async def _system(
        self, cur: Cursor, conv_id: int, event: SystemEvent, now: int, *, new: bool = False
    ) -> StoredMessage:
        """A server-written message. `new`: the conversation was created in this
        transaction, so its seq row is inserted as seq 1 without the locking read (which,
        on a row that does not exist yet, takes a gap lock: concurrent creations then
        deadlock on their INSERTs into the same gap)."""
        if new:
            first = 1
            await cur.execute(sql.set_seqs({conv_id: first}, now))
        else:
            first = await self._next_seq(cur, conv_id, now)
        content = msgpack.packb(event, use_bin_type=True)
        msg = StoredMessage(
            conv_id, first, self._ids.next_id(now), 0, MsgType.SYSTEM, content, now, ""
        )
        await self._insert_messages(cur, [msg])
        return msg

    # -- conversations and members -------------------------------------------------------

    async def get_conversation(self, conv_id: int) -> Conversation | None:
        async def q(cur: Cursor) -> Conversation | None:
            await cur.execute(
                "SELECT conv_id, kind, title, owner_uid, created_ms FROM im_conversation "
                "WHERE conv_id=%s",
                (conv_id,),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            return Conversation(int(row[0]), int(row[1]), row[2], int(row[3]), int(row[4]))

        return await self._run(q, tx=False)

    async def member_rows(self, conv_id: int) -> tuple[int, list[Membership]]:
        """All member rows (current and former) in join order, with the conversation's
        membership version (the seq of its latest membership change; 0 for p2p)."""

        async def q(cur: Cursor) -> tuple[int, list[Membership]]:
            await cur.execute(
                "SELECT uid, joined_seq, left_seq FROM im_conv_member WHERE conv_id=%s "
                "ORDER BY joined_seq, pos",
                (conv_id,),
            )
            rows = [
                Membership(conv_id, int(u), int(j), None if left is None else int(left))
                for u, j, left in await cur.fetchall()
            ]
            version = max(
                [m.joined_seq for m in rows] + [m.left_seq for m in rows if m.left_seq] or [0]
            )
            return version, rows

        return await self._run(q, tx=False)

    async def get_membership(self, conv_id: int, uid: int) -> Membership | None:
        async def q(cur: Cursor) -> Membership | None:
            await cur.execute(
                "SELECT joined_seq, left_seq FROM im_conv_member WHERE conv_id=%s AND uid=%s",
                (conv_id, uid),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            return Membership(conv_id, uid, int(row[0]), None if row[1] is None else int(row[1]))

        return await self._run(q, tx=False)

    async def member_uids(self, conv_id: int) -> list[int]:
        _, rows = await self.member_rows(conv_id)
        return [m.uid for m in rows if m.left_seq is None]

    async def find_p2p(self, a: int, b: int) -> int | None:
        lo, hi = min(a, b), max(a, b)

        async def q(cur: Cursor) -> int | None:
            await cur.execute(
                "SELECT conv_id FROM im_conversation WHERE kind=%s AND p2p_lo=%s AND p2p_hi=%s",
                (ConvKind.P2P, lo, hi),
            )
            row = await cur.fetchone()
            return None if row is None else int(row[0])

        return await self._run(q, tx=False)

    async def open_p2p(self, a: int, b: int) -> int:
        lo, hi = min(a, b), max(a, b)

        async def body(cur: Cursor) -> int:
            await cur.execute(
                "SELECT conv_id FROM im_conversation WHERE kind=%s AND p2p_lo=%s AND p2p_hi=%s",
                (ConvKind.P2P, lo, hi),
            )
            row = await cur.fetchone()
            if row is not None:
                return int(row[0])
            # A concurrent first open of the same pair makes this INSERT fail with a
            # duplicate key; the transaction is retried and then finds the row.
            now = self._clock()
            await cur.execute(
                "INSERT INTO im_conversation (kind, p2p_lo, p2p_hi, created_ms) "
                "VALUES (%s,%s,%s,%s)",
                (ConvKind.P2P, lo, hi, now),
            )
            conv_id = int(cur.lastrowid)
            await cur.execute(
                "INSERT INTO im_conv_seq (conv_id, reserved_seq, max_seq, last_active_ms) "
                "VALUES (%s,0,0,%s)",
                (conv_id, now),
            )
            await cur.execute(
                "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, "
                "updated_ms) VALUES (%s,%s,0,1,0,%s), (%s,%s,1,1,0,%s)",
                (conv_id, lo, now, conv_id, hi, now),
            )
            return conv_id

        return await self._run(body)

    async def create_group(
        self, owner: int, title: str, uids: Sequence[int]
    ) -> tuple[int, StoredMessage]:
        members = list(dict.fromkeys([owner, *uids]))

        async def body(cur: Cursor) -> tuple[int, StoredMessage]:
            now = self._clock()
            await cur.execute(
                "INSERT INTO im_conversation (kind, title, owner_uid, created_ms) "
                "VALUES (%s,%s,%s,%s)",
                (ConvKind.GROUP, title, owner, now),
            )
            conv_id = int(cur.lastrowid)
            event: SystemEvent = {"event": "created", "by": owner, "uids": members, "title": title}
            msg = await self._system(cur, conv_id, event, now, new=True)
            values = ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(members))
            params: list[int] = []
            for i, u in enumerate(members):
                params += [conv_id, u, i, msg.seq, msg.seq - 1, now]
            await cur.execute(
                "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, "
                f"updated_ms) VALUES {values}",
                params,
            )
            return conv_id, msg

        return await self._run(body)

    async def change_members(
        self,
        conv_id: int,
        by: int,
        add: Sequence[int],
        remove: Sequence[int],
        *,
        max_members: int = 1000,
    ) -> MembershipChange:
        async def body(cur: Cursor) -> MembershipChange:
            now = self._clock()
            # The conversation row lock serialises membership changes of one group.
            await cur.execute(
                "SELECT owner_uid FROM im_conversation WHERE conv_id=%s FOR UPDATE", (conv_id,)
            )
            owner = int((await cur.fetchone())[0])
            await cur.execute(
                "SELECT uid FROM im_conv_member WHERE conv_id=%s AND left_seq IS NULL "
                "ORDER BY joined_seq, pos",
                (conv_id,),
            )
            active = [int(r[0]) for r in await cur.fetchall()]
            plan = plan_change(active, owner, by, add, remove, max_members=max_members)
            out: list[StoredMessage] = []
            for event, uids in plan.events:
                change: SystemEvent = {"event": event, "by": by, "uids": uids}
                msg = await self._system(cur, conv_id, change, now)
                out.append(msg)
                if event == "added":
                    values = ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(uids))
                    params: list[int] = []
                    for i, u in enumerate(uids):
                        params += [conv_id, u, i, msg.seq, msg.seq - 1, now]
                    await cur.execute(
                        "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, "
                        f"updated_ms) VALUES {values} ON DUPLICATE KEY UPDATE pos=VALUES(pos), "
                        "joined_seq=VALUES(joined_seq), left_seq=NULL, left_ms=NULL, "
                        "read_seq=VALUES(read_seq), updated_ms=VALUES(updated_ms)",
                        params,
                    )
                else:
                    marks = ",".join(["%s"] * len(uids))
                    await cur.execute(
                        "UPDATE im_conv_member SET left_seq=%s, left_ms=%s, updated_ms=%s "
                        f"WHERE conv_id=%s AND uid IN ({marks})",
                        [msg.seq, now, now, conv_id, *uids],
                    )
            if plan.owner_changed:
                await cur.execute(
                    "UPDATE im_conversation SET owner_uid=%s WHERE conv_id=%s",
                    (plan.owner, conv_id),
                )
            return MembershipChange(out, plan.owner)

        return await self._run(body)

    async def set_title(self, conv_id: int, by: int, title: str) -> StoredMessage | None:
        if conv_id >= 1 << 63:
            return None

        async def body(cur: Cursor) -> StoredMessage | None:
            # The conversation row lock orders it with membership changes (owner changes).
            await cur.execute(
                "SELECT owner_uid FROM im_conversation WHERE conv_id=%s AND kind=%s FOR UPDATE",
                (conv_id, int(ConvKind.GROUP)),
            )
            row = await cur.fetchone()
            if row is None or int(row[0]) != by:
                return None
            now = self._clock()
            await cur.execute(
                "UPDATE im_conversation SET title=%s WHERE conv_id=%s", (title, conv_id)
            )
            event: SystemEvent = {"event": "titled", "by": by, "uids": [], "title": title}
            return await self._system(cur, conv_id, event, now)

        return await self._run(body)

    # -- messages ------------------------------------------------------------------------

    async def append(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        return await self._appends.append(batch)

    async def find_sent(self, sender_uid: int, client_msg_id: str) -> SentRecord | None:
        async def q(cur: Cursor) -> StoredMessage | None:
            found = await find_sent_in(cur, [(sender_uid, client_msg_id)], self.shard_of)
            return found.get((sender_uid, client_msg_id))

        msg = await self._run(q, tx=False)
        return None if msg is None else SentRecord.of(msg)

    async def read_after(
        self, conv_id: int, after_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        lo = max(after_seq + 1, min_seq)
        hi = max_seq if max_seq is not None else (1 << 64) - 1

        async def q(cur: Cursor) -> list[Row]:
            await cur.execute(
                f"SELECT {sql.MSG_COLS} FROM {self.shard_of(conv_id)} WHERE conv_id=%s "
                "AND seq BETWEEN %s AND %s ORDER BY seq LIMIT %s",
                (conv_id, min(lo, (1 << 64) - 1), hi, limit + 1),
            )
            return list(await cur.fetchall())

        rows = await self._run(q, tx=False)
        return [sql.message_of(r) for r in rows[:limit]], len(rows) > limit

    async def read_before(
        self, conv_id: int, before_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        hi = (1 << 64) - 1 if before_seq == 0 else before_seq - 1
        if max_seq is not None:
            hi = min(hi, max_seq)

        async def q(cur: Cursor) -> list[Row]:
            await cur.execute(
                f"SELECT {sql.MSG_COLS} FROM {self.shard_of(conv_id)} WHERE conv_id=%s "
                "AND seq BETWEEN %s AND %s ORDER BY seq DESC LIMIT %s",
                (conv_id, min_seq, hi, limit + 1),
            )
            return list(await cur.fetchall())

        rows = await self._run(q, tx=False)
        return [sql.message_of(r) for r in reversed(rows[:limit])], len(rows) > limit

    async def recall(
        self, conv_id: int, seq: int, by: int, *, window_ms: int, min_seq: int
    ) -> RecallResult:
        table = self.shard_of(conv_id)

        async def body(cur: Cursor) -> RecallResult:
            now = self._clock()
            await cur.execute(
                f"SELECT sender_uid, msg_type, send_ms, status FROM {table} "
                "WHERE conv_id=%s AND seq=%s FOR UPDATE",
                (conv_id, seq),
            )
            row = await cur.fetchone()
            target = None if row is None else RecallTarget(*(int(x) for x in row))
            refusal = recall_refusal(
                target, seq, by, now_ms=now, window_ms=window_ms, min_seq=min_seq
            )
            if refusal is not None:
                return refusal
            first = await self._next_seq(cur, conv_id, now)
            msg = StoredMessage(
                conv_id, first, self._ids.next_id(now), by, MsgType.RECALL,
                recall_content(seq), now, "",
            )  # fmt: skip
            await self._insert_messages(cur, [msg])
            await cur.execute(
                f"UPDATE {table} SET msg_type=%s, content='', status=%s "
                "WHERE conv_id=%s AND seq=%s",
                (MsgType.RECALL, msg.seq, conv_id, seq),
            )
            await cur.execute(
                "UPDATE im_conv_seq SET recalled_seq=GREATEST(recalled_seq, %s) WHERE conv_id=%s",
                (seq, conv_id),
            )
            return RecallResult(RecallStatus.RECALLED, msg.seq, msg)

        return await self._run(body)

    # -- positions and sync ----------------------------------------------------------------

    async def max_seq(self, conv_id: int) -> int:
        async def q(cur: Cursor) -> int:
            await cur.execute("SELECT max_seq FROM im_conv_seq WHERE conv_id=%s", (conv_id,))
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        return await self._run(q, tx=False)

    async def seq_bounds(self, conv_id: int) -> tuple[int, int]:
        """(committed max seq, highest recalled seq) of a conversation: one primary-key
        read."""

        async def q(cur: Cursor) -> tuple[int, int]:
            await cur.execute(
                f"SELECT max_seq, recalled_seq FROM im_conv_seq WHERE conv_id={int(conv_id)}"
            )
            row = await cur.fetchone()
            return (int(row[0]), int(row[1])) if row else (0, 0)

        return await self._run(q, tx=False)

    async def set_read(self, conv_id: int, uid: int, seq: int) -> int | None:
        async def body(cur: Cursor) -> int | None:
            await cur.execute("SELECT max_seq FROM im_conv_seq WHERE conv_id=%s", (conv_id,))
            row = await cur.fetchone()
            target = min(seq, int(row[0]) if row else 0)
            await cur.execute(
                "UPDATE im_conv_member SET read_seq=%s, updated_ms=%s WHERE conv_id=%s "
                "AND uid=%s AND read_seq<%s AND left_seq IS NULL",
                (target, self._clock(), conv_id, uid, target),
            )
            return target if rowcount(cur) else None

        return await self._run(body)

    async def flush_reads(self, reads: Sequence[tuple[int, int, int, int]]) -> None:
        """Upsert read positions (conv_id, uid, seq, changed_ms) kept first in Redis; a
        position never moves back."""
        if not reads:
            return

        async def body(cur: Cursor) -> None:
            values = ",".join(["(%s,%s,0,0,%s,%s)"] * len(reads))
            params: list[int] = []
            for conv_id, uid, seq, ms in sorted(reads):
                params += [conv_id, uid, seq, ms]
            await cur.execute(
                "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, "
                f"updated_ms) VALUES {values} ON DUPLICATE KEY UPDATE "
                "updated_ms = IF(VALUES(read_seq) > read_seq, VALUES(updated_ms), updated_ms), "
                "read_seq = GREATEST(read_seq, VALUES(read_seq))",
                params,
            )

        await self._run(body)

    async def flush_delivered(self, cursors: Sequence[tuple[int, int, str, int, int]]) -> None:
        """Upsert delivered cursors (conv_id, uid, device, seq, changed_ms) in one
        statement; a cursor never moves back."""
        if not cursors:
            return

        async def body(cur: Cursor) -> None:
            values = ",".join(["(%s,%s,%s,%s,%s)"] * len(cursors))
            params: list[int | str] = []
            for conv_id, uid, device, seq, ms in sorted(cursors):
                params += [uid, device, conv_id, seq, ms]
            await cur.execute(
                "INSERT INTO im_delivered (uid, device, conv_id, seq, updated_ms) "
                f"VALUES {values} ON DUPLICATE KEY UPDATE "
                "updated_ms = IF(VALUES(seq) > seq, VALUES(updated_ms), updated_ms), "
                "seq = GREATEST(seq, VALUES(seq))",
                params,
            )

        await self._run(body)

    async def set_delivered(self, conv_id: int, uid: int, device: str, seq: int) -> int | None:
        async def body(cur: Cursor) -> int | None:
            await cur.execute("SELECT max_seq FROM im_conv_seq WHERE conv_id=%s", (conv_id,))
            row = await cur.fetchone()
            target = min(seq, int(row[0]) if row else 0)
            if target <= 0:
                return None
            await cur.execute(
                "INSERT INTO im_delivered (uid, device, conv_id, seq, updated_ms) "
                "VALUES (%s,%s,%s,%s,%s) ON DUPLICATE KEY UPDATE "
                "updated_ms = IF(VALUES(seq) > seq, VALUES(updated_ms), updated_ms), "
                "seq = GREATEST(seq, VALUES(seq))",
                (uid, device, conv_id, target, self._clock()),
            )
            # rowcount: 1 inserted, 2 updated, 0 unchanged
            return target if rowcount(cur) else None

        return await self._run(body)

    async def sync(
        self,
        uid: int,
        device: str,
        *,
        changed_since_ms: int,
        after: tuple[int, int] | None,
        limit: int,
    ) -> SyncPage:
        """One page of the user's conversations changed since `changed_since_ms`. The
        SYNCs asked for in one event-loop iteration share round trips (storage/mysql/sync.py)."""
        return await self._syncs.ask(
            uid, device, changed_since_ms=changed_since_ms, after=after, limit=limit
        )

    async def conversation_counts(self, uids: Sequence[int]) -> dict[int, int]:
        if not uids:
            return {}
        listed = sql.ints(set(uids))

        async def q(cur: Cursor) -> dict[int, int]:
            await cur.execute(
                "SELECT uid, COUNT(*) FROM im_conv_member "
                f"WHERE uid IN ({listed}) AND left_seq IS NULL GROUP BY uid"
            )
            return {int(u): int(n) for u, n in await cur.fetchall()}

        return await self._run(q, tx=False)

    async def shared_with(self, uid: int, others: Sequence[int]) -> set[int]:
        if not others:
            return set()
        marks = ",".join(["%s"] * len(others))

        async def q(cur: Cursor) -> set[int]:
            await cur.execute(
                "SELECT DISTINCT b.uid FROM im_conv_member a JOIN im_conv_member b "
                "ON a.conv_id = b.conv_id JOIN im_conversation c ON c.conv_id = a.conv_id "
                "WHERE a.uid=%s AND a.left_seq IS NULL "
                f"AND b.left_seq IS NULL AND b.uid IN ({marks}) "
                "AND (b.read_seq >= b.joined_seq OR c.owner_uid = b.uid)",
                (uid, *others),
            )
            return {int(r[0]) for r in await cur.fetchall()}

        return await self._run(q, tx=False)
