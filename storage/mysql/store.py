"""The MySQL/MariaDB ChatStore: the authority.

On its own it is a complete store (what runs when Redis is down); the production store
puts the Redis accelerator in front of it.

Seqs are allocated inside the committing transaction, under the row lock of the
conversation's `im_conv_seq` row (`SELECT … FOR UPDATE`, then `max_seq` written back
before the commit). The lock is held until
commit, so within a conversation seqs follow commit order exactly, and a rolled-back
transaction gives its seqs back: no seq is issued twice and a reader that has seen seq
n never later finds a committed seq below n it did not see. (DESIGN.md's Redis-leased
blocks cannot give that across workers: two workers holding seqs 5 and 6 may commit 6
first; see docs/decisions.md.)

Every transaction retries on deadlock, lock wait timeout and duplicate key (a
concurrent duplicate send), and maps connection trouble to `StoreUnavailable`.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncmy
import msgpack
from asyncmy import errors as db_errors

from protocol.ops import ConvKind, MsgType
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
    StoreOutcomeUnknown,
    StoreUnavailable,
    SyncPage,
    SyncRow,
)
from storage.mysql import sql
from storage.mysql.outbox import MySQLOutbox
from storage.mysql.outbox import insert_row as outbox_sql
from storage.mysql.schema import DEFAULT_SHARDS, SCHEMA_VERSION, UPGRADES, ddl, message_table
from storage.rules import (
    RecallTarget,
    append_results,
    plan_append,
    recall_content,
    recall_refusal,
    resend_result,
)
from storage.snowflake import Snowflake

T = TypeVar("T")
Cursor = Any  # asyncmy.cursors.Cursor

_RETRY_ERRNOS: Final = {1213, 1205, 1062}  # deadlock, lock wait timeout, duplicate key
_MAX_ATTEMPTS: Final = 4
_UNKNOWN_THREAD: Final = 1094  # KILL of a connection id the server no longer has
DEDUP_KEEP_MS: Final = 48 * 3600 * 1000
_MSG_COLS: Final = sql.MSG_COLS


@dataclass(slots=True)
class _CommitWatch:
    """Where the last attempt's COMMIT stands. `unanswered`: it was sent and no answer
    came back (a timeout, a dropped connection), so it may still land."""

    thread_id: int = 0  # the server thread (connection id) it was sent on
    unanswered: bool = False


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _next_rows(cur: Cursor) -> Sequence[Any]:
    """The rows of the next statement of a multi-statement query."""
    if not await cur.nextset():
        raise StoreUnavailable("MySQL answered fewer result sets than statements sent")
    return await cur.fetchall()  # type: ignore[no-any-return]


SYNC_BATCH_MAX: Final = 64  # SYNCs per multi-statement query
_SYNC_SQL: Final = """SELECT m.conv_id AS cid, c.kind, COALESCE(m.left_seq, s.max_seq) AS max_seq,
  m.read_seq, COALESCE(d.seq, 0), COALESCE(m.left_ms, s.last_active_ms) AS last_active,
  (m.left_seq IS NULL),
  GREATEST(COALESCE(m.left_ms, s.last_active_ms), m.updated_ms,
           COALESCE(d.updated_ms, 0)) AS changed
FROM im_conv_member m
JOIN im_conversation c ON c.conv_id = m.conv_id
JOIN im_conv_seq s ON s.conv_id = m.conv_id
LEFT JOIN im_delivered d ON d.uid = m.uid AND d.device = %s AND d.conv_id = m.conv_id
WHERE m.uid = %s
HAVING changed >= %s AND (last_active < %s OR (last_active = %s AND cid < %s))
ORDER BY last_active DESC, cid DESC
LIMIT %s"""

# A first SYNC (since 0) filters nothing by change time, so the page is chosen from the
# member and seq rows alone; the conversation and delivered rows are joined for the
# page's rows only (a user in 40,000 conversations: 3 lookups per row fewer, 1 in 3).
_SYNC_FIRST_SQL: Final = """SELECT p.cid, c.kind, p.max_seq, p.read_seq, COALESCE(d.seq, 0),
  p.last_active, p.is_member, p.last_active
