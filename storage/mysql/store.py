"""The MySQL/MariaDB ChatStore: the authority.

On its own it is a complete store (what runs when Redis is down); the production store
puts the Redis accelerator in front of it. Its parts, in storage/mysql/:

- settings.py: `MySQLSettings`, from a `mysql://` URL;
- schema.py: the tables, and `migrate` (`imgw db migrate`);
- transactions.py: the pool and the transaction runner (retries, `StoreUnavailable`,
  the COMMIT watch and fence);
- append.py: the group commit of a send batch (seqs under the seq row lock; see there);
- sync.py: SYNC pages, coalesced per event-loop iteration;
- sql.py: SQL text built from literals; outbox.py: the transactional outbox;
- hook rows (storage/hooks.py): written beside each stored message, read here;
- shardmap.py: which server holds which message shards.

With a shard map (several servers), every row a send's commit depends on lives on the
server of the conversation's shard: its messages, seq row, member rows, idempotency
records, delivered cursors, the outbox rows of its commits, the hook rows of its
messages, and a copy of its conversation row. The metadata database keeps the map,
conv_id allocation (and p2p uniqueness), the node leases, and rows no commit reads:
token revocations, media uploads, push registrations and mutes (push.py). A
conversation's operations go to its server; a user's (SYNC, counts) ask every server at
once and merge (a SYNC without a server that is down: health.py). A send batch
spanning servers is one transaction per server, committed concurrently
(docs/decisions.md).

Seqs within a conversation follow commit order exactly (seq blocks leased from Redis, the
usual alternative, cannot give that across workers: two workers holding seqs 5 and 6 may
commit 6 first; see docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import msgpack
from asyncmy import errors as db_errors

from protocol.ops import ConvKind, MsgType
from storage.archive import tiered
from storage.archive.index_sqlite import FILES_SQL, ArchiveFile, indexed_files
from storage.badges import (
    RANGES_PER_QUERY,
    BadgeCounts,
    Plan,
    Span,
    Window,
    count_sql,
    spans,
    windows_sql,
)
from storage.errors import StoreUnavailable
from storage.hooks import (
    ADOPT_ROWS_PER_QUERY,
    DONE_KEYS_PER_QUERY,
    HOOK_BACKLOG_CAP,
    batches,
    oldest_first,
)
from storage.membership import plan_change, shown_up_sql, start_read_seq
from storage.models import (
    AppendFailed,
    AppendResult,
    AppendStatus,
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
    SystemEvent,
)
from storage.mysql import sql
from storage.mysql.append import GroupCommit, load_sent
from storage.mysql.health import ServerHealth
from storage.mysql.lease import Lease, default_owner
from storage.mysql.outbox import MySQLOutbox, ShardedOutbox
from storage.mysql.push import MySQLPushRegistry
from storage.mysql.revocations import MySQLRevocationLog
from storage.mysql.schema import SCHEMA_VERSION, message_table, read_map
from storage.mysql.settings import MySQLSettings
from storage.mysql.shardmap import (
    ShardRange,
    owners,
    replica_settings,
    same_place,
    server_settings,
)
from storage.mysql.sync import SyncBatcher
from storage.mysql.transactions import Cursor, Row, Transactions, next_rows, rowcount
from storage.push import chunks
from storage.rules import (
    RecallTarget,
    SendKey,
    recall_content,
    recall_refusal,
    reused_elsewhere,
)
from storage.snowflake import Snowflake

DEDUP_KEEP_MS: Final = 48 * 3600 * 1000
# Pruning (maintain): one node at a time, the holder of the lease PRUNE_LEASE, which it
# renews at each call (the node calls about once a minute: the lease outlives two
# missed calls); batches of PRUNE_BATCH rows per server, each followed by a pause so
# that deleting takes at most PRUNE_DUTY of the time (and at least PRUNE_PAUSE_S), for
# PRUNE_BUDGET_S at most a call: a large backlog drains over several calls without a
# long transaction or a burst that would hold up sends (docs/decisions.md,
# "Pruning by one node, under a lease in MySQL": send p99 with pruning on and off).
PRUNE_LEASE: Final = "prune"
PRUNE_LEASE_TTL_MS: Final = 150_000
PRUNE_BATCH: Final = 500
PRUNE_PAUSE_S: Final = 0.05
PRUNE_DUTY: Final = 0.05
PRUNE_BUDGET_S: Final = 45.0
MAP_POLL_S: Final = 1.0  # how often a store reads the shard map
MAP_RECHECK_S: Final = 0.05  # and at once (this long after its last read) when a shard moved
REPLICA_PAUSE_S: Final = 10.0  # after a replica failed, pages come from the primary
REUSE_CHECK_S: Final = 0.5  # how long a send batch waits for a server's key reuse check
T = TypeVar("T")
R = TypeVar("R", bound=tuple[int, ...] | tuple[int, int, str, int, int])


@dataclass(slots=True)
class PruneReport:
    """What a prune did: idempotency records and archived sends deleted, batches."""

    dedup: int = 0
    sent: int = 0
    batches: int = 0
    done: bool = False  # False: stopped by its time budget, more is due


@dataclass(slots=True)
class _Server:
    """One server holding message shards, with what runs on it."""

    db: Transactions
    appends: GroupCommit
    syncs: SyncBatcher
    outbox: MySQLOutbox
    health: ServerHealth  # down after it could not be reached, until a probe answers
    replica: Transactions | None = None  # its read replica, for PULL/HISTORY pages
    replica_paused_until: float = 0.0  # monotonic: after a failure, the primary answers
    check_paused_until: float = 0.0  # monotonic: after a failed key reuse check


def _retrieved(task: asyncio.Future[list[Row]]) -> None:
    """Take a left-out task's outcome, so that its exception is not reported."""
    if not task.cancelled():
        task.exception()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _health(db: Transactions, on_up: Callable[[], None]) -> ServerHealth:
    """The health of the server `db` reaches, probed with `SELECT 1`."""

    async def ping() -> None:
        async def q(cur: Cursor) -> None:
            await cur.execute("SELECT 1")
            await cur.fetchall()

        await db.run(q, tx=False)

    s = db.settings
    return ServerHealth(f"{s.host}:{s.port}", ping, on_up)


