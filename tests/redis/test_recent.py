"""The recent-message cache keeps one contiguous run of seqs per conversation, whatever
order writes arrive in and whichever are lost, so a read that finds the seqs it asked
for found all of them, exactly as committed."""

from __future__ import annotations

import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.models import StoredMessage
from storage.redis.recent import RECENT_TTL_MS, RecentCache


def msg(seq: int, conv: int = 7, content: bytes | None = None) -> StoredMessage:
    body = content if content is not None else f"m{seq}".encode()
    return StoredMessage(conv, seq, 1000 + seq, 42, 1, body, 1_700_000_000_000 + seq, f"c{seq}")


async def seqs(recent: RecentCache, conv: int = 7) -> list[int]:
    return [m.seq for m in await recent.range(conv, 0, 2**53)]


async def test_appends_continue_the_run_and_round_trip_exactly(
    client: aioredis.Redis, prefix: str
) -> None:
    recent = RecentCache(client, prefix=prefix)
    odd = msg(3, content=bytes(range(256)))
    assert await recent.add([msg(1), msg(2), odd]) == 3
    assert await recent.add([msg(4)]) == 1
    assert await recent.range(7, 1, 4) == [msg(1), msg(2), odd, msg(4)]
    assert await recent.range(7, 2, 3) == [msg(2), odd]
    ttl = await client.pttl(recent.key(7))
    assert 0 < ttl <= RECENT_TTL_MS


async def test_a_gap_replaces_the_run_and_late_writes_are_ignored(
    client: aioredis.Redis, prefix: str
) -> None:
    recent = RecentCache(client, prefix=prefix)
    await recent.add([msg(1), msg(2)])
    assert await recent.add([msg(5), msg(6)]) == 2  # 3..4 never cached (a lost write)
    assert await seqs(recent) == [5, 6]
    assert await recent.add([msg(3), msg(4)]) == 0  # arriving late: below the run
    assert await recent.add([msg(6), msg(7)]) == 1  # overlapping: only the new one
    assert await seqs(recent) == [5, 6, 7]


async def test_trimmed_to_the_newest(client: aioredis.Redis, prefix: str) -> None:
    recent = RecentCache(client, prefix=prefix, max_entries=5)
    for s in range(1, 13, 3):
        await recent.add([msg(s), msg(s + 1), msg(s + 2)])
    assert await seqs(recent) == [8, 9, 10, 11, 12]


async def test_several_conversations_in_one_round_trip(client: aioredis.Redis, prefix: str) -> None:
    recent = RecentCache(client, prefix=prefix)
    assert await recent.add([msg(1, conv=1), msg(1, conv=2), msg(2, conv=1)]) == 3
    assert await seqs(recent, 1) == [1, 2]
    assert await seqs(recent, 2) == [1]


async def test_forgotten_seqs_are_never_cached_again(client: aioredis.Redis, prefix: str) -> None:
    """A recall forgets up to the recalled seq; a write of the original that lands after
    it (cache writes run beside the acks) is refused."""
    recent = RecentCache(client, prefix=prefix)
    await recent.add([msg(1), msg(2), msg(3)])
    await recent.forget_upto(7, 2)
    assert await seqs(recent) == [3]
    assert await recent.add([msg(2)]) == 0  # the late write of the recalled original
    assert await recent.add([msg(1), msg(2), msg(3), msg(4)]) == 1
    assert await seqs(recent) == [3, 4]
    await recent.forget_upto(7, 1)  # a lower floor never lowers it
    assert await recent.add([msg(2)]) == 0
    assert 0 < await client.pttl(recent.floor_key(7)) <= RECENT_TTL_MS
    await recent.forget_upto(8, 5)  # nothing cached yet: the floor still holds
    assert await recent.add([msg(5, conv=8), msg(6, conv=8)]) == 1
    assert await seqs(recent, 8) == [6]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 5)), min_size=1, max_size=25))
async def test_any_write_order_leaves_one_contiguous_run(
    client: aioredis.Redis, prefix: str, writes: list[tuple[int, int]]
) -> None:
    """Runs of committed seqs arriving in any order, any of them missing (lost writes),
    with recalls between them (n = 0: forget up to `first`): the cache is always a
    contiguous run above the highest recall, each entry the committed message."""
    recent = RecentCache(client, prefix=prefix, max_entries=10)
    await client.delete(recent.key(7), recent.floor_key(7))
    floor = 0
    for first, n in writes:
        if n == 0:
            await recent.forget_upto(7, first)
            floor = max(floor, first)
        else:
            await recent.add([msg(s) for s in range(first, first + n)])
        got = await recent.range(7, 0, 2**53)
        got_seqs = [m.seq for m in got]
        if got:
            assert got_seqs == list(range(got_seqs[0], got_seqs[0] + len(got)))
        assert all(s > floor for s in got_seqs)
        assert len(got) <= 10
        assert got == [msg(s) for s in got_seqs]
