"""Token buckets: bursts of `burst`, `rate` per second sustained. Per uid
(`UidRateLimiter`), a node has three: SEND, every other op that makes work (the op
budget), and TYPING; with a shared cache the first two are also reconciled across nodes
once a second (`SharedBudgets`). One for the whole node (`Bucket`, the same buckets under
one key): the HTTP API's broadcast and token-mint budgets."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.periodic import Periodic
from storage.ports import RateBudgets


class UidRateLimiter:
    __slots__ = ("_buckets", "_burst", "_clock", "_rate", "burst", "rate", "spent")

    def __init__(self, *, burst: int, rate: float, clock: Callable[[], float]) -> None:
        self.burst = burst
        self.rate = rate
        self._burst = float(burst)
        self._rate = rate
        self._clock = clock
        self._buckets: dict[int, tuple[float, float]] = {}  # uid -> (tokens, at)
        # tokens taken per uid since the last report to the shared budgets (None: not
        # shared; SharedBudgets sets it)
        self.spent: dict[int, int] | None = None

    def take(self, uid: int, n: float = 1.0) -> bool:
        """Consume `n` tokens (one by default) if there are as many; a refused take
        consumes nothing. `spent` counts takes: a limiter that takes more than one token
        at once is never shared (`Bucket`). `n` is a float so that the arithmetic stays
        float with float, as cheap as with a constant."""
        now = self._clock()
        tokens, at = self._buckets.get(uid, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if tokens < n:
            self._buckets[uid] = (tokens, now)
            return False
        self._buckets[uid] = (tokens - n, now)
        if (spent := self.spent) is not None:
            spent[uid] = spent.get(uid, 0) + 1
        return True

    def wait_s(self, uid: int, tokens: float) -> float:
        """Seconds until the uid's bucket holds `tokens` (at most a full bucket)."""
        now = self._clock()
        have, at = self._buckets.get(uid, (self._burst, now))
        have = min(self._burst, have + (now - at) * self._rate)
        need = min(self._burst, tokens) - have
        if need <= 0:
            return 0.0
        return need / self._rate if self._rate > 0 else float("inf")

    def refund(self, uid: int) -> None:
        """Give back a token taken for a send that stored nothing (a duplicate resend)."""
        entry = self._buckets.get(uid)
        if entry is not None:
            self._buckets[uid] = (min(self._burst, entry[0] + 1.0), entry[1])
        if (spent := self.spent) is not None and (n := spent.get(uid)) is not None:
            spent[uid] = n - 1

    def lower_to(self, uid: int, level: float) -> None:
        """The uid's shared bucket (all nodes) is at `level`: never hold more here."""
        now = self._clock()
        tokens, at = self._buckets.get(uid, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if level < tokens:
            self._buckets[uid] = (level, now)

    def prune(self) -> None:
        """Forget buckets that have refilled completely (they equal a fresh bucket)."""
        now = self._clock()
        full = self._burst / self._rate if self._rate > 0 else float("inf")
        stale = [uid for uid, (_, at) in self._buckets.items() if now - at >= full]
        for uid in stale:
            del self._buckets[uid]


class Bucket:
    """One token bucket for the whole node: `burst` tokens, refilled at `rate` a second;
    takes all or none (a `UidRateLimiter` of one key, never shared)."""

    __slots__ = ("_limiter",)

    def __init__(self, burst: int, rate: float, clock: Callable[[], float]) -> None:
        self._limiter = UidRateLimiter(burst=burst, rate=rate, clock=clock)

    def take(self, n: int) -> bool:
        return self._limiter.take(0, float(n))


class SharedBudgets:
    """Once a second, report what each uid spent on this node's limiters to the shared
    budgets (storage/redis/budgets.py) and lower the local buckets to the shared levels,
    so that a uid on several nodes (or several workers) gets one budget, not one per
    node; it can overdraw by at most one period's worth per node. While Redis is down the
    local limits hold, and what could not be reported is reported later less the refill of
    the time in between (a bucket would have refilled it anyway)."""

    def __init__(
        self,
        budgets: RateBudgets,
        limiters: Mapping[str, UidRateLimiter],
        *,
        now_ms: Callable[[], int],
        log: Any,
        every_s: float = 1.0,
    ) -> None:
        self._budgets = budgets
        self._limiters = limiters
        self._now_ms = now_ms
        self._loop = Periodic(
            every_s, self.report, log=log, failed="shared rate budgets not reported"
        )  # Redis trouble: the local limits still hold meanwhile
        for limiter in limiters.values():
            limiter.spent = {}
        # kind -> (when a report failed, what it could not report)
        self._owed: dict[str, tuple[int, dict[int, int]]] = {}

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    async def report(self) -> None:
        now_ms = self._now_ms()
        for kind, limiter in self._limiters.items():
            spent = {uid: n for uid, n in (limiter.spent or {}).items() if n > 0}
            limiter.spent = {}
            if (owed := self._owed.pop(kind, None)) is not None:
                _merge_owed(spent, owed, rate=limiter.rate, now_ms=now_ms)
            if not spent:
                continue
            try:
                levels = await self._budgets.spend(
                    kind, spent, burst=limiter.burst, rate=limiter.rate, now_ms=now_ms
                )
            except Exception:
                self._owed[kind] = (now_ms, spent)  # report it next time, less the refill
                raise
            for uid, level in levels.items():
                limiter.lower_to(uid, level)


def _merge_owed(
    spent: dict[int, int], owed: tuple[int, dict[int, int]], *, rate: float, now_ms: int
) -> None:
    """Add to `spent` what a failed report owed, less what a bucket refills in the time
    since: tokens spent longer ago than a refill would have come back anyway, so a Redis
    outage of seconds does not come back as seconds of refusals. Rounded down (lenient)."""
    since_ms, amounts = owed
    refilled = rate * max(0, now_ms - since_ms) / 1000
    for uid, n in amounts.items():
        if (left := int(n - refilled)) > 0:
            spent[uid] = spent.get(uid, 0) + left
