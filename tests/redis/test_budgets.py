"""Shared per-uid rate budgets on a real Redis: refill by elapsed time, spending from
several nodes adds up, and an overdrawn bucket reports a negative level."""

from __future__ import annotations

import redis.asyncio as aioredis

from storage.redis.budgets import RedisRateBudgets


async def test_spending_refills_and_adds_up_across_reports(
    client: aioredis.Redis, prefix: str
) -> None:
    budgets = RedisRateBudgets(client, prefix=prefix)
    kw = {"burst": 20, "rate": 10.0}
    t = 1_000_000
    assert await budgets.spend("send", {1: 15, 2: 1}, now_ms=t, **kw) == {1: 5.0, 2: 19.0}
    # another node reports for uid 1 in the same second: overdrawn
    assert await budgets.spend("send", {1: 15}, now_ms=t, **kw) == {1: -10.0}
    # 2 s later: +20, capped at the burst only from above
    assert await budgets.spend("send", {1: 1}, now_ms=t + 2_000, **kw) == {1: 9.0}
    assert await budgets.spend("send", {1: 0}, now_ms=t + 60_000, **kw) == {1: 20.0}
    # kinds are separate buckets
    assert await budgets.spend("ops", {1: 3}, now_ms=t, **kw) == {1: 17.0}
    assert 0 < await client.pttl(budgets.key(1, "send")) <= 62_000
    assert await budgets.spend("send", {}, now_ms=t, **kw) == {}
