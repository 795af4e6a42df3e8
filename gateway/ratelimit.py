"""Token buckets per uid: bursts of `burst`, `rate` per second sustained. A node has
three: SEND, every other op that makes work (the op budget), and TYPING."""

from __future__ import annotations

from collections.abc import Callable


class UidRateLimiter:
    __slots__ = ("_buckets", "_burst", "_clock", "_rate")

    def __init__(self, *, burst: int, rate: float, clock: Callable[[], float]) -> None:
        self._burst = float(burst)
        self._rate = rate
        self._clock = clock
        self._buckets: dict[int, tuple[float, float]] = {}  # uid -> (tokens, at)

    def take(self, uid: int) -> bool:
        """Consume one token if there is one; a refused send consumes nothing."""
        now = self._clock()
        tokens, at = self._buckets.get(uid, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if tokens < 1.0:
            self._buckets[uid] = (tokens, now)
            return False
        self._buckets[uid] = (tokens - 1.0, now)
        return True

    def refund(self, uid: int) -> None:
        """Give back a token taken for a send that stored nothing (a duplicate resend)."""
        entry = self._buckets.get(uid)
        if entry is not None:
            self._buckets[uid] = (min(self._burst, entry[0] + 1.0), entry[1])

    def prune(self) -> None:
        """Forget buckets that have refilled completely (they equal a fresh bucket)."""
        now = self._clock()
        full = self._burst / self._rate if self._rate > 0 else float("inf")
        stale = [uid for uid, (_, at) in self._buckets.items() if now - at >= full]
        for uid in stale:
            del self._buckets[uid]