class MySQLStore:
    # Four commits at once, each on its own connection: at 10,000 msg/s on one worker,
    # p99 send->ACK 44-52 ms against 73-98 ms with two (commits queued behind both
    # slots; docs/decisions.md, "A group commit waits for its batch only when the rate can
    # fill it"), and no cost at
    # 2,000 or 6,000 msg/s.
    commit_slots = 4

    def __init__(
        self,
        settings: MySQLSettings,
        *,
        ids: Snowflake | None = None,
        clock: Callable[[], int] = _now_ms,
        lease_owner: str | None = None,
        prune_lease_ttl_ms: int = PRUNE_LEASE_TTL_MS,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._ids = ids or Snowflake(0)
        self._db = Transactions(settings)
        self._run = self._db.run
        self._shards = settings.shards
        # the housekeeping leader's lease (storage/mysql/lease.py)
        self.prune_lease = Lease(
            self._db, PRUNE_LEASE, lease_owner or default_owner(), prune_lease_ttl_ms
        )
        self._pruning = False
        self.last_prune = PruneReport(done=True)
        self._durability: dict[str, str] = {}
        self._outbox = MySQLOutbox(self._db, clock)
        # token revocations, in the metadata database (storage/revocations.py)
        self.revocations = MySQLRevocationLog(self._db)
        # push registrations and mutes, in the metadata database (storage/mysql/push.py)
        self._push = MySQLPushRegistry(self._db, clock)
        self._syncs = SyncBatcher(self._db, self.shard_of)
        self._appends = GroupCommit(self._db, self.shard_of, self._ids, clock, self._outbox)
        self._badges = BadgeCounts()  # push badges' last counts (storage/badges.py)
        # The metadata database's server; with no shard map, the only one.
        self._home = _Server(
            self._db, self._appends, self._syncs, self._outbox, _health(self._db, self._up)
        )
        replica = replica_settings(settings)
        if replica is not None:
            self._home.replica = Transactions(replica)
        self.replica_reads = 0  # pages read from a replica; refused as lagging; failed
        self.replica_lagging = 0
        self.reuse_check_failures = 0  # servers that missed a batch's key reuse check
        self.replica_failures = 0
        self._servers = [self._home]  # every server holding shards (from the map)
        self._server_of: list[_Server] = []  # per shard; empty: all on _home
        self.shard_map: list[ShardRange] = []  # as read at start (empty: single server)
        self._by_url: dict[str, _Server] = {}  # every server used since start
        # The outbox over every server; one server: exactly the MySQLOutbox's calls.
        self._sharded_outbox = ShardedOutbox(self._outbox, [self._outbox])
        self._hook_node = ""  # set: every stored message gets a hook row (storage/hooks.py)
        # Every server that held shards since start (and the metadata database): hook
        # rows stay where their message was stored, so every one is read.
        self._hook_servers = [self._home]
        self._watcher: asyncio.Task[None] | None = None
        self._map_stale = asyncio.Event()  # a write found its shard moved: read the map
        self._db.on_shard_moving = self._map_stale.set
        self.map_errors = 0  # failed reads of the shard map, and the last one's error
        self.last_map_error = ""
        self._up_listeners: list[Callable[[], None]] = []

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        await self._db.open()
        if self._home.replica is not None:
            await self._home.replica.open(lazy=True)

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
            self.shard_map = await read_map(cur)

        try:
            await self._run(inspect, tx=False)
        except db_errors.ProgrammingError as e:
            raise StoreUnavailable(
                f"database {s.database} has no imgw schema ({e}): run `imgw db migrate`"
            ) from e
        if self.shard_map:
            await self._apply_map(self.shard_map)
        self._watcher = asyncio.get_running_loop().create_task(self._watch_map())

    async def _apply_map(self, ranges: Sequence[ShardRange]) -> None:
        """Route by `ranges` from now on: a pool per server of the map (the metadata
        database's own, when it holds shards too), kept until the store closes. A
        server that does not answer now is tried again at each use: its conversations
        are unavailable, the others are not. An empty map: every shard at home."""
        if not ranges:
            self._server_of, self._servers = [], [self._home]
        else:
            owner = owners(ranges, self._shards)
            for url in dict.fromkeys(owner):
                if url not in self._by_url:
                    self._by_url[url] = await self._server_at(url)
            self._server_of = [self._by_url[u] for u in owner]
            self._servers = list({id(x): x for x in self._server_of}.values())
        self.shard_map = list(ranges)
        self._sharded_outbox.use([x.outbox for x in self._servers])
        for x in self._servers:
            if all(x is not y for y in self._hook_servers):
                self._hook_servers.append(x)

    async def _server_at(self, url: str) -> _Server:
        settings = server_settings(self.settings, url)
        replica_at = replica_settings(settings)
        home = same_place(settings, self.settings)
        if home and self._home.replica is not None:
            replica_at = None  # the one --store names wins
        replica = None if replica_at is None else Transactions(replica_at)
        if replica is not None:
            await replica.open(lazy=True)
        if home:
            if replica is not None:
                self._home.replica = replica  # the map names the home server's replica
            return self._home
        db = Transactions(settings)
        db.on_shard_moving = self._map_stale.set
        await db.open(lazy=True)
        outbox = MySQLOutbox(db, self._clock)
        outbox.record_for(self._outbox.node)  # "" unless a node records its fan-out
        appends = GroupCommit(db, self.shard_of, self._ids, self._clock, outbox)
        appends.hook_node = self._hook_node
        syncs = SyncBatcher(db, self.shard_of)
        return _Server(db, appends, syncs, outbox, _health(db, self._up), replica)

    def on_server_up(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever a shard server that was down answers again (a SYNC
        answered without it can now be answered whole)."""
        self._up_listeners.append(listener)

    def _up(self) -> None:
        for listener in self._up_listeners:
            listener()

    def servers_down(self) -> int:
        """How many of the servers holding shards are down now (storage/mysql/health.py)."""
        return sum(x.health.down for x in self._servers)

    async def _watch_map(self) -> None:
        """Follow the shard map (`imgw db add-server` changes it with the gateways
        running): read it every MAP_POLL_S, one small query to the metadata
        database, and at once when a write found its shard renamed away (the freeze of
        a moving shard: its writes go to the new server as soon as the map names it)."""
        while True:
            await asyncio.sleep(MAP_RECHECK_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(MAP_POLL_S - MAP_RECHECK_S):
                    await self._map_stale.wait()
            self._map_stale.clear()
            try:
                ranges = await self._db.run(read_map, tx=False)
                if ranges != self.shard_map:
                    await self._apply_map(ranges)
            except Exception as e:  # retried at the next poll
                self.map_errors += 1
                self.last_map_error = repr(e)

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # it expires anyway
            await self.prune_lease.release()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        for server in {id(x): x for x in [self._home, *self._by_url.values()]}.values():
            await server.health.close()
            if server is not self._home:
                await server.db.close()
            if server.replica is not None:
                await server.replica.close()
        await self._db.close()

    def now_ms(self) -> int:
        return self._clock()

    async def maintain(self) -> None:
        """Prune, if this store holds the prune lease (taking or renewing it); never
        two prunes of this store at once."""
        if self._pruning:
            return
        self._pruning = True
        try:
            if await self.prune_lease.take():
                self.last_prune = await self.prune()
        finally:
            self._pruning = False

    async def prune(
        self,
        *,
        keep_ms: int = DEDUP_KEEP_MS,
        batch: int = PRUNE_BATCH,
        pause_s: float = PRUNE_PAUSE_S,
        duty: float = PRUNE_DUTY,
        budget_s: float | None = PRUNE_BUDGET_S,
        on_batch: Callable[[PruneReport], None] | None = None,
    ) -> PruneReport:
        """Prune in batches of `batch` rows (per server and table) until nothing older
        than `keep_ms` is left or `budget_s` has passed, pausing between batches at
        least `pause_s`, and long enough that the batches take at most `duty` of the
        time (1: no pause beyond `pause_s`). Needs no lease: `imgw db prune` calls it
        directly."""
        if not 0 < duty <= 1:
            raise ValueError("duty must be in (0, 1]")
        loop = asyncio.get_running_loop()
        end = None if budget_s is None else loop.time() + budget_s
        report = PruneReport()
        while True:
            began = loop.time()
            parts = await self._each(lambda x: self._prune_server(x.db, keep_ms, batch))
            took = loop.time() - began
            report.batches += 1
            report.dedup += sum(d for d, _ in parts)
            report.sent += sum(s for _, s in parts)
            if on_batch is not None:
                on_batch(report)
            if all(d < batch and s < batch for d, s in parts):
                report.done = True
                return report
            if end is not None and loop.time() >= end:
                return report
            await asyncio.sleep(max(pause_s, took * (1 - duty) / duty))

    async def _split(
        self, rows: Sequence[R], write: Callable[[Transactions, Sequence[R]], Awaitable[None]]
    ) -> None:
        """`write` each server's part of `rows` (each row's first value is a conv_id)
        on that server, all at once."""
        parts: dict[int, list[R]] = defaultdict(list)
        servers: dict[int, _Server] = {}
        for r in rows:
            server = self._at(r[0])
            parts[id(server)].append(r)
            servers[id(server)] = server

        def part(k: int, part: Sequence[R]) -> Awaitable[None]:
            return self._on(servers[k], lambda x: write(x.db, part))

        outcomes = await asyncio.gather(
            *(part(k, p) for k, p in parts.items()), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _on(self, server: _Server, fn: Callable[[_Server], Awaitable[T]]) -> T:
        """`fn` on `server`, unless it is down (then StoreUnavailable at once); a failure
        that says it cannot be reached marks it down."""
        if server.health.down:
            raise server.health.error()
        try:
            return await fn(server)
        except StoreUnavailable as e:
            server.health.failed(e)
            raise

    def _at(self, conv_id: int) -> _Server:
        """The server holding conversation `conv_id`'s rows."""
        if not self._server_of:
            return self._home
        return self._server_of[conv_id % self._shards]

    async def _each(self, fn: Callable[[_Server], Awaitable[T]]) -> list[T]:
        """`fn` on every server holding shards, at once (one: just that)."""
        if len(self._servers) == 1:
            return [await fn(self._servers[0])]
        return list(await asyncio.gather(*(fn(x) for x in self._servers)))

    async def prune_dedup(self, *, keep_ms: int = DEDUP_KEEP_MS, limit: int = 10_000) -> int:
        """Delete idempotency records older than `keep_ms` (48 h: the protocol promises
        24), at most `limit` rows a call so no transaction grows large. Returns how many
        went. The message rows keep UNIQUE(conv_id, sender, client_msg_id) for good."""

        parts = await self._each(lambda x: self._prune_server(x.db, keep_ms, limit))
        return sum(d for d, _ in parts)

    async def _prune_server(self, db: Transactions, keep_ms: int, limit: int) -> tuple[int, int]:
        """One batch on one server: (idempotency records, archived sends) deleted."""

        async def body(cur: Cursor) -> tuple[int, int]:
            await cur.execute(
                "DELETE FROM im_send_dedup WHERE created_ms < %s LIMIT %s",
                (self._clock() - keep_ms, limit),
            )
            gone = rowcount(cur)
            await cur.execute(  # the records of archived sends (storage/archive)
                "DELETE FROM im_archive_sent WHERE send_ms < %s LIMIT %s",
                (self._clock() - keep_ms, limit),
            )
            return gone, rowcount(cur)

        return await db.run(body)

    def durability(self) -> dict[str, str]:
        return {"engine": "mysql", **self._durability}

    def outbox(self) -> ShardedOutbox:
        """The outbox, over every server of the shard map as it changes."""
        return self._sharded_outbox

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
        """Insert server-written messages (system, recall) and, when hooks are on, their
        hook rows, in the transaction of `cur` (on the conversation's server)."""
        for statement in sql.insert_sharded(msgs, self.shard_of):
            await cur.execute(statement)
        if node := self._hook_node:
            await cur.execute(sql.insert_hooks(msgs, node))

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

        return await self._at(conv_id).db.run(q, tx=False)

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

        return await self._at(conv_id).db.run(q, tx=False)

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

        return await self._at(conv_id).db.run(q, tx=False)

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
        remote: list[int] = []  # created_ms, when the conversation's server is another

        async def body(cur: Cursor) -> int:
            remote.clear()
            await cur.execute(
                "SELECT conv_id, created_ms FROM im_conversation "
                "WHERE kind=%s AND p2p_lo=%s AND p2p_hi=%s",
                (ConvKind.P2P, lo, hi),
            )
            row = await cur.fetchone()
            if row is not None:
                if self._at(int(row[0])) is not self._home:
                    remote.append(int(row[1]))
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
            if self._at(conv_id) is not self._home:
                remote.append(now)
                return conv_id
            await self._p2p_rows(cur, conv_id, lo, hi, now)
            return conv_id

        conv_id = await self._run(body)
        if remote:
            await self._ensure_remote_p2p(conv_id, lo, hi, remote[0])
        return conv_id

    async def _p2p_rows(
        self, cur: Cursor, conv_id: int, lo: int, hi: int, now: int, *, ignore: str = ""
    ) -> None:
        await cur.execute(sql.hold_shards([self.shard_of(conv_id)]))
        await cur.execute(
            f"INSERT {ignore}INTO im_conv_seq (conv_id, reserved_seq, max_seq, last_active_ms) "
            "VALUES (%s,0,0,%s)",
            (conv_id, now),
        )
        await cur.execute(
            f"INSERT {ignore}INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, "
            "updated_ms) VALUES (%s,%s,0,1,0,%s), (%s,%s,1,1,0,%s)",
            (conv_id, lo, now, conv_id, hi, now),
        )

    async def _ensure_remote_p2p(self, conv_id: int, lo: int, hi: int, created_ms: int) -> None:
        """The rows of a p2p conversation on its own server (not the metadata
        database's), created if missing: a first open that failed after allocating the
        conv_id left none, and the next open completes it."""
        run = self._at(conv_id).db.run

        async def present(cur: Cursor) -> bool:
            await cur.execute(f"SELECT 1 FROM im_conv_seq WHERE conv_id={int(conv_id)}")
            return await cur.fetchone() is not None

        if await run(present, tx=False):
            return

        async def create(cur: Cursor) -> None:
            await cur.execute(
                "INSERT IGNORE INTO im_conversation (conv_id, kind, p2p_lo, p2p_hi, created_ms) "
                "VALUES (%s,%s,%s,%s,%s)",
                (conv_id, ConvKind.P2P, lo, hi, created_ms),
            )
            await self._p2p_rows(cur, conv_id, lo, hi, created_ms, ignore="IGNORE ")

        await run(create)

    async def create_group(
        self, owner: int, title: str, uids: Sequence[int]
    ) -> tuple[int, StoredMessage]:
        members = list(dict.fromkeys([owner, *uids]))

        async def group_rows(cur: Cursor, conv_id: int, now: int) -> StoredMessage:
            event: SystemEvent = {"event": "created", "by": owner, "uids": members, "title": title}
            msg = await self._system(cur, conv_id, event, now, new=True)
            values = ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(members))
            params: list[int] = []
            for i, u in enumerate(members):
                params += [conv_id, u, i, msg.seq, start_read_seq(i, msg.seq), now]
            await cur.execute(
                "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, "
                f"updated_ms) VALUES {values}",
                params,
            )
            return msg

        async def body(cur: Cursor) -> tuple[int, int, StoredMessage | None]:
            now = self._clock()
            await cur.execute(
                "INSERT INTO im_conversation (kind, title, owner_uid, created_ms) "
                "VALUES (%s,%s,%s,%s)",
                (ConvKind.GROUP, title, owner, now),
            )
            conv_id = int(cur.lastrowid)
            if self._at(conv_id) is not self._home:
                return conv_id, now, None  # its rows go to its own server, below
            return conv_id, now, await group_rows(cur, conv_id, now)

        conv_id, now, msg = await self._run(body)
        if msg is not None:
            return conv_id, msg

        # On another server: the conversation row's copy there (the one membership
        # changes lock and update), then its seq, members and first message. If this
        # fails, the allocated conv_id stays unused (no members: nobody sees it).
        async def remote(cur: Cursor) -> StoredMessage:
            await cur.execute(
                "INSERT INTO im_conversation (conv_id, kind, title, owner_uid, created_ms) "
                "VALUES (%s,%s,%s,%s,%s)",
                (conv_id, ConvKind.GROUP, title, owner, now),
            )
            return await group_rows(cur, conv_id, now)

        return conv_id, await self._at(conv_id).db.run(remote)

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

        return await self._at(conv_id).db.run(body)

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

        return await self._at(conv_id).db.run(body)

    # -- messages ------------------------------------------------------------------------

    async def append(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        """The group commit (storage/mysql/append.py); with several servers,
        `_append_spread`."""
        if not self._server_of:
            return await self._appends.append(batch)
        return await self._append_spread(batch)

    async def _append_spread(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        """A batch spanning servers is one transaction per server, committed at once:
        each message's answer follows its own server's commit, and a server that fails
        answers FAILED for its messages only (all of a message's state is on its server:
        it is stored there or not); a server that is down (storage/mysql/health.py) is
        not waited for: its messages are FAILED at once. First, one query to every
        server for the batch's idempotency keys: a key used for another conversation is
        CONFLICT (each server's commit only sees its own records)."""
        results: list[AppendResult | None] = [None] * len(batch)
        if len(self._servers) > 1:
            for i in await self._reused(batch):
                results[i] = AppendResult(AppendStatus.CONFLICT)
        parts: dict[int, list[int]] = defaultdict(list)  # id(server) -> batch positions
        servers: dict[int, _Server] = {}
        for i, m in enumerate(batch):
            if results[i] is None:
                server = self._at(m.conv_id)
                parts[id(server)].append(i)
                servers[id(server)] = server
        if len(parts) == 1 and len(next(iter(parts.values()))) == len(batch):
            return await self._on(next(iter(servers.values())), lambda x: x.appends.append(batch))

        def part(k: int, idx: list[int]) -> Awaitable[list[AppendResult]]:
            return self._on(servers[k], lambda x: x.appends.append([batch[i] for i in idx]))

        outcomes = await asyncio.gather(
            *(part(k, idx) for k, idx in parts.items()), return_exceptions=True
        )
        for idx, outcome in zip(parts.values(), outcomes, strict=True):
            if isinstance(outcome, Exception):
                for i in idx:  # the caller raises it for these messages alone
                    results[i] = AppendFailed(AppendStatus.FAILED, error=outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                for i, r in zip(idx, outcome, strict=True):
                    results[i] = r
        return [r for r in results if r is not None]

    async def _reused(self, batch: Sequence[NewMessage]) -> list[int]:
        """The positions of `batch` whose key was used for another conversation
        (storage.rules.reused_elsewhere), from every server's idempotency records at
        once. Best effort, so that a server in trouble does not hold up the others'
        sends: a server that fails or has not answered within REUSE_CHECK_S is left out
        and not asked again for REPLICA_PAUSE_S (counted in `reuse_check_failures`);
        and two concurrent first sends of one key to conversations on two servers may
        both be stored (docs/decisions.md)."""
        keys = list({(m.sender_uid, m.client_msg_id) for m in batch})

        async def q(cur: Cursor) -> list[Row]:
            await cur.execute(sql.find_sent(keys))
            return list(await cur.fetchall())

        now = time.monotonic()
        asked = [x for x in self._servers if now >= x.check_paused_until and not x.health.down]
        tasks = [asyncio.ensure_future(x.db.run(q, tx=False)) for x in asked]
        if tasks:
            await asyncio.wait(tasks, timeout=REUSE_CHECK_S)
        recorded: dict[SendKey, set[int]] = defaultdict(set)
        for server, task in zip(asked, tasks, strict=True):
            if not task.done() or task.cancelled() or task.exception() is not None:
                task.add_done_callback(_retrieved)  # a straggler ends on its own timeout
                server.check_paused_until = now + REPLICA_PAUSE_S
                self.reuse_check_failures += 1
                continue
            for sender, cmid, conv_id, _ in task.result():
                recorded[(int(sender), bytes(cmid).decode())].add(int(conv_id))
        return reused_elsewhere(batch, recorded, self._at)

    async def find_sent(self, sender_uid: int, client_msg_id: str) -> SentRecord | None:
        """The idempotency record of a send: on the server of its conversation, which
        the key does not say, so every server is asked. A record is taken only from the
        server that holds its conversation now (a move leaves a copy on the old server
        for a grace period, next to a renamed message table)."""
        key = (sender_uid, client_msg_id)

        async def on(server: _Server) -> StoredMessage | None:
            async def q(cur: Cursor) -> StoredMessage | None:
                await cur.execute(sql.find_sent([key]))
                rows = [r for r in await cur.fetchall() if self._at(int(r[2])) is server]
                found = await load_sent(cur, rows, self.shard_of) if rows else {}
                return found.get(key)

            return await server.db.run(q, tx=False)

        found = await self._each(on)
        msg = next((m for m in found if m is not None), None)
        return None if msg is None else SentRecord.of(msg)

    async def read_after(
        self, conv_id: int, after_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        lo = max(after_seq + 1, min_seq)
        hi = max_seq if max_seq is not None else (1 << 64) - 1

        rows, top = await self._hot_page(
            conv_id,
            f"SELECT {sql.MSG_COLS} FROM {self.shard_of(conv_id)} WHERE conv_id=%s "
            "AND seq BETWEEN %s AND %s ORDER BY seq LIMIT %s",
            (conv_id, min(lo, (1 << 64) - 1), hi, limit + 1),
        )
        hot = [sql.message_of(r) for r in rows[:limit]], len(rows) > limit
        return await tiered.read_after(conv_id, lo, hi, limit, hot, self._archived, top)

    async def _hot_page(
        self, conv_id: int, query: str, params: tuple[int, ...]
    ) -> tuple[list[Row], int | None]:
        """The hot rows of a PULL/HISTORY page query and, when the primary answers, the
        conversation's highest archived seq (0: none) in the same round trip: a page
        needs the archive only below it (storage/archive/tiered.py). From a read
        replica (`_page`), the rows only (None: the archive index is asked if needed)."""
        server = self._at(conv_id)
        if server.replica is None:  # no read replica: one round trip

            async def both(cur: Cursor) -> tuple[list[Row], int]:
                await cur.execute(
                    cur.mogrify(query, params) + ";SELECT COALESCE(MAX(seq_hi), 0) "
                    f"FROM im_archive WHERE conv_id={int(conv_id)}"
                )
                rows = list(await cur.fetchall())
                return rows, int((await next_rows(cur))[0][0])

            return await server.db.run(both, tx=False)

        async def q(cur: Cursor) -> list[Row]:
            await cur.execute(query, params)
            return list(await cur.fetchall())

        return await self._page(server, conv_id, q), None

    async def _archived(self, conv_id: int, lo: int, hi: int) -> list[ArchiveFile]:
        """The archive files holding seqs lo..hi of the conversation (storage/archive),
        from its server's primary (the index commits with the hot delete there)."""

        async def q(cur: Cursor) -> list[ArchiveFile]:
            await cur.execute(FILES_SQL.format(p="%s"), (conv_id, hi, lo))
            return indexed_files(conv_id, await cur.fetchall())

        return await self._at(conv_id).db.run(q, tx=False)

    async def read_before(
        self, conv_id: int, before_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        hi = (1 << 64) - 1 if before_seq == 0 else before_seq - 1
        if max_seq is not None:
            hi = min(hi, max_seq)

        rows, top = await self._hot_page(
            conv_id,
            f"SELECT {sql.MSG_COLS} FROM {self.shard_of(conv_id)} WHERE conv_id=%s "
            "AND seq BETWEEN %s AND %s ORDER BY seq DESC LIMIT %s",
            (conv_id, min_seq, hi, limit + 1),
        )
        hot = [sql.message_of(r) for r in reversed(rows[:limit])], len(rows) > limit
        return await tiered.read_before(conv_id, min_seq, hi, limit, hot, self._archived, top)

    async def _page(
        self, server: _Server, conv_id: int, q: Callable[[Cursor], Awaitable[list[Row]]]
    ) -> list[Row]:
        """A PULL/HISTORY page: from the server's read replica when it has one and has
        applied every commit of the conversation the primary had when the page was
        asked for (its `im_conv_seq.max_seq` is at least the primary's: commits apply
        in order, so it then holds every message and recall up to there); else, or when
        the replica fails (it is then left alone for REPLICA_PAUSE_S), from the
        primary. Costs one primary-key read on the primary; the rows come from the
        replica."""
        replica = server.replica
        if replica is not None and time.monotonic() >= server.replica_paused_until:
            committed, _ = await server.db.run(self._bounds_q(conv_id), tx=False)

            async def caught_up(cur: Cursor) -> list[Row] | None:
                await cur.execute(f"SELECT max_seq FROM im_conv_seq WHERE conv_id={int(conv_id)}")
                row = await cur.fetchone()
                if row is None or int(row[0]) < committed:
                    return None
                return await q(cur)

            try:
                rows = await replica.run(caught_up, tx=False)
            except StoreUnavailable:
                server.replica_paused_until = time.monotonic() + REPLICA_PAUSE_S
                self.replica_failures += 1
            else:
                if rows is not None:
                    self.replica_reads += 1
                    return rows
                self.replica_lagging += 1
        return await server.db.run(q, tx=False)

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

        return await self._at(conv_id).db.run(body)

    # -- positions and sync ----------------------------------------------------------------

    async def max_seq(self, conv_id: int) -> int:
        async def q(cur: Cursor) -> int:
            await cur.execute("SELECT max_seq FROM im_conv_seq WHERE conv_id=%s", (conv_id,))
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        return await self._at(conv_id).db.run(q, tx=False)

    async def seq_bounds(self, conv_id: int) -> tuple[int, int]:
        """(committed max seq, highest recalled seq) of a conversation: one primary-key
        read."""
        return await self._at(conv_id).db.run(self._bounds_q(conv_id), tx=False)

    @staticmethod
    def _bounds_q(conv_id: int) -> Callable[[Cursor], Awaitable[tuple[int, int]]]:
        async def q(cur: Cursor) -> tuple[int, int]:
            await cur.execute(
                f"SELECT max_seq, recalled_seq FROM im_conv_seq WHERE conv_id={int(conv_id)}"
            )
            row = await cur.fetchone()
            return (int(row[0]), int(row[1])) if row else (0, 0)

        return q

    async def set_read(self, conv_id: int, uid: int, seq: int) -> int | None:
        async def body(cur: Cursor) -> int | None:
            await cur.execute(sql.hold_shards([self.shard_of(conv_id)]))
            await cur.execute("SELECT max_seq FROM im_conv_seq WHERE conv_id=%s", (conv_id,))
            row = await cur.fetchone()
            target = min(seq, int(row[0]) if row else 0)
            await cur.execute(
                "UPDATE im_conv_member SET read_seq=%s, updated_ms=%s WHERE conv_id=%s "
                "AND uid=%s AND read_seq<%s AND left_seq IS NULL",
                (target, self._clock(), conv_id, uid, target),
            )
            return target if rowcount(cur) else None

        return await self._at(conv_id).db.run(body)

    async def flush_reads(self, reads: Sequence[tuple[int, int, int, int]]) -> None:
        """Upsert read positions (conv_id, uid, seq, changed_ms) kept first in Redis; a
        position never moves back."""
        if not reads:
            return
        if not self._server_of:
            await self._flush_reads(self._db, reads)
        else:
            await self._split(reads, self._flush_reads)

    async def _flush_reads(
        self, db: Transactions, reads: Sequence[tuple[int, int, int, int]]
    ) -> None:
        async def body(cur: Cursor) -> None:
            await cur.execute(sql.hold_shards(self.shard_of(r[0]) for r in reads))
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

        await db.run(body)

    async def flush_delivered(self, cursors: Sequence[tuple[int, int, str, int, int]]) -> None:
        """Upsert delivered cursors (conv_id, uid, device, seq, changed_ms) in one
        statement; a cursor never moves back."""
        if not cursors:
            return
        if not self._server_of:
            await self._flush_delivered(self._db, cursors)
        else:
            await self._split(cursors, self._flush_delivered)

    async def _flush_delivered(
        self, db: Transactions, cursors: Sequence[tuple[int, int, str, int, int]]
    ) -> None:
        async def body(cur: Cursor) -> None:
            await cur.execute(sql.hold_shards(self.shard_of(c[0]) for c in cursors))
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

        await db.run(body)

    async def set_delivered(self, conv_id: int, uid: int, device: str, seq: int) -> int | None:
        async def body(cur: Cursor) -> int | None:
            await cur.execute(sql.hold_shards([self.shard_of(conv_id)]))
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

        return await self._at(conv_id).db.run(body)

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
        SYNCs asked together share round trips (storage/mysql/sync.py).
        With several servers each answers a page of its own conversations, at once, and
        the pages merge in the page order (last active, then conv_id, descending): each
        server's first `limit` rows hold every one of its rows the merged page can
        need. A server that is down or fails is left out: the page holds the others'
        rows and says how many servers are `missing` (all of them: StoreUnavailable)."""
        if len(self._servers) == 1:
            return await self._syncs.ask(
                uid, device, changed_since_ms=changed_since_ms, after=after, limit=limit
            )
        outcomes = await asyncio.gather(
            *(
                self._on(
                    x,
                    lambda x: x.syncs.ask(
                        uid, device, changed_since_ms=changed_since_ms, after=after, limit=limit
                    ),
                )
                for x in self._servers
            ),
            return_exceptions=True,
        )
        pages: list[SyncPage] = []
        missing: list[StoreUnavailable] = []
        for outcome in outcomes:
            if isinstance(outcome, StoreUnavailable):
                missing.append(outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                pages.append(outcome)
        if not pages:
            raise missing[0]
        rows = sorted(
            (r for p in pages for r in p.rows),
            key=lambda r: (r.last_active_ms, r.conv_id),
            reverse=True,
        )
        more = len(rows) > limit or any(p.has_more for p in pages)
        return SyncPage(rows[:limit], more, missing=len(missing), servers=len(outcomes))

    async def conversation_counts(self, uids: Sequence[int]) -> dict[int, int]:
        if not uids:
            return {}
        listed = sql.ints(set(uids))

        async def q(cur: Cursor) -> dict[int, int]:
            await cur.execute(
                "SELECT m.uid, COUNT(*) FROM im_conv_member m "
                "JOIN im_conversation c ON c.conv_id = m.conv_id "
                f"WHERE m.uid IN ({listed}) AND m.left_seq IS NULL "
                f"AND (c.kind = {int(ConvKind.P2P)} OR {shown_up_sql('m')}) GROUP BY m.uid"
            )
            return {int(u): int(n) for u, n in await cur.fetchall()}

        counts: dict[int, int] = defaultdict(int)
        for part in await self._each(lambda x: x.db.run(q, tx=False)):
            for u, n in part.items():
                counts[u] += n
        return dict(counts)

    async def shared_with(self, uid: int, others: Sequence[int]) -> set[int]:
        if not others:
            return set()
        marks = ",".join(["%s"] * len(others))

        async def q(cur: Cursor) -> set[int]:
            await cur.execute(
                "SELECT DISTINCT b.uid FROM im_conv_member a JOIN im_conv_member b "
                "ON a.conv_id = b.conv_id WHERE a.uid=%s AND a.left_seq IS NULL "
                f"AND b.left_seq IS NULL AND b.uid IN ({marks}) "
                f"AND {shown_up_sql('b')}",
                (uid, *others),
            )
            return {int(r[0]) for r in await cur.fetchall()}

        # a conversation's member and conversation rows are all on its server
        return set().union(*await self._each(lambda x: x.db.run(q, tx=False)))

    # -- hook rows (storage/hooks.py) -------------------------------------------------------

    def set_hook_node(self, node: str) -> None:
        self._hook_node = node
        for server in {id(x): x for x in [self._home, *self._by_url.values()]}.values():
            server.appends.hook_node = node

    async def _each_hook_server(self, fn: Callable[[Transactions], Awaitable[T]]) -> list[T]:
        """`fn` on every server that may hold hook rows, at once (one: just that)."""
        if len(self._hook_servers) == 1:
            return [await fn(self._hook_servers[0].db)]
        return list(await asyncio.gather(*(fn(x.db) for x in self._hook_servers)))

    async def hooks_of(self, node: str, limit: int) -> list[HookRow]:
        if limit <= 0:
            return []

        async def q(cur: Cursor) -> list[HookRow]:
            await cur.execute(
                "SELECT conv_id, seq, node, created_ms FROM im_hook WHERE node=%s "
                "ORDER BY created_ms, conv_id, seq LIMIT %s",
                (node, limit),
            )
            return [
                HookRow(int(c), int(s), str(n), int(ms)) for c, s, n, ms in await cur.fetchall()
            ]

        pages = await self._each_hook_server(lambda db: db.run(q, tx=False))
        if len(pages) == 1:
            return pages[0]
        return oldest_first([r for p in pages for r in p], limit)

    async def hooks_done(self, keys: Sequence[tuple[int, int]]) -> None:
        stored = [(c, s) for c, s in keys if 0 <= c < 1 << 64 and 0 <= s < 1 << 64]
        parts = batches(stored, DONE_KEYS_PER_QUERY)
        if not parts:
            return

        async def delete(db: Transactions) -> None:
            for part in parts:
                listed = ",".join(f"({c:d},{s:d})" for c, s in part)

                async def q(cur: Cursor, listed: str = listed) -> None:
                    await cur.execute(f"DELETE FROM im_hook WHERE (conv_id, seq) IN ({listed})")

                await db.run(q, tx=False)

        await self._each_hook_server(delete)

    async def hooks_adopt(self, from_node: str, to_node: str) -> int:
        if from_node == to_node:
            return 0

        async def adopt(db: Transactions) -> int:
            moved = 0
            while True:  # in batches: no transaction holds a dead node's whole backlog

                async def q(cur: Cursor) -> int:
                    # forced: with a LIMIT, MariaDB would rather walk the primary
                    # key, reading other nodes' rows, than the node's range of k_node
                    await cur.execute(
                        "UPDATE im_hook FORCE INDEX (k_node) SET node=%s WHERE node=%s LIMIT %s",
                        (to_node, from_node, ADOPT_ROWS_PER_QUERY),
                    )
                    return rowcount(cur)

                n = await db.run(q, tx=False)
                moved += n
                if n < ADOPT_ROWS_PER_QUERY:
                    return moved

        return sum(await self._each_hook_server(adopt))

    async def hooks_backlog(self) -> tuple[int, int]:
        async def q(cur: Cursor) -> tuple[int, int]:
            # a bounded count; each node's oldest row, one index dive per node (MariaDB's
            # loose index scan: "Using index for group-by")
            await cur.execute(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM im_hook LIMIT {HOOK_BACKLOG_CAP:d}) "
                "AS pending;SELECT node, MIN(created_ms) FROM im_hook GROUP BY node"
            )
            (count,) = await cur.fetchone()
            firsts = [int(ms) for _, ms in await next_rows(cur)]
            return int(count), min(firsts, default=0)

        parts = await self._each_hook_server(lambda db: db.run(q, tx=False))
        count = min(sum(c for c, _ in parts), HOOK_BACKLOG_CAP)
        return count, min((ms for c, ms in parts if c), default=0)

    # -- offline push (storage/mysql/push.py) ---------------------------------------------

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
        return await self._push.register(
            uid, device, provider, token, preview=preview, locale=locale, max_devices=max_devices
        )

    async def push_unregister(self, uid: int, device: str) -> bool:
        return await self._push.unregister(uid, device)

    async def push_devices(self, uids: Sequence[int]) -> dict[int, list[PushDevice]]:
        return await self._push.devices(uids)

    async def push_delete(self, provider: str, token: str) -> bool:
        return await self._push.delete_token(provider, token)

    async def set_mute(self, conv_id: int, uid: int, until_ms: int) -> None:
        await self._push.set_mute(conv_id, uid, until_ms)

    async def muted(self, pairs: Sequence[tuple[int, int]], now_ms: int) -> set[tuple[int, int]]:
        return await self._push.muted(pairs, now_ms)

    async def unread_badges(self, uids: Sequence[int]) -> dict[int, int]:
        """Each server lists the windows of its own conversations and counts them, one
        statement per shard in one round trip (storage/badges.py); a uid's badge keeps
        its BADGE_CONVS most recently active windows of them all."""
        parts = chunks(uids)
        if not parts:
            return {}

        async def q(cur: Cursor) -> list[Plan]:
            windows: list[Window] = []
            for part in parts:
                await cur.execute(windows_sql(len(part), "%s", greatest="GREATEST"), part)
                windows.extend(
                    Window(int(u), int(c), int(a), int(lo), int(hi))
                    for u, a, c, lo, hi in await cur.fetchall()
                )
            plans = self._badges.plan(windows)
            by_shard: dict[str, list[Span]] = defaultdict(list)
            for span in spans(plans):
                by_shard[self.shard_of(span[1])].append(span)
            statements: list[str] = []
            order: list[Span] = []
            for table, found in by_shard.items():
                for i in range(0, len(found), RANGES_PER_QUERY):
                    part_spans = found[i : i + RANGES_PER_QUERY]
                    statements.append(count_sql(part_spans, table, len(order)))
                    order += part_spans
            for query in sql.queries(statements):
                await cur.execute(query)
                for m in range(query.count(";") + 1):
                    rows = await cur.fetchall() if m == 0 else await next_rows(cur)
                    counted.update((order[int(k)], int(n)) for k, n in rows)
            return plans

        counted: dict[Span, int] = {}
        found: list[list[Plan]] = await self._each(lambda x: x.db.run(q, tx=False))
        return self._badges.badges([p for plans in found for p in plans], counted)
