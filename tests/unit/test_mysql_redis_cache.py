"""The production store's caching decisions (storage/mysql_redis.py), without Redis or
MySQL: small fakes stand in for the MySQL store, the Redis accelerator and the
recent-message cache, each recording what it was asked. What is checked is what the
gateway relies on: a hit costs MySQL nothing, a miss is answered from MySQL and
remembered, Redis trouble only makes things slower, a membership change never leaves a
stale snapshot readable, a page comes from the cache only when the cache provably holds
all of it, and read positions accepted in Redis reach MySQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from storage import mysql_redis
from storage.errors import CacheUnavailable, StoreUnavailable
from storage.models import (
    AppendResult,
    AppendStatus,
    Membership,
    MembershipChange,
    NewMessage,
    SentRecord,
    StoredMessage,
    SyncPage,
)
from storage.mysql_redis import MySQLRedisStore
from storage.redis.cache import MemberSnapshot

CONV = 7


def msg(seq: int, conv_id: int = CONV) -> StoredMessage:
    return StoredMessage(conv_id, seq, 1000 + seq, 1, 1, b"m%d" % seq, 1_000 + seq, f"c{seq}")


class FakeMySQL:
    """The part of MySQLStore that MySQLRedisStore calls, in memory."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.members: dict[int, tuple[int, list[Membership]]] = {}
        self.sent: dict[tuple[int, str], SentRecord] = {}
        self.max_seqs: dict[int, int] = {}
        self.recalled: dict[int, int] = {}
        self.page = ([msg(99)], True)  # what a page read from MySQL answers
        self.read_rows: list[tuple[int, int, int, int]] = []
        self.delivered_rows: list[tuple[int, int, str, int, int]] = []
        self.direct_reads: list[tuple[int, int, int]] = []
        self.flush_gate: asyncio.Event | None = None  # set: the next flush waits for it
        self.flush_fails = False
        self.append_members: tuple[int, ...] = (1, 2, 3)  # appends go to a group

    def now_ms(self) -> int:
        return 5_000

    def set_members(self, conv_id: int, version: int, *rows: tuple[int, int, int | None]) -> None:
        self.members[conv_id] = (version, [Membership(conv_id, u, j, left) for u, j, left in rows])

    async def member_rows(self, conv_id: int) -> tuple[int, list[Membership]]:
        self.calls.append("member_rows")
        return self.members.get(conv_id, (0, []))

    async def change_members(
        self, conv_id: int, by: int, add: Sequence[int], remove: Sequence[int], *, max_members: int
    ) -> MembershipChange:
        self.calls.append("change_members")
        version, rows = self.members[conv_id]
        seq = version + 1
        kept = [
            Membership(conv_id, m.uid, m.joined_seq, seq if m.uid in remove else m.left_seq)
            for m in rows
        ]
        kept += [Membership(conv_id, u, seq, None) for u in add]
        self.members[conv_id] = (seq, kept)
        return MembershipChange([msg(seq, conv_id)], 1)

    async def find_sent(self, sender_uid: int, client_msg_id: str) -> SentRecord | None:
        self.calls.append("find_sent")
        return self.sent.get((sender_uid, client_msg_id))

    async def seq_bounds(self, conv_id: int) -> tuple[int, int]:
        self.calls.append("seq_bounds")
        return self.max_seqs.get(conv_id, 0), self.recalled.get(conv_id, 0)

    async def read_after(self, *args: Any, **kwargs: Any) -> tuple[list[StoredMessage], bool]:
        self.calls.append("read_after")
        return self.page

    async def read_before(self, *args: Any, **kwargs: Any) -> tuple[list[StoredMessage], bool]:
        self.calls.append("read_before")
        return self.page

    async def max_seq(self, conv_id: int) -> int:
        return self.max_seqs.get(conv_id, 0)

    async def set_read(self, conv_id: int, uid: int, seq: int) -> int | None:
        self.direct_reads.append((conv_id, uid, seq))
        return seq

    async def flush_reads(self, rows: list[tuple[int, int, int, int]]) -> None:
        if self.flush_gate is not None:
            gate, self.flush_gate = self.flush_gate, None
            await gate.wait()
        if self.flush_fails:
            raise StoreUnavailable("mysql down")
        self.read_rows += rows

    async def flush_delivered(self, rows: list[tuple[int, int, str, int, int]]) -> None:
        if self.flush_fails:
            raise StoreUnavailable("mysql down")
        self.delivered_rows += rows

    async def append(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        seq = self.max_seqs.get(CONV, 0)
        out = []
        for m in batch:
            seq += 1
            stored = StoredMessage(m.conv_id, seq, seq, m.sender_uid, m.msg_type, m.content, 0, "")
            out.append(AppendResult(AppendStatus.STORED, stored, members=self.append_members))
        self.max_seqs[CONV] = seq
        return out

    async def sync(self, uid: int, device: str, **kwargs: Any) -> SyncPage:
        self.calls.append("sync")
        return SyncPage([], False)


class FakeRedisCache:
    """The part of RedisCache that MySQLRedisStore calls: the same contract (snapshots only
    replaced by newer versions, idempotency records never replaced, positions only move
    up), in memory. `down` fails every call; `failing` fails the named methods."""

    def __init__(self) -> None:
        self.members: dict[int, MemberSnapshot] = {}
        self.sent: dict[tuple[int, str], SentRecord] = {}
        self.reads: dict[tuple[int, int], int] = {}
        self.calls: list[str] = []
        self.down = False
        self.failing: set[str] = set()

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.down or name in self.failing:
            raise CacheUnavailable(f"redis: {name}")

    async def get_members(self, conv_id: int) -> MemberSnapshot | None:
        self._call("get_members")
        return self.members.get(conv_id)

    async def put_members(self, snapshot: MemberSnapshot) -> bool:
        self._call("put_members")
        cur = self.members.get(snapshot.conv_id)
        if cur is not None and cur.version >= snapshot.version:
            return False
        self.members[snapshot.conv_id] = snapshot
        return True

    async def drop_members(self, conv_id: int) -> None:
        self._call("drop_members")
        self.members.pop(conv_id, None)

    async def get_sent(self, sender_uid: int, client_msg_id: str) -> SentRecord | None:
        self._call("get_sent")
        return self.sent.get((sender_uid, client_msg_id))

    async def put_sent(self, records: Sequence[SentRecord]) -> None:
        self._call("put_sent")
        for r in records:
            self.sent.setdefault((r.sender_uid, r.client_msg_id), r)

    async def advance_read(self, conv_id: int, uid: int, seq: int) -> int | None:
        self._call("advance_read")
        if self.reads.get((conv_id, uid), 0) >= seq:
            return None
        self.reads[(conv_id, uid)] = seq
        return seq


class FakeRecent:
    """The recent-message cache: whatever seqs it was given, per conversation."""

    limit = 200

    def __init__(self) -> None:
        self.held: dict[int, dict[int, StoredMessage]] = {}
        self.down = False
        self.gate: asyncio.Event | None = None  # set: every add waits for it

    def hold(self, conv_id: int, seqs: Iterable[int]) -> None:
        self.held.setdefault(conv_id, {}).update({s: msg(s, conv_id) for s in seqs})

    async def add(self, msgs: Iterable[StoredMessage]) -> int:
        if self.gate is not None:
            await self.gate.wait()
        for m in msgs:
            self.held.setdefault(m.conv_id, {})[m.seq] = m
        return 0

    async def range(self, conv_id: int, lo: int, hi: int) -> list[StoredMessage]:
        if self.down:
            raise CacheUnavailable("redis: recent range")
        held = self.held.get(conv_id, {})
        return [held[s] for s in sorted(held) if lo <= s <= hi]

    async def forget_upto(self, conv_id: int, seq: int) -> None:
        held = self.held.get(conv_id, {})
        for s in [s for s in held if s <= seq]:
            del held[s]


Fakes = tuple[MySQLRedisStore, FakeMySQL, FakeRedisCache, FakeRecent]


@pytest.fixture
def fakes() -> Fakes:
    mysql, cache, recent = FakeMySQL(), FakeRedisCache(), FakeRecent()
    store = MySQLRedisStore(mysql, cache, recent)  # type: ignore[arg-type]
    return store, mysql, cache, recent


# -- member snapshots -------------------------------------------------------------------


async def test_a_member_miss_reads_mysql_once_then_answers_from_the_snapshot(
    fakes: Fakes,
) -> None:
    store, mysql, cache, _ = fakes
    mysql.set_members(CONV, 4, (1, 1, None), (2, 1, 3), (3, 2, None))  # 2 left at seq 3
    assert await store.member_uids(CONV) == [1, 3]
    assert mysql.calls == ["member_rows"]
    snap = cache.members[CONV]
    assert (snap.version, snap.order) == (4, [1, 3])
    assert await store.get_membership(CONV, 2) == Membership(CONV, 2, 1, 3)  # former member
    assert await store.get_membership(CONV, 9) is None
    assert await store.member_uids(CONV) == [1, 3]
    assert mysql.calls == ["member_rows"]  # every later check was a hit


async def test_a_conversation_without_members_is_not_cached(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    assert await store.member_uids(404) == []
    assert await store.member_uids(404) == []
    assert mysql.calls == ["member_rows", "member_rows"]
    assert "put_members" not in cache.calls


async def test_with_redis_down_members_come_from_mysql(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    mysql.set_members(CONV, 2, (1, 1, None), (2, 1, None))
    cache.down = True
    for _ in range(3):
        assert await store.member_uids(CONV) == [1, 2]
    assert mysql.calls == ["member_rows"] * 3
    assert store.redis_errors == 6  # each check: the get, and the put after it


async def test_a_membership_change_replaces_the_snapshot(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    assert cache.members == {}
    mysql.set_members(CONV, 2, (1, 1, None), (2, 1, None))
    assert await store.member_uids(CONV) == [1, 2]
    await store.change_members(CONV, 1, [3], [2])
    mysql.calls.clear()
    assert await store.member_uids(CONV) == [1, 3]
    assert (await store.get_membership(CONV, 2)) == Membership(CONV, 2, 1, 3)
    assert mysql.calls == []  # the new snapshot was written by the change itself
    assert cache.members[CONV].version == 3


async def test_a_snapshot_that_cannot_be_refreshed_is_dropped(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    mysql.set_members(CONV, 2, (1, 1, None), (2, 1, None))
    assert await store.member_uids(CONV) == [1, 2]
    cache.failing.add("put_members")
    await store.change_members(CONV, 1, [], [2])  # committed: must not raise
    assert CONV not in cache.members
    assert await store.member_uids(CONV) == [1]  # from MySQL, not the stale snapshot


async def test_a_change_does_not_raise_when_redis_is_down_entirely(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    mysql.set_members(CONV, 2, (1, 1, None), (2, 1, None))
    cache.down = True
    change = await store.change_members(CONV, 1, [5], [])
    assert change.owner_uid == 1
    assert cache.calls == ["put_members", "drop_members"]
    assert await store.member_uids(CONV) == [1, 2, 5]


# -- idempotency records ------------------------------------------------------------------


def record(uid: int = 1, cmid: str = "c-1") -> SentRecord:
    return SentRecord(uid, cmid, CONV, 5, 555, 1234, 1, b"digest")


async def test_a_resend_found_in_mysql_is_remembered_in_redis(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    mysql.sent[(1, "c-1")] = record()
    assert await store.find_sent(1, "c-1") == record()
    assert cache.sent[(1, "c-1")] == record()
    assert await store.find_sent(1, "c-1") == record()
    assert await store.find_sent(1, "c-1") == record()
    assert mysql.calls == ["find_sent"]  # retries after the first cost MySQL nothing


async def test_an_unknown_send_is_not_remembered(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    assert await store.find_sent(1, "new") is None
    assert await store.find_sent(1, "new") is None
    assert mysql.calls == ["find_sent", "find_sent"]
    assert "put_sent" not in cache.calls


async def test_with_redis_down_resends_are_found_in_mysql(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    mysql.sent[(1, "c-1")] = record()
    cache.down = True
    assert await store.find_sent(1, "c-1") == record()
    assert cache.calls == ["get_sent"]  # no write back to a Redis that is down
    cache.down = False
    cache.failing.add("put_sent")
    assert await store.find_sent(1, "c-1") == record()  # a failed write back is harmless


# -- pages from the recent-message cache ----------------------------------------------------


def seqs(page: tuple[list[StoredMessage], bool]) -> tuple[list[int], bool]:
    return [m.seq for m in page[0]], page[1]


async def test_a_page_the_cache_holds_is_answered_from_it(fakes: Fakes) -> None:
    store, mysql, _, recent = fakes
    mysql.max_seqs[CONV] = 10
    recent.hold(CONV, range(1, 11))
    page = await store.read_after(CONV, 3, 4, min_seq=1, max_seq=None)
    assert seqs(page) == ([4, 5, 6, 7], True)
    assert seqs(await store.read_after(CONV, 7, 5, min_seq=1, max_seq=None)) == ([8, 9, 10], False)
    assert seqs(await store.read_before(CONV, 0, 3, min_seq=1, max_seq=None)) == ([8, 9, 10], True)
    assert seqs(await store.read_before(CONV, 4, 5, min_seq=1, max_seq=None)) == ([1, 2, 3], False)
    # a page that ends exactly at the newest message has nothing more after it
    assert seqs(await store.read_after(CONV, 7, 3, min_seq=1, max_seq=None)) == ([8, 9, 10], False)
    # before a seq past the committed max: the newest messages
    page = await store.read_before(CONV, 100, 2, min_seq=1, max_seq=None)
    assert seqs(page) == ([9, 10], True)
    assert "read_after" not in mysql.calls and "read_before" not in mysql.calls
    assert (store.recent_hits, store.recent_misses) == (6, 0)


async def test_a_page_is_clamped_to_what_the_member_may_read(fakes: Fakes) -> None:
    store, mysql, _, recent = fakes
    mysql.max_seqs[CONV] = 10
    recent.hold(CONV, range(1, 11))
    # joined at 4, left at 8: sees 4..8 only
    assert seqs(await store.read_after(CONV, 0, 50, min_seq=4, max_seq=8)) == (
        [4, 5, 6, 7, 8],
        False,
    )
    assert seqs(await store.read_before(CONV, 0, 2, min_seq=4, max_seq=8)) == ([7, 8], True)
    assert seqs(await store.read_after(CONV, 8, 50, min_seq=4, max_seq=8)) == ([], False)


async def test_a_cache_behind_the_committed_seqs_sends_the_page_to_mysql(fakes: Fakes) -> None:
    """A cache write that failed leaves the cache short of the newest messages."""
    store, mysql, _, recent = fakes
    mysql.max_seqs[CONV] = 12
    recent.hold(CONV, range(1, 11))  # 11 and 12 never cached
    assert await store.read_after(CONV, 8, 5, min_seq=1, max_seq=None) is mysql.page
    assert await store.read_before(CONV, 0, 3, min_seq=1, max_seq=None) is mysql.page
    assert seqs(await store.read_after(CONV, 2, 3, min_seq=1, max_seq=None)) == ([3, 4, 5], True)
    assert (store.recent_hits, store.recent_misses) == (1, 2)


async def test_a_gap_in_the_cache_sends_the_page_to_mysql(fakes: Fakes) -> None:
    store, mysql, _, recent = fakes
    mysql.max_seqs[CONV] = 10
    recent.hold(CONV, [1, 2, 3, 5, 6, 7, 8, 9, 10])
    assert await store.read_after(CONV, 2, 3, min_seq=1, max_seq=None) is mysql.page
    assert seqs(await store.read_after(CONV, 5, 3, min_seq=1, max_seq=None)) == ([6, 7, 8], True)


async def test_pages_reaching_a_recalled_message_come_from_mysql(fakes: Fakes) -> None:
    """The cache may still hold a recalled message's original content."""
    store, mysql, _, recent = fakes
    mysql.max_seqs[CONV] = 10
    mysql.recalled[CONV] = 5
    recent.hold(CONV, range(1, 11))
    assert await store.read_after(CONV, 3, 2, min_seq=1, max_seq=None) is mysql.page
    assert await store.read_after(CONV, 4, 2, min_seq=1, max_seq=None) is mysql.page  # 5 itself
    assert await store.read_before(CONV, 8, 5, min_seq=1, max_seq=None) is mysql.page
    assert seqs(await store.read_after(CONV, 5, 2, min_seq=1, max_seq=None)) == ([6, 7], True)


async def test_with_the_recent_cache_down_pages_come_from_mysql(fakes: Fakes) -> None:
    store, mysql, _, recent = fakes
    mysql.max_seqs[CONV] = 10
    recent.hold(CONV, range(1, 11))
    recent.down = True
    assert await store.read_after(CONV, 0, 5, min_seq=1, max_seq=None) is mysql.page
    assert store.redis_errors == 1


async def test_cache_writes_in_flight_are_bounded_and_excess_ones_skipped(fakes: Fakes) -> None:
    store, _, _, recent = fakes
    recent.gate = asyncio.Event()  # every write hangs until released
    cap = mysql_redis.MAX_CACHE_WRITES
    for i in range(cap + 5):
        await store.append([NewMessage(CONV, 1, f"c{i}", 1, b"x")])
    assert store.recent_skipped == 5
    recent.gate.set()
    await store.cache_settled()
    assert len(recent.held[CONV]) == cap  # the skipped messages are only a later miss
    await store.append([NewMessage(CONV, 1, "after", 1, b"x")])
    await store.cache_settled()
    assert store.recent_skipped == 5 and len(recent.held[CONV]) == cap + 1


async def test_p2p_messages_are_cached_when_read_not_at_commit(fakes: Fakes) -> None:
    store, mysql, _, recent = fakes
    mysql.append_members = (1, 2)  # a p2p conversation
    await store.append([NewMessage(CONV, 1, f"c{i}", 1, b"x") for i in range(3)])
    await store.cache_settled()
    assert recent.held == {}  # not written at commit
    mysql.page = ([msg(2), msg(3)], False)
    assert await store.read_after(CONV, 1, 5, min_seq=1, max_seq=None) is mysql.page
    await store.cache_settled()
    assert sorted(recent.held[CONV]) == [2, 3]  # the page MySQL answered is now cached


async def test_pages_older_than_the_cached_window_are_not_cached(fakes: Fakes) -> None:
    store, mysql, _, recent = fakes
    mysql.max_seqs[CONV] = 1_000
    mysql.page = ([msg(700), msg(701)], True)  # HISTORY far back: not what the cache keeps
    await store.read_before(CONV, 702, 2, min_seq=1, max_seq=None)
    mysql.page = ([msg(850), msg(851)], True)  # within the newest 200
    await store.read_before(CONV, 852, 2, min_seq=1, max_seq=None)
    await store.cache_settled()
    assert sorted(recent.held[CONV]) == [850, 851]


# -- read positions: accepted in Redis, flushed to MySQL -----------------------------------


async def test_read_positions_reach_mysql_once_at_their_highest(fakes: Fakes) -> None:
    store, mysql, _, _ = fakes
    mysql.max_seqs[CONV] = 20
    assert await store.set_read(CONV, 1, 5) == 5
    assert await store.set_read(CONV, 1, 9) == 9
    assert await store.set_read(CONV, 1, 30) == 20  # never past the committed max
    assert await store.set_read(CONV, 2, 3) == 3
    assert mysql.read_rows == []  # not yet: the flush batches them
    await store.flush_positions()
    assert sorted(mysql.read_rows) == [(CONV, 1, 20, 5_000), (CONV, 2, 3, 5_000)]
    await store.flush_positions()
    assert len(mysql.read_rows) == 2  # flushed once
    assert mysql.direct_reads == []


async def test_a_read_of_an_empty_conversation_is_not_queued(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    assert await store.set_read(CONV, 1, 5) is None
    await store.flush_positions()
    assert mysql.read_rows == [] and cache.calls == []


async def test_a_failed_flush_keeps_the_positions_and_newer_ones_win(fakes: Fakes) -> None:
    store, mysql, _, _ = fakes
    mysql.max_seqs[CONV] = 20
    await store.set_read(CONV, 1, 5)
    await store.set_read(CONV, 2, 6)
    mysql.flush_fails = True
    gate = mysql.flush_gate = asyncio.Event()
    flushing = asyncio.create_task(store.flush_positions())
    await asyncio.sleep(0)  # the flush has taken the queue and waits on MySQL
    await store.set_read(CONV, 1, 8)  # accepted meanwhile
    gate.set()
    with pytest.raises(StoreUnavailable):
        await flushing
    mysql.flush_fails = False
    await store.flush_positions()
    assert sorted(mysql.read_rows) == [(CONV, 1, 8, 5_000), (CONV, 2, 6, 5_000)]


async def test_with_redis_down_a_read_goes_straight_to_mysql(fakes: Fakes) -> None:
    store, mysql, cache, _ = fakes
    mysql.max_seqs[CONV] = 20
    cache.down = True
    assert await store.set_read(CONV, 1, 7) == 7
    assert mysql.direct_reads == [(CONV, 1, 7)]
    await store.flush_positions()
    assert mysql.read_rows == []  # not queued a second time


async def test_sync_flushes_this_nodes_positions_first(fakes: Fakes) -> None:
    """So the unread counts SYNC returns include this node's reads."""
    store, mysql, _, _ = fakes
    mysql.max_seqs[CONV] = 20
    await store.set_read(CONV, 1, 9)
    await store.sync(1, "d", changed_since_ms=0, after=None, limit=10)
    assert mysql.read_rows == [(CONV, 1, 9, 5_000)]
    assert mysql.calls[-1] == "sync"
