"""Shared per-uid rate budgets on a real Redis: refill by elapsed time, spending from
several nodes adds up, and an overdrawn bucket reports a negative level."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import redis.asyncio as aioredis
import structlog

from gateway.ratelimit import SharedBudgets, UidRateLimiter
from storage.errors import BackendUnavailable
from storage.redis import redis_from_url
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


class _Outage:
    """The shared budgets through a Redis that is down (a port nobody listens on) until
    `up`, then through the test's Redis."""

    def __init__(self, live: RedisRateBudgets, dead: RedisRateBudgets) -> None:
        self.live, self.dead, self.up = live, dead, False

    async def spend(
        self, kind: str, spent: Mapping[int, int], *, burst: int, rate: float, now_ms: int
    ) -> dict[int, float]:
        budgets = self.live if self.up else self.dead
        return await budgets.spend(kind, spent, burst=burst, rate=rate, now_ms=now_ms)


async def test_a_redis_outage_does_not_come_back_as_refusals(
    client: aioredis.Redis, prefix: str
) -> None:
    """A uid sending within its rate through a 10 s Redis outage: what the node could not
    report is carried to the next report less what the bucket refilled meanwhile, so when
    Redis is back the uid is not refused for the outage's spending all at once (it was: 50
    tokens owed against a burst of 20 left it refused for 3 s)."""
    now = [1_000.0]
    limiter = UidRateLimiter(burst=20, rate=10.0, clock=lambda: now[0])
    dead_client, _ = redis_from_url("redis://127.0.0.1:1/0?socket_connect_timeout=0.5")
    budgets = _Outage(RedisRateBudgets(client, prefix=prefix), RedisRateBudgets(dead_client))
    shared = SharedBudgets(
        budgets, {"send": limiter}, now_ms=lambda: int(now[0] * 1000), log=structlog.get_logger()
    )
    try:
        for _ in range(10):  # 5 sends a second, half the rate
            assert all(limiter.take(1) for _ in range(5))
            now[0] += 1.0
            with pytest.raises(BackendUnavailable):
                await shared.report()
        budgets.up = True
        assert all(limiter.take(1) for _ in range(5))
        now[0] += 1.0
        await shared.report()
        level = float(await client.hget(budgets.live.key(1, "send"), "t") or 0)
        assert level >= 10.0, "at most the last second's spending is still owed"
        assert all(limiter.take(1) for _ in range(10)), "not refused for the outage"
    finally:
        await dead_client.aclose()