FROM (
  SELECT m.conv_id AS cid, COALESCE(m.left_seq, s.max_seq) AS max_seq, m.read_seq,
    COALESCE(m.left_ms, s.last_active_ms) AS last_active, (m.left_seq IS NULL) AS is_member
  FROM im_conv_member m JOIN im_conv_seq s ON s.conv_id = m.conv_id
  WHERE m.uid = %s
  HAVING last_active < %s OR (last_active = %s AND cid < %s)
  ORDER BY last_active DESC, cid DESC
  LIMIT %s
) p
JOIN im_conversation c ON c.conv_id = p.cid
LEFT JOIN im_delivered d ON d.uid = %s AND d.device = %s AND d.conv_id = p.cid
ORDER BY p.last_active DESC, p.cid DESC"""


@dataclass(slots=True)
class _SyncAsk:
    uid: int
    device: str
    since_ms: int
    after: tuple[int, int] | None
    limit: int
    fut: asyncio.Future[SyncPage]

    def query(self) -> tuple[str, tuple[Any, ...]]:
        a_active, a_conv = self.after if self.after is not None else ((1 << 62), 0)
        if self.since_ms <= 0:
            return _SYNC_FIRST_SQL, (
                self.uid, a_active, a_active, a_conv, self.limit + 1, self.uid, self.device,
            )  # fmt: skip
        return _SYNC_SQL, (
            self.device, self.uid, self.since_ms, a_active, a_active, a_conv, self.limit + 1,
        )  # fmt: skip


def _sync_row(r: Sequence[Any], unread: dict[int, int]) -> SyncRow:
    return SyncRow(
        int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), unread.get(int(r[0]), 0),
        int(r[5]), bool(r[6]),
    )  # fmt: skip


def _msg(row: Sequence[Any]) -> StoredMessage:
    cmid = row[7]
    return StoredMessage(
        int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]), bytes(row[5]),
        int(row[6]), cmid.decode() if cmid is not None else "",
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class MySQLSettings:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    database: str = "imgw"
    shards: int = DEFAULT_SHARDS
    pool: int = 10
    timeout_s: float = 5.0  # per operation, then StoreUnavailable

    @classmethod
    def from_url(cls, url: str) -> MySQLSettings:
        """`mysql://user:password@host:port/database?shards=16&pool=10&timeout=5`."""
        parts = urlsplit(url)
        if parts.scheme != "mysql":
            raise ValueError(f"not a mysql:// URL: {url!r}")
        opts = dict(parse_qsl(parts.query))
        database = parts.path.lstrip("/") or "imgw"
        try:
            settings = cls(
                host=parts.hostname or "127.0.0.1",
                port=parts.port or 3306,
                user=unquote(parts.username or "root"),
                password=unquote(parts.password or ""),
                database=database,
                shards=int(opts.pop("shards", DEFAULT_SHARDS)),
                pool=int(opts.pop("pool", 10)),
                timeout_s=float(opts.pop("timeout", 5.0)),
            )
        except ValueError as e:
            raise ValueError(f"bad option in {url!r}: {e}") from e
        if opts:
            raise ValueError(f"unknown mysql options {sorted(opts)} in {url!r}")
        if not 1 <= settings.shards <= 1024:
            raise ValueError("shards must be 1..1024")
        return settings


async def migrate(settings: MySQLSettings) -> list[str]:
    """Create the database and tables if missing; record the schema version and shard
    count. Idempotent. Returns what it did, for the command's output."""
    done: list[str] = []
    try:
        conn = await asyncmy.connect(
            host=settings.host, port=settings.port, user=settings.user,
            password=settings.password, connect_timeout=settings.timeout_s, autocommit=True,
            charset="utf8mb4",
        )  # fmt: skip
    except (db_errors.OperationalError, OSError) as e:
        raise StoreUnavailable(f"cannot connect to MySQL at {settings.host}: {e}") from e
    try:
        async with conn.cursor() as cur:
            await cur.execute("SET SESSION sql_notes = 0")  # no "already exists" warnings
            await cur.execute(
                f"CREATE DATABASE IF NOT EXISTS `{settings.database}` DEFAULT CHARACTER SET utf8mb4"
            )
            await cur.execute(f"USE `{settings.database}`")
            await cur.execute("SHOW TABLES LIKE 'im\\_meta'")
            if await cur.fetchone():
                await cur.execute("SELECT name, value FROM im_meta")
                meta = {k: v for k, v in await cur.fetchall()}
                if "shards" in meta and int(meta["shards"]) != settings.shards:
                    raise ValueError(
                        f"database {settings.database} has {meta['shards']} message shards; "
                        f"refusing to migrate with shards={settings.shards}"
                    )
                if int(meta.get("schema_version", 0)) > SCHEMA_VERSION:
                    raise ValueError("the database schema is newer than this imgw: upgrade imgw")
            for stmt in ddl(settings.shards):
                await cur.execute(stmt)
            done.append(f"tables present ({settings.shards} message shards)")
            for table, column, definition in UPGRADES:
                await cur.execute(
                    "SELECT 1 FROM information_schema.columns WHERE table_schema=%s "
                    "AND table_name=%s AND column_name=%s",
                    (settings.database, table, column),
                )
                if await cur.fetchone() is None:
                    await cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
                    done.append(f"added {table}.{column}")
            await cur.execute(
                "INSERT INTO im_meta (name, value) VALUES ('schema_version', %s), "
                "('shards', %s) ON DUPLICATE KEY UPDATE value=VALUES(value)",
                (str(SCHEMA_VERSION), str(settings.shards)),
            )
    finally:
        conn.close()
    return done


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
        self._pool: Any = None  # asyncmy.pool.Pool
        self._shards = settings.shards
        self._durability: dict[str, str] = {}
        self._syncs: list[_SyncAsk] = []  # asked in this loop iteration
        self._sync_tasks: set[asyncio.Task[None]] = set()
        self._outbox = MySQLOutbox(self)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        try:
            self._pool = await asyncio.wait_for(
                asyncmy.create_pool(
                    host=s.host, port=s.port, user=s.user, password=s.password,
                    database=s.database,
                    minsize=1, maxsize=s.pool, autocommit=True, charset="utf8mb4",
                    connect_timeout=s.timeout_s, pool_recycle=3600,
                ),
                timeout=s.timeout_s * 2,
            )  # fmt: skip
        except (db_errors.Error, OSError, TimeoutError) as e:
            hint = (
                "create it with `imgw db migrate --store mysql://...`"
                if "1049" in str(e)
                else "is the server up and the URL right?"
            )
            raise StoreUnavailable(
                f"cannot open MySQL {s.user}@{s.host}:{s.port}/{s.database}: {e}; {hint}"
            ) from e

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
        if self._pool is not None:
            self._pool.close()
            await self._pool.wait_closed()

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
            return int(cur.rowcount)

        return await self._run(body)

    def durability(self) -> dict[str, str]:
        return {"engine": "mysql", **self._durability}

    def outbox(self) -> MySQLOutbox:
        return self._outbox

    def shard_of(self, conv_id: int) -> str:
        return message_table(conv_id % self._shards)

    # -- transactions ------------------------------------------------------------------

    @asynccontextmanager
    async def _conn(self) -> Any:
        pool = self._pool
        if pool is None:
            raise StoreUnavailable("MySQL store not started")
        try:
            conn = await asyncio.wait_for(pool.acquire(), self.settings.timeout_s)
        except (db_errors.Error, OSError, TimeoutError) as e:
            raise StoreUnavailable(f"MySQL unavailable: {e!r}") from e
        healthy = False
        try:
            yield conn
            healthy = True
        finally:
            if not healthy:
                conn.close()  # unknown state (cancelled, broken): never reuse it
            pool.release(conn)

    async def _run(
        self,
        body: Callable[[Cursor], Awaitable[T]],
        *,
        tx: bool = True,
        own_tx: bool = False,
        watch: _CommitWatch | None = None,
    ) -> T:
        """Run `body` in one transaction (or, `tx=False`, as autocommit reads: one round
        trip each, no COMMIT), retrying transient conflicts; bounded by the timeout.
        `own_tx`: the body sends BEGIN itself, inside its first multi-statement round
        trip; COMMIT is always a round trip of its own, so a body given up on (its
        timeout) can never commit later: a COMMIT queued behind a statement waiting on a
        lock would still run after the client closed the connection. `watch` records
        whether a COMMIT went unanswered (see `_CommitWatch`)."""
        for attempt in range(_MAX_ATTEMPTS):
            if watch is not None:
                watch.unanswered = False
            try:
                async with self._conn() as conn, conn.cursor() as cur:
                    try:
                        async with asyncio.timeout(self.settings.timeout_s):
                            if not tx:
                                return await body(cur)
                            if not own_tx:  # else the body's queries begin it
                                await conn.begin()
                            result = await body(cur)
                            await self._commit(conn, watch)
                            return result
                    except BaseException:
                        if tx and conn.connected:
                            try:
                                async with asyncio.timeout(1.0):
                                    await conn.rollback()
                            except Exception:
                                conn.close()
                        raise
            except db_errors.MySQLError as e:
                errno = e.args[0] if e.args and isinstance(e.args[0], int) else 0
                if errno in _RETRY_ERRNOS and attempt + 1 < _MAX_ATTEMPTS:
                    await asyncio.sleep(0.002 * (attempt + 1))
                    continue
                if isinstance(e, db_errors.OperationalError | db_errors.InterfaceError):
                    await self._forget_idle_connections()
                    raise StoreUnavailable(f"MySQL: {e}") from e
                if errno in _RETRY_ERRNOS:
                    raise StoreUnavailable(f"MySQL kept conflicting: {e}") from e
                if watch is not None and watch.unanswered:
                    raise StoreUnavailable(f"MySQL: COMMIT failed: {e!r}") from e
                raise
            except (TimeoutError, OSError, ConnectionError) as e:
                await self._forget_idle_connections()
                raise StoreUnavailable(f"MySQL: {e!r}") from e
            except Exception as e:
                if watch is not None and watch.unanswered:  # whatever broke the link
                    await self._forget_idle_connections()
                    raise StoreUnavailable(f"MySQL: COMMIT failed: {e!r}") from e
                raise
        raise AssertionError("unreachable")

    @staticmethod
    async def _commit(conn: Any, watch: _CommitWatch | None) -> None:
        if watch is None:
            await conn.commit()
            return
        watch.thread_id = conn.thread_id()
        watch.unanswered = True
        try:
            await conn.commit()
        except db_errors.MySQLError as e:
            errno = e.args[0] if e.args and isinstance(e.args[0], int) else 0
            if 0 < errno < 2000:  # the server answered with an error: not committed
                watch.unanswered = False
            raise
        watch.unanswered = False

    async def _fence(self, thread_id: int) -> None:
        """Make sure the server thread whose COMMIT went unanswered is gone, so that the
        COMMIT can no longer land (a delayed packet reaching a live thread would commit
        it): KILL it from another connection and wait until the server no longer lists
        it. Raises StoreUnavailable when that cannot be done within the timeout."""

        async def q(cur: Cursor) -> None:
            try:
                await cur.execute(f"KILL CONNECTION {thread_id:d}")
            except db_errors.MySQLError as e:
                if not (e.args and e.args[0] == _UNKNOWN_THREAD):
                    raise
            while True:
                await cur.execute(
                    f"SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = {thread_id:d}"
                )
                if not await cur.fetchall():
                    return
                await asyncio.sleep(0.02)

        await self._run(q, tx=False)

    async def _forget_idle_connections(self) -> None:
        """After a connection failure the pooled idle connections are likely dead too
        (server restarted, network cut): close them so the next operations reconnect
        instead of failing one by one."""
        if self._pool is not None:
            await self._pool.clear()

    async def _next_seq(self, cur: Cursor, conv_id: int, now: int) -> int:
        """One seq for a server-written message, under the seq row lock (held until
        commit)."""
        await cur.execute(sql.lock_seqs([conv_id]))
        row = await cur.fetchone()
        seq = (int(row[1]) if row else 0) + 1
        await cur.execute(sql.set_seqs({conv_id: seq}, now))
        return seq

    def _insert_sql(self, msgs: Sequence[StoredMessage]) -> list[str]:
        """One multi-row INSERT per shard."""
        by_shard: dict[str, list[StoredMessage]] = defaultdict(list)
        for m in msgs:
            by_shard[self.shard_of(m.conv_id)].append(m)
        return [st for table, rows in by_shard.items() for st in sql.insert_messages(table, rows)]

    async def _insert_messages(self, cur: Cursor, msgs: Sequence[StoredMessage]) -> None:
        for statement in self._insert_sql(msgs):
            await cur.execute(statement)

    async def _system(
        self, cur: Cursor, conv_id: int, event: dict[str, Any], now: int, *, new: bool = False
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
            event = {"event": "created", "by": owner, "uids": members, "title": title}
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
                change = {"event": event, "by": by, "uids": uids}
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

    # -- messages ------------------------------------------------------------------------

    async def _find_sent_in(
        self, cur: Cursor, keys: Sequence[tuple[int, str]]
    ) -> dict[tuple[int, str], StoredMessage]:
        if not keys:
            return {}
        await cur.execute(sql.find_sent(keys))
        return await self._load_sent(cur, await cur.fetchall())

    async def _load_sent(
        self, cur: Cursor, rows: Sequence[Sequence[Any]]
    ) -> dict[tuple[int, str], StoredMessage]:
        """The messages of idempotency records (sender, client_msg_id, conv_id, seq):
        one round trip each, which only resends pay."""
        found: dict[tuple[int, str], StoredMessage] = {}
        for sender, cmid, conv_id, seq in rows:
            await cur.execute(
                f"SELECT {_MSG_COLS} FROM {self.shard_of(int(conv_id))} "
                f"WHERE conv_id={int(conv_id)} AND seq={int(seq)}"
            )
            row = await cur.fetchone()
            if row is not None:
                found[(int(sender), bytes(cmid).decode())] = _msg(row)
        return found

    async def append(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        attempt_ms: list[int] = []  # the commit time of the last attempt

        async def body(cur: Cursor) -> list[AppendResult]:
            # Three round trips: [BEGIN; idempotency records; lock the seq rows; current
            # members], [seqs; one INSERT per shard; idempotency records], COMMIT.
            now = self._clock()
            attempt_ms[:] = [now]
            keys = list({(m.sender_uid, m.client_msg_id) for m in batch})
            convs = {m.conv_id for m in batch}
            await cur.execute(
                ";".join(
                    ("BEGIN", sql.find_sent(keys), sql.lock_seqs(convs), sql.current_members(convs))
                )
            )
            sent_rows = await _next_rows(cur)
            top = {int(c): int(m) for c, m in await _next_rows(cur)}
            members: dict[int, list[int]] = defaultdict(list)
            for c, u in await _next_rows(cur):
                members[int(c)].append(int(u))
            prior = await self._load_sent(cur, sent_rows) if sent_rows else {}
            plan = plan_append(batch, prior, members)
            stored: dict[int, StoredMessage] = {}
            for i in plan.store:
                m = batch[i]
                top[m.conv_id] += 1
                stored[i] = StoredMessage(
                    m.conv_id, top[m.conv_id], self._ids.next_id(now), m.sender_uid,
                    m.msg_type, m.content, now, m.client_msg_id,
                )  # fmt: skip
            outbox_id = 0
            if stored:
                msgs = list(stored.values())
                statements = [
                    sql.set_seqs({m.conv_id: top[m.conv_id] for m in msgs}, now),
                    *self._insert_sql(msgs),
                    sql.insert_sent(msgs, now),
                ]
                if node := self._outbox.node:  # the fan-out owed, in the same commit
                    outbox_id = self._ids.next_id(now)
                    statements.append(outbox_sql(outbox_id, node, msgs, now))
                for query in sql.queries(statements):  # one, unless the batch is huge
                    await cur.execute(query)
                    while await cur.nextset():  # each statement's result; errors raise
                        pass
            return append_results(batch, plan, prior, stored, members, outbox_id=outbox_id)

        watch = _CommitWatch()
        try:
            return await self._run(body, own_tx=True, watch=watch)
        except StoreUnavailable as failure:
            # An ERROR must never cover a stored message. A COMMIT sent without an answer
            # may still land (a packet held up in the network reaches the server later):
            # fence its server thread first, then ask what landed.
            try:
                if watch.unanswered and watch.thread_id:
                    await self._fence(watch.thread_id)
                landed = await self._landed(batch, attempt_ms[0] if attempt_ms else -1)
            except StoreUnavailable as e:
                if watch.unanswered:
                    raise StoreOutcomeUnknown(
                        f"MySQL did not answer a COMMIT and cannot be asked whether it "
                        f"landed ({failure}; then {e})"
                    ) from failure
                raise failure from None  # no COMMIT was sent: nothing can land
            if landed is None:
                raise failure from None
            return landed

    async def _landed(
        self, batch: Sequence[NewMessage], attempt_ms: int
    ) -> list[AppendResult] | None:
        """After a failure, once no COMMIT of it can land any more, ask what did: the
        results if the commit landed (stored messages answered as DUPLICATE: acked, not
        pushed — receivers pull them), None if it did not. StoreUnavailable if MySQL
        cannot be asked."""
        keys = list({(m.sender_uid, m.client_msg_id) for m in batch})
        found = await self._run(lambda cur: self._find_sent_in(cur, keys), tx=False)
        if not any(m.server_ms == attempt_ms for m in found.values()):
            return None  # nothing carries this attempt's commit time: it did not commit
        # not found: refused in that commit (NOT_MEMBER)
        return [resend_result(m, found.get((m.sender_uid, m.client_msg_id))) for m in batch]

    async def find_sent(self, sender_uid: int, client_msg_id: str) -> SentRecord | None:
        async def q(cur: Cursor) -> StoredMessage | None:
            found = await self._find_sent_in(cur, [(sender_uid, client_msg_id)])
            return found.get((sender_uid, client_msg_id))

        msg = await self._run(q, tx=False)
        return None if msg is None else SentRecord.of(msg)

    async def read_after(
        self, conv_id: int, after_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        lo = max(after_seq + 1, min_seq)
        hi = max_seq if max_seq is not None else (1 << 64) - 1

        async def q(cur: Cursor) -> list[Any]:
            await cur.execute(
                f"SELECT {_MSG_COLS} FROM {self.shard_of(conv_id)} WHERE conv_id=%s "
                "AND seq BETWEEN %s AND %s ORDER BY seq LIMIT %s",
                (conv_id, min(lo, (1 << 64) - 1), hi, limit + 1),
            )
            return list(await cur.fetchall())

        rows = await self._run(q, tx=False)
        return [_msg(r) for r in rows[:limit]], len(rows) > limit

    async def read_before(
        self, conv_id: int, before_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        hi = (1 << 64) - 1 if before_seq == 0 else before_seq - 1
        if max_seq is not None:
            hi = min(hi, max_seq)

        async def q(cur: Cursor) -> list[Any]:
            await cur.execute(
                f"SELECT {_MSG_COLS} FROM {self.shard_of(conv_id)} WHERE conv_id=%s "
                "AND seq BETWEEN %s AND %s ORDER BY seq DESC LIMIT %s",
                (conv_id, min_seq, hi, limit + 1),
            )
            return list(await cur.fetchall())

        rows = await self._run(q, tx=False)
        return [_msg(r) for r in reversed(rows[:limit])], len(rows) > limit

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
            return target if cur.rowcount else None

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
            params: list[Any] = []
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
            return target if cur.rowcount else None

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
        SYNCs asked for in one event-loop iteration share round trips (up to
        SYNC_BATCH_MAX a query): after a mass reconnect thousands arrive at once, and one
        pooled connection per SYNC, held while a saturated loop got round to each reply,
        left them queueing until the store timeout answered `unavailable`."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SyncPage] = loop.create_future()
        self._syncs.append(_SyncAsk(uid, device, changed_since_ms, after, limit, fut))
        if len(self._syncs) == 1:
            loop.call_soon(self._flush_syncs)
        return await fut

    def _flush_syncs(self) -> None:
        asks, self._syncs = self._syncs, []
        loop = asyncio.get_running_loop()
        for i in range(0, len(asks), SYNC_BATCH_MAX):
            task = loop.create_task(self._sync_batch(asks[i : i + SYNC_BATCH_MAX]))
            self._sync_tasks.add(task)
            task.add_done_callback(self._sync_tasks.discard)

    async def _sync_batch(self, asks: list[_SyncAsk]) -> None:
        async def q(cur: Cursor) -> tuple[list[list[Any]], list[dict[int, int]]]:
            await cur.execute(";".join(cur.mogrify(*a.query()) for a in asks))
            pages = [list(await cur.fetchall())]
            for _ in asks[1:]:
                pages.append(list(await _next_rows(cur)))
            return pages, await self._unread(cur, asks, pages)

        try:
            pages, unread = await self._run(q, tx=False)
        except Exception as e:
            for a in asks:
                if not a.fut.done():  # a fresh exception each: raised in many tasks
                    a.fut.set_exception(
                        StoreUnavailable(str(e)) if isinstance(e, StoreUnavailable) else e
                    )
            return
        except BaseException:
            for a in asks:
                a.fut.cancel()
            raise
        for a, rows, counts in zip(asks, pages, unread, strict=True):
            page = [_sync_row(r, counts) for r in rows[: a.limit]]
            if not a.fut.done():
                a.fut.set_result(SyncPage(page, len(rows) > a.limit))

    async def _unread(
        self, cur: Cursor, asks: Sequence[_SyncAsk], pages: Sequence[Sequence[Any]]
    ) -> list[dict[int, int]]:
        """Unread counts of every page: range scans of (conv_id, seq), one query per
        shard per user, all in one round trip (more only past 1 MiB of SQL)."""
        statements: list[str] = []
        owner: list[int] = []  # the ask each statement counts for
        for n, (a, rows) in enumerate(zip(asks, pages, strict=True)):
            by_shard: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
            for r in rows[: a.limit]:
                conv_id, max_seq, read_seq = int(r[0]), int(r[2]), int(r[3])
                if max_seq > read_seq:
                    by_shard[self.shard_of(conv_id)].append((conv_id, read_seq, max_seq))
            for table, ranges in by_shard.items():
                statements.append(sql.unread_counts(table, a.uid, ranges))
                owner.append(n)
        counts: list[dict[int, int]] = [{} for _ in asks]
        k = 0
        for query in sql.queries(statements):
            await cur.execute(query)
            for m in range(query.count(";") + 1):
                rows = await cur.fetchall() if m == 0 else await _next_rows(cur)
                counts[owner[k]].update({int(c): int(n) for c, n in rows})
                k += 1
        return counts

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
