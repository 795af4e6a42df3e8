r"""Per-uid rate budgets shared by every node (`storage.ports.RateBudgets`) on Redis.

| key | type | value | TTL |
|---|---|---|---|
| `<p>budget:{<uid>}:<kind>` | hash | `t` tokens (float), `at` last refill (ms) | refill + 60 s |

Nodes do not ask Redis before each request: each keeps its own token bucket (the same
burst and rate) and, once a second, reports what every uid spent on it since the last
report. One script per uid refills the shared bucket by the elapsed time, takes the
spending off and returns the level, which may be negative when the uid spent on several
nodes at once; each node then lowers its own bucket to that level, so the uid is refused
everywhere until the shared bucket has refilled. A uid can thus exceed its budget by at
most what the nodes it uses allow in one reporting period.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from storage.redis.connect import Client, check_prefix
from storage.redis.errors import op_timeout, unavailable
from storage.redis.scripts import ScriptCall, run_pipelined

# KEYS[1] the bucket. ARGV: spent, burst, rate per s, now ms, ttl ms. Returns the level.
_SPEND = """
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[4])
local t = tonumber(redis.call('HGET', KEYS[1], 't') or burst)
local at = tonumber(redis.call('HGET', KEYS[1], 'at') or now)
if now > at then t = math.min(burst, t + (now - at) * tonumber(ARGV[3]) / 1000) end
t = t - tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 't', tostring(t), 'at', tostring(math.max(now, at)))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return tostring(t)
"""

KEEP_MS: Final = 60_000  # past a full refill: an absent key is a full bucket anyway


class RedisRateBudgets:
    def __init__(self, client: Client, *, prefix: str = "") -> None:
        self._client = client
        self._limit = op_timeout(client)
        self._prefix = check_prefix(prefix)
        self._spend = client.register_script(_SPEND)

    def key(self, uid: int, kind: str) -> str:
        return f"{self._prefix}budget:{{{uid}}}:{kind}"

    async def spend(
        self, kind: str, spent: Mapping[int, int], *, burst: int, rate: float, now_ms: int
    ) -> dict[int, float]:
        """Report `spent` tokens per uid; each uid's shared level afterwards (one round
        trip)."""
        if not spent:
            return {}
        ttl = int(burst / rate * 1000) + KEEP_MS if rate > 0 else KEEP_MS
        calls: list[ScriptCall] = [
            (self._spend, [self.key(uid, kind)], [n, burst, repr(rate), now_ms, ttl])
            for uid, n in spent.items()
        ]
        async with unavailable("rate budget", self._limit):
            levels = await run_pipelined(self._client, calls)
        return {uid: float(level) for uid, level in zip(spent, levels, strict=True)}
