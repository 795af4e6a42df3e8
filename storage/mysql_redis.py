"""The production ChatStore: MySQL is the authority, Redis the accelerator.

Every Redis key can vanish at any moment without losing or duplicating a message: each
read that Redis answers has a MySQL fallback, and nothing is acknowledged on Redis'
word alone. While Redis is down every operation goes to MySQL (slower, still correct);
when it returns, the fast path resumes by itself.

What Redis holds here (see storage/redis/cache.py for the keys):
- member snapshots, versioned by the conversation's last membership seq, so a member
  check costs one Redis read and a stale snapshot can never overwrite a newer one;
- idempotency records, cache-aside: a resend found in MySQL is remembered, so a client
  retrying the same send again and again costs MySQL once (writing a record per message
  on the send path cost 12 % of the worker's CPU at 6,000 msg/s, for a rare path);
- read and delivered positions: written to Redis first and flushed to MySQL in batches
  (every FLUSH_EVERY_S, at most 3 s), positions only ever move forward;
- the last 200 messages of each conversation (storage/redis/recent.py). A group's
  messages (`WRITE_THROUGH_MEMBERS` members or more: many readers, most of them catching
  up later) are written after each group commit in one round trip; a p2p conversation's
  are cached when a page of them is read from MySQL (read-through): its messages are
  PUSHed to the one peer and rarely read again, and writing each one cost Redis 50 to
  75 % of its CPU per message (docs/decisions.md, "The recent-message cache proves each
  page"). PULL and HISTORY pages
  inside the cache are answered from Redis; MySQL then answers only a primary-key read
  of the committed max seq and the highest recalled seq, which is what proves that the
  cache holds every message of the page as it now stands (a cache write that failed
  leaves the cache behind the committed seqs, a recall may leave an original in it: such
  pages come from MySQL).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from typing import Final

import structlog

from storage.errors import BackendUnavailable, CacheUnavailable, StoreUnavailable
from storage.models import (
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
)
from storage.mysql import MySQLStore
from storage.ports import Outbox
from storage.redis.cache import MemberSnapshot, RedisCache
from storage.redis.recent import RecentCache

FLUSH_EVERY_S: Final = 1.0
MAX_CACHE_WRITES: Final = 64  # recent-cache writes in flight
# Conversations of this many members or more have their messages written to the recent
# cache at commit; smaller ones (p2p) are cached when a page of them is read.
WRITE_THROUGH_MEMBERS: Final = 3
log = structlog.get_logger("imgw.store")


def _snapshot(conv_id: int, version: int, rows: Sequence[Membership]) -> MemberSnapshot:
    return MemberSnapshot(
        conv_id=conv_id,
        version=version,
        rows={m.uid: (m.joined_seq, m.left_seq) for m in rows},
        order=[m.uid for m in rows if m.left_seq is None],
    )


class MySQLRedisStore:
    commit_slots = MySQLStore.commit_slots

    def __init__(
        self, mysql: MySQLStore, cache: RedisCache, recent: RecentCache | None = None
    ) -> None:
        self.mysql = mysql
        self.cache = cache
        self.recent = recent
        # Conversations with this many members or more are cached at commit (see above).
        self.write_through_members = WRITE_THROUGH_MEMBERS
        self._cache_writes: set[asyncio.Task[None]] = set()
        self.recent_hits = 0
        self.recent_misses = 0
        self.recent_skipped = 0
        # Positions accepted in Redis, not yet in MySQL: (conv, uid) -> (seq, ms).
        self._reads: dict[tuple[int, int], tuple[int, int]] = {}
        self._delivered: dict[tuple[int, int, str], tuple[int, int]] = {}
        self._flusher: asyncio.Task[None] | None = None
        self.redis_errors = 0
        self._redis_logged_at = -1e9  # when "redis unavailable" was last logged
        self._redis_log_held = 0

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self.mysql.start()
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def cache_settled(self, within_s: float = 2.0) -> None:
        """Wait (up to `within_s`) for the recent-cache writes in flight."""
        if self._cache_writes:
            await asyncio.wait(set(self._cache_writes), timeout=within_s)

    async def close(self) -> None:
        await self.cache_settled()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        try:
            await self.flush_positions()
        except StoreUnavailable as e:
            log.error("read positions not flushed at close", error=str(e))
        await self.mysql.close()

    def now_ms(self) -> int:
        return self.mysql.now_ms()

    async def maintain(self) -> None:
        await self.mysql.maintain()

    def durability(self) -> dict[str, str]:
        return self.mysql.durability()

    def outbox(self) -> Outbox | None:
        return self.mysql.outbox()

    # -- hook rows (storage/hooks.py): MySQL's, Redis holds none ---------------------------

    def set_hook_node(self, node: str) -> None:
        self.mysql.set_hook_node(node)

    async def hooks_of(self, node: str, limit: int) -> list[HookRow]:
        return await self.mysql.hooks_of(node, limit)

    async def hooks_done(self, keys: Sequence[tuple[int, int]]) -> None:
        await self.mysql.hooks_done(keys)

    async def hooks_adopt(self, from_node: str, to_node: str) -> int:
        return await self.mysql.hooks_adopt(from_node, to_node)

    async def hooks_backlog(self) -> tuple[int, int]:
        return await self.mysql.hooks_backlog()

    def _redis_failed(self, op: str, e: Exception) -> None:
        """Count it; log it at most once a second (an outage fails every call)."""
        self.redis_errors += 1
        now = time.monotonic()
        if now - self._redis_logged_at < 1.0:
            self._redis_log_held += 1
            return
        self._redis_logged_at = now
        held, self._redis_log_held = self._redis_log_held, 0
        log.warning("redis unavailable; using MySQL", op=op, error=str(e), similar_held_back=held)

    # -- members ---------------------------------------------------------------------------

    async def _members(self, conv_id: int) -> MemberSnapshot:
        try:
            snap = await self.cache.get_members(conv_id)
            if snap is not None:
                return snap
        except CacheUnavailable as e:
            self._redis_failed("get_members", e)
        version, rows = await self.mysql.member_rows(conv_id)
        snap = _snapshot(conv_id, version, rows)
        if rows:
            await self._put_members(snap)
        return snap

    async def _put_members(self, snap: MemberSnapshot) -> None:
        try:
            await self.cache.put_members(snap)
        except CacheUnavailable as e:
            self._redis_failed("put_members", e)

    async def _refresh_members(self, conv_id: int) -> None:
        """After a committed membership change: never raises (the change is done). If the
        new snapshot cannot be written, drop the cached one; if that fails too, the stale
        snapshot lives at most MEMBERS_TTL_S."""
        try:
            version, rows = await self.mysql.member_rows(conv_id)
            await self.cache.put_members(_snapshot(conv_id, version, rows))
        except BackendUnavailable as e:
            log.warning("member snapshot not refreshed", conv_id=conv_id, error=str(e))
            try:
                await self.cache.drop_members(conv_id)
            except CacheUnavailable as e2:
                self._redis_failed("drop_members", e2)

    async def get_conversation(self, conv_id: int) -> Conversation | None:
        return await self.mysql.get_conversation(conv_id)

    async def get_membership(self, conv_id: int, uid: int) -> Membership | None:
        row = (await self._members(conv_id)).rows.get(uid)
        return None if row is None else Membership(conv_id, uid, row[0], row[1])

    async def member_uids(self, conv_id: int) -> list[int]:
        return list((await self._members(conv_id)).order)

    async def find_p2p(self, a: int, b: int) -> int | None:
        return await self.mysql.find_p2p(a, b)

    async def open_p2p(self, a: int, b: int) -> int:
        return await self.mysql.open_p2p(a, b)

    async def create_group(
        self, owner: int, title: str, uids: Sequence[int]
    ) -> tuple[int, StoredMessage]:
        conv_id, msg = await self.mysql.create_group(owner, title, uids)
        await self._refresh_members(conv_id)
        await self._cache_recent([msg])
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
        change = await self.mysql.change_members(conv_id, by, add, remove, max_members=max_members)
        if change.messages:
            await self._refresh_members(conv_id)
            await self._cache_recent(change.messages)
        return change

    async def set_title(self, conv_id: int, by: int, title: str) -> StoredMessage | None:
        msg = await self.mysql.set_title(conv_id, by, title)
        if msg is not None:
            await self._cache_recent([msg])
        return msg

    # -- messages ------------------------------------------------------------------------

    async def append(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        results = await self.mysql.append(batch)
        if self.recent is not None:
            stored = [
                r.message
                for r in results
                if r.status is AppendStatus.STORED
                and r.message
                and len(r.members) >= self.write_through_members
            ]
            if stored:
                self._cache_soon(stored)
        return results

    def _cache_soon(self, msgs: list[StoredMessage]) -> None:
        """Write `msgs` to the recent cache without waiting: the acks (or the page) need
        not wait for it, and the batcher's commit slot is free for the next batch
        meanwhile. A read racing the write misses the cache and goes to MySQL; writes
        landing out of order are safe (see storage/redis/recent.py). Bounded: past the
        cap a write is skipped, which only means a miss later."""
        if len(self._cache_writes) < MAX_CACHE_WRITES:
            task = asyncio.get_running_loop().create_task(self._cache_recent(msgs))
            self._cache_writes.add(task)
            task.add_done_callback(self._cache_writes.discard)
        else:
            self.recent_skipped += 1

    async def _cache_recent(self, msgs: Iterable[StoredMessage]) -> None:
        """Best effort, after the commit: a failed write only makes reads of those
        conversations go to MySQL until the next write resets their cache."""
        if self.recent is None:
            return
        try:
            await self.recent.add(msgs)
        except CacheUnavailable as e:
            self._redis_failed("recent add", e)

    async def find_sent(self, sender_uid: int, client_msg_id: str) -> SentRecord | None:
        """The idempotency record of a send, from Redis, else MySQL."""
        try:
            rec = await self.cache.get_sent(sender_uid, client_msg_id)
            if rec is not None:
                return rec
        except CacheUnavailable as e:
            self._redis_failed("get_sent", e)
            return await self.mysql.find_sent(sender_uid, client_msg_id)
        rec = await self.mysql.find_sent(sender_uid, client_msg_id)
        if rec is not None:
            try:
                await self.cache.put_sent([rec])
            except CacheUnavailable as e:
                self._redis_failed("put_sent", e)
        return rec

    async def read_after(
        self, conv_id: int, after_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        lo = max(after_seq + 1, min_seq)
        page, committed = await self._recent_page(conv_id, lo, max_seq, limit, newest=False)
        if page is not None:
            return page
        read = await self.mysql.read_after(
            conv_id, after_seq, limit, min_seq=min_seq, max_seq=max_seq
        )
        self._read_through(read[0], committed)
        return read

    async def read_before(
        self, conv_id: int, before_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        hi = max_seq if before_seq == 0 else before_seq - 1  # 0: from the newest
        if max_seq is not None and hi is not None:
            hi = min(hi, max_seq)
        page, committed = await self._recent_page(conv_id, min_seq, hi, limit, newest=True)
        if page is not None:
            return page
        read = await self.mysql.read_before(
            conv_id, before_seq, limit, min_seq=min_seq, max_seq=max_seq
        )
        self._read_through(read[0], committed)
        return read

    def _read_through(self, page: list[StoredMessage], committed: int) -> None:
        """Cache a page MySQL answered when it lies among the conversation's newest
        messages (the ones the cache keeps): the next reader of it is answered by Redis."""
        recent = self.recent
        if page and committed and recent is not None and page[-1].seq > committed - recent.limit:
            self._cache_soon(page)

    async def _recent_page(
        self, conv_id: int, lo: int, hi: int | None, limit: int, *, newest: bool
    ) -> tuple[tuple[list[StoredMessage], bool] | None, int]:
        """The page of seqs in [lo, hi] (the first `limit`, or the last `limit` when
        `newest`) and whether more of the range lies beyond it, from the recent cache;
        None when the cache cannot prove it holds the whole page (then MySQL answers).
        Also the conversation's committed max seq (0 when not read).

        Seqs are gapless (allocated under the seq row lock; a rollback gives them back),
        so the range's messages are exactly seqs lo..min(hi, committed max): the cache
        answers when it holds every one of the seqs the page needs."""
        if self.recent is None or limit <= 0:
            return None, 0
        lo = max(lo, 1)
        committed, recalled = await self.mysql.seq_bounds(conv_id)
        end = committed if hi is None else min(hi, committed)
        if end < lo:
            return ([], False), committed
        # one seq past the page, to know whether there is more
        first, last = (max(lo, end - limit), end) if newest else (lo, min(end, lo + limit))
        if first <= recalled:
            # The page reaches a recalled message: MySQL has its recalled form, the cache
            # may still hold the original (a forget that failed, or one on another node
            # not yet done), so pages down there come from MySQL.
            self.recent_misses += 1
            return None, committed
        try:
            got = await self.recent.range(conv_id, first, last)
        except CacheUnavailable as e:
            self._redis_failed("recent range", e)
            return None, 0  # 0: no read-through either, Redis is in trouble
        if [m.seq for m in got] != list(range(first, last + 1)):
            self.recent_misses += 1
            return None, committed
        self.recent_hits += 1
        more = last - first + 1 > limit
        if not more:
            return (got, False), committed
        return ((got[1:], True) if newest else (got[:limit], True)), committed

    async def recall(
        self, conv_id: int, seq: int, by: int, *, window_ms: int, min_seq: int
    ) -> RecallResult:
        result = await self.mysql.recall(conv_id, seq, by, window_ms=window_ms, min_seq=min_seq)
        if result.status in (RecallStatus.RECALLED, RecallStatus.ALREADY) and self.recent:
            # Correctness does not depend on this (pages reaching down to a recalled seq
            # never come from the cache: `recalled_seq` in MySQL); it only takes the
            # original content out of Redis, and the floor keeps a late write of it out.
            try:
                await self.recent.forget_upto(conv_id, seq)
            except CacheUnavailable as e:
                self._redis_failed("recent forget", e)
        return result

    # -- positions -----------------------------------------------------------------------

    async def set_read(self, conv_id: int, uid: int, seq: int) -> int | None:
        target = min(seq, await self.mysql.max_seq(conv_id))
        if target <= 0:
            return None
        try:
            moved = await self.cache.advance_read(conv_id, uid, target)
        except CacheUnavailable as e:
            self._redis_failed("advance_read", e)
            return await self.mysql.set_read(conv_id, uid, target)
        # Queued whatever Redis says: a READ retried after a crash that lost the queue
        # still reaches MySQL (the flush only ever moves positions forward).
        key = (conv_id, uid)
        self._reads[key] = (max(target, self._reads.get(key, (0, 0))[0]), self.now_ms())
        return moved

    async def set_delivered(self, conv_id: int, uid: int, device: str, seq: int) -> int | None:
        target = min(seq, await self.mysql.max_seq(conv_id))
        if target <= 0:
            return None
        try:
            moved = await self.cache.advance_delivered(conv_id, uid, device, target)
        except CacheUnavailable as e:
            self._redis_failed("advance_delivered", e)
            return await self.mysql.set_delivered(conv_id, uid, device, target)
        dkey = (conv_id, uid, device)
        self._delivered[dkey] = (max(target, self._delivered.get(dkey, (0, 0))[0]), self.now_ms())
        return moved

    async def flush_positions(self) -> None:
        """Write the positions accepted in Redis to MySQL (a failed flush keeps them)."""
        reads, self._reads = self._reads, {}
        delivered, self._delivered = self._delivered, {}
        try:
            if reads:
                now = self.now_ms()
                await self.mysql.flush_reads([(c, u, s, now) for (c, u), (s, _) in reads.items()])
            if delivered:
                now = self.now_ms()
                await self.mysql.flush_delivered(
                    [(c, u, d, s, now) for (c, u, d), (s, _) in delivered.items()]
                )
        except StoreUnavailable:
            for k, v in reads.items():
                self._reads.setdefault(k, v)
            for dk, dv in delivered.items():
                self._delivered.setdefault(dk, dv)
            raise

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            try:
                await self.flush_positions()
            except StoreUnavailable as e:
                log.warning("read position flush failed; will retry", error=str(e))

    async def sync(
        self,
        uid: int,
        device: str,
        *,
        changed_since_ms: int,
        after: tuple[int, int] | None,
        limit: int,
    ) -> SyncPage:
        # This node's positions go to MySQL first, so the rows (and their unread
        # counts) include them; other nodes' unflushed ones are at most FLUSH_EVERY_S old
        # and, flushed with a newer updated_ms, are listed by the next SYNC.
        try:
            await self.flush_positions()
        except StoreUnavailable as e:
            log.warning("read positions not flushed before SYNC", error=str(e))
        return await self.mysql.sync(
            uid, device, changed_since_ms=changed_since_ms, after=after, limit=limit
        )

    async def shared_with(self, uid: int, others: Sequence[int]) -> set[int]:
        return await self.mysql.shared_with(uid, others)

    async def conversation_counts(self, uids: Sequence[int]) -> dict[int, int]:
        return await self.mysql.conversation_counts(uids)

    # -- offline push: MySQL's alone (nothing of it is cached) ------------------------------

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
        return await self.mysql.push_register(
            uid, device, provider, token, preview=preview, locale=locale, max_devices=max_devices
        )

    async def push_unregister(self, uid: int, device: str) -> bool:
        return await self.mysql.push_unregister(uid, device)

    async def push_devices(self, uids: Sequence[int]) -> dict[int, list[PushDevice]]:
        return await self.mysql.push_devices(uids)

    async def push_delete(self, provider: str, token: str) -> bool:
        return await self.mysql.push_delete(provider, token)

    async def set_mute(self, conv_id: int, uid: int, until_ms: int) -> None:
        await self.mysql.set_mute(conv_id, uid, until_ms)

    async def muted(self, pairs: Sequence[tuple[int, int]], now_ms: int) -> set[tuple[int, int]]:
        return await self.mysql.muted(pairs, now_ms)

    async def unread_badges(self, uids: Sequence[int]) -> dict[int, int]:
        # as SYNC: this node's read positions first, other nodes' at most FLUSH_EVERY_S old
        try:
            await self.flush_positions()
        except StoreUnavailable as e:
            log.warning("read positions not flushed before push badges", error=str(e))
        return await self.mysql.unread_badges(uids)
