"""RedisCache against a real Redis: idempotency records, versioned member snapshots,
max-merge hints and cursors, TTLs and value sizes."""

from __future__ import annotations

import asyncio
import hashlib
import random

import pytest
import redis.asyncio as aioredis

from storage.models import Route
from storage.redis import MemberSnapshot, RedisCache, RedisRouteStore, SentRecord, content_digest
from storage.redis.cache import encode_members

U64 = 2**64 - 1
HOUR = 3600
WEEK = 7 * 24 * HOUR


def sent(cmid: str = "c-1", *, seq: int = 5, content: bytes = b"hi") -> SentRecord:
    return SentRecord(
        sender_uid=42,
        client_msg_id=cmid,
        conv_id=9,
        seq=seq,
        msg_id=2**63 + 11,
        server_ms=1_700_000_000_123,
        msg_type=1,
        digest=content_digest(content),
    )


def snapshot(version: int, uids: list[int], former: dict[int, int] | None = None) -> MemberSnapshot:
    rows: dict[int, tuple[int, int | None]] = {uid: (i + 1, None) for i, uid in enumerate(uids)}
    for uid, left in (former or {}).items():
        rows[uid] = (1, left)
    return MemberSnapshot(conv_id=9, version=version, rows=rows, order=list(uids))


def test_content_digest_is_the_first_16_bytes_of_blake2b() -> None:
    d = content_digest(b"hello")
    assert len(d) == 16 and d == hashlib.blake2b(b"hello").digest()[:16]
    assert content_digest(b"hello!") != d


async def test_sent_records_round_trip_and_first_one_wins(
    cache: RedisCache, client: aioredis.Redis
) -> None:
    assert await cache.get_sent(42, "c-1") is None
    first, other = sent("c-1"), sent("c-2", seq=6)
    await cache.put_sent([first, other])
    assert await cache.get_sent(42, "c-1") == first
    assert await cache.get_sent(42, "c-2") == other
    await cache.put_sent([sent("c-1", seq=99, content=b"other")])
    assert await cache.get_sent(42, "c-1") == first  # the original ack is kept
    assert await cache.get_sent(43, "c-1") is None
    ttl = await client.ttl(cache.dedup_key(42, "c-1"))
    assert 25 * HOUR - 60 < ttl <= 25 * HOUR


async def test_sent_record_keys_take_any_client_msg_id(cache: RedisCache) -> None:
    cmid = "{x}:é|" + "z" * 58
    await cache.put_sent([sent(cmid)])
    assert await cache.get_sent(42, cmid) == sent(cmid)


async def test_members_round_trip(cache: RedisCache, client: aioredis.Redis) -> None:
    assert await cache.get_members(9) is None
    snap = snapshot(3, [5, 1, U64], former={77: 12})
    assert await cache.put_members(snap) is True
    got = await cache.get_members(9)
    assert got == snap
    assert got is not None and got.order == [5, 1, U64]
    assert 0 < await client.ttl(cache.members_key(9)) <= HOUR
    await cache.drop_members(9)
    assert await cache.get_members(9) is None


async def test_member_versions_only_move_forward(cache: RedisCache) -> None:
    v5 = snapshot(5, [1, 2, 3])
    assert await cache.put_members(v5) is True
    assert await cache.put_members(snapshot(4, [1, 2])) is False  # read before the change
    assert await cache.put_members(snapshot(5, [1])) is False  # same version: kept
    assert await cache.get_members(9) == v5
    v6 = snapshot(6, [1, 2, 3, 4])
    assert await cache.put_members(v6) is True
    assert await cache.get_members(9) == v6
    big = snapshot(2**53 + 1, [1])
    assert await cache.put_members(snapshot(2**53, [2])) is True
    assert await cache.put_members(big) is True  # exact beyond a double's precision
    assert await cache.put_members(snapshot(2**53, [3])) is False
    assert await cache.get_members(9) == big


async def test_racing_member_writes_keep_the_newest(cache: RedisCache) -> None:
    snaps = [snapshot(v, list(range(1, v + 2))) for v in range(1, 41)]
    random.Random(1).shuffle(snaps)
    await asyncio.gather(*(cache.put_members(s) for s in snaps))
    got = await cache.get_members(9)
    assert got is not None and got.version == 40 and len(got.order) == 41


