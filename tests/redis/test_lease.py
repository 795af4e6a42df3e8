"""Snowflake worker-id leases in a real Redis: two live workers never share an id; a
lease survives Redis losing its data; a taken-over lease moves to a fresh id."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from storage.errors import CacheUnavailable
from storage.redis.lease import WorkerIdLease
from storage.snowflake import MAX_WORKER


def lease(client: aioredis.Redis, prefix: str, owner: str) -> WorkerIdLease:
    return WorkerIdLease(client, prefix=prefix, owner=owner)


async def test_concurrent_workers_get_distinct_ids(client: aioredis.Redis, prefix: str) -> None:
    leases = [lease(client, prefix, f"w{i}") for i in range(50)]
    ids = await asyncio.gather(*(x.acquire() for x in leases))
    assert len(set(ids)) == 50
    assert all(0 <= n <= MAX_WORKER for n in ids)
    assert await client.get(leases[0].key(ids[0])) == b"w0"
    ttl = await client.pttl(leases[0].key(ids[0]))
    assert 0 < ttl <= 60_000


async def test_released_id_is_free_again_and_all_taken_is_an_error(
    client: aioredis.Redis, prefix: str
) -> None:
    for n in range(MAX_WORKER + 1):  # every id held by someone else
        await client.set(lease(client, prefix, "x").key(n), "other", px=60_000)
    late = lease(client, prefix, "late")
    with pytest.raises(CacheUnavailable, match="all 1024 snowflake worker ids are leased"):
        await late.acquire()
    await client.delete(lease(client, prefix, "x").key(17))
    assert await late.acquire() == 17
    await late.release()
    assert await client.exists(lease(client, prefix, "x").key(17)) == 0


async def test_renewal_keeps_refreshes_and_retakes_after_data_loss(
    client: aioredis.Redis, prefix: str
) -> None:
    mine = lease(client, prefix, "me")
    n = await mine.acquire()
    await client.pexpire(mine.key(n), 1_000)
    assert await mine.renew() is False  # kept, TTL pushed back
    assert await client.pttl(mine.key(n)) > 50_000
    await client.delete(mine.key(n))  # Redis lost it (restart, FLUSHALL)
    assert await mine.renew() is False
    assert mine.worker_id == n and await client.get(mine.key(n)) == b"me"


async def test_renewal_moves_to_a_fresh_id_when_taken_over(
    client: aioredis.Redis, prefix: str
) -> None:
    mine = lease(client, prefix, "me")
    n = await mine.acquire()
    await client.set(mine.key(n), "thief", px=60_000)  # ours lapsed and was taken
    assert await mine.renew() is True
    assert mine.worker_id != n
    assert await client.get(mine.key(n)) == b"thief"
    assert await client.get(mine.key(mine.worker_id)) == b"me"
    await mine.release()
    assert await client.get(mine.key(n)) == b"thief"  # release never touches another's


async def test_a_taken_over_id_is_given_up_even_when_no_other_is_free(
    client: aioredis.Redis, prefix: str
) -> None:
    mine = lease(client, prefix, "me")
    n = await mine.acquire()
    for k in range(MAX_WORKER + 1):  # ours taken over, and every other id held too
        await client.set(mine.key(k), "other", px=60_000)
    with pytest.raises(CacheUnavailable):
        await mine.renew()
    assert mine.worker_id == -1, f"must not keep minting on id {n}, now another's"