async def test_a_full_group_stays_under_10kb_per_value(
    cache: RedisCache, client: aioredis.Redis
) -> None:
    rng = random.Random(7)
    uids = list({rng.randrange(2**63, 2**64) for _ in range(1_000)})  # worst: 9-byte uids
    snap = MemberSnapshot(
        conv_id=9,
        version=1_000,
        rows={uid: (rng.randrange(2**40), None) for uid in uids},
        order=uids,
    )
    assert len(encode_members(snap)) > 10_000  # so it has to be cut
    assert await cache.put_members(snap) is True
    key = cache.members_key(9)
    for field in await client.hkeys(key):
        assert await client.hstrlen(key, field) <= 8 * 1024
    assert await cache.get_members(9) == snap


def test_snapshot_order_must_be_the_current_members() -> None:
    with pytest.raises(ValueError):
        encode_members(MemberSnapshot(9, 1, {1: (1, None), 2: (1, None)}, [1]))
    with pytest.raises(ValueError):
        encode_members(MemberSnapshot(9, 1, {1: (1, None), 2: (1, 5)}, [1, 2]))
    with pytest.raises(ValueError):
        encode_members(MemberSnapshot(9, 1, {1: (1, None)}, [1, 1]))


async def test_read_positions_max_merge(cache: RedisCache, client: aioredis.Redis) -> None:
    assert await cache.get_reads(42, [9, 10]) == {}
    assert await cache.advance_read(9, 42, 5) == 5
    assert await cache.advance_read(9, 42, 5) is None
    assert await cache.advance_read(9, 42, 3) is None
    assert await cache.advance_read(9, 42, 8) == 8
    assert await cache.advance_read(10, 42, 1) == 1
    assert await cache.get_reads(42, [9, 10, 11, 9]) == {9: 8, 10: 1}
    assert await cache.get_reads(43, [9]) == {}
    assert await cache.get_reads(42, []) == {}
    assert WEEK - 60 < await client.ttl(cache.read_key(42)) <= WEEK
    assert await cache.advance_read(12, 42, U64) == U64
    assert await cache.advance_read(12, 42, U64 - 1) is None


async def test_concurrent_advances_end_at_the_maximum(cache: RedisCache) -> None:
    seqs = list(range(1, 301))
    random.Random(3).shuffle(seqs)
    moved = await asyncio.gather(*(cache.advance_read(9, 42, s) for s in seqs))
    assert await cache.get_reads(42, [9]) == {9: 300}
    assert moved.count(300) == 1
    assert all(m is None or m in seqs for m in moved)


async def test_delivered_cursors_are_per_device(cache: RedisCache, client: aioredis.Redis) -> None:
    assert await cache.advance_delivered(9, 42, "phone", 4) == 4
    assert await cache.advance_delivered(9, 42, "pc", 2) == 2
    assert await cache.advance_delivered(9, 42, "phone", 3) is None
    assert await cache.get_delivered(42, "phone", [9]) == {9: 4}
    assert await cache.get_delivered(42, "pc", [9, 10]) == {9: 2}
    assert await cache.get_reads(42, [9]) == {}  # delivered is not read
    assert WEEK - 60 < await client.ttl(cache.delivered_key(42, "phone")) <= WEEK


async def test_negative_seqs_are_refused(cache: RedisCache) -> None:
    with pytest.raises(ValueError):
        await cache.advance_read(9, 42, -1)
    with pytest.raises(ValueError):
        await cache.advance_delivered(9, 42, "phone", -1)


async def test_ping(cache: RedisCache) -> None:
    assert await cache.ping() is True


async def test_every_key_has_a_ttl_and_a_small_value(
    cache: RedisCache, client: aioredis.Redis, prefix: str
) -> None:
    routes = RedisRouteStore(client, prefix=prefix)
    await routes.register(Route(42, "phone", "n1", 1, 1))
    await cache.put_sent([sent()])
    await cache.put_members(snapshot(1, list(range(1, 1_001))))
    await cache.advance_read(9, 42, 3)
    await cache.advance_delivered(9, 42, "phone", 3)
    keys = {k async for k in client.scan_iter(match=prefix + "*")}  # SCAN may repeat a key
    assert len(keys) == 6
    for key in keys:
        assert await client.ttl(key) > 0, key
        kind = await client.type(key)
        if kind == b"string":
            assert await client.strlen(key) <= 10_000
        else:
            for field in await client.hkeys(key):
                assert await client.hstrlen(key, field) <= 10_000
