from __future__ import annotations

from gateway.ratelimit import UidRateLimiter


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_burst_then_sustained_rate() -> None:
    clock = Clock()
    rl = UidRateLimiter(burst=5, rate=2.0, clock=clock)
    assert [rl.take(1) for _ in range(6)] == [True] * 5 + [False]
    assert rl.take(2)  # other uids have their own bucket
    clock.t = 0.5  # one token back at 2/s
    assert rl.take(1) and not rl.take(1)


def test_refused_sends_consume_nothing_and_refund_restores() -> None:
    clock = Clock()
    rl = UidRateLimiter(burst=1, rate=1.0, clock=clock)
    assert rl.take(1)
    for _ in range(10):
        assert not rl.take(1)
    clock.t = 1.0
    assert rl.take(1)
    rl.refund(1)
    assert rl.take(1)


def test_prune_forgets_full_buckets_only() -> None:
    clock = Clock()
    rl = UidRateLimiter(burst=10, rate=10.0, clock=clock)
    rl.take(1)
    clock.t = 0.5
    rl.take(2)
    clock.t = 1.2
    rl.prune()
    assert list(rl._buckets) == [2]


def test_spending_is_recorded_only_when_shared_and_the_shared_level_lowers_the_bucket() -> None:
    t = [0.0]
    rl = UidRateLimiter(burst=5, rate=1.0, clock=lambda: t[0])
    assert rl.take(1) and rl.spent is None  # not shared: nothing recorded
    rl.spent = {}
    assert rl.take(1) and rl.take(1)
    rl.refund(1)
    assert rl.spent == {1: 1}
    rl.lower_to(1, -2.0)  # overdrawn on other nodes
    assert not rl.take(1)
    t[0] = 2.5  # refills from -2 at 1/s: 0.5 after 2.5 s, a token after 3 s
    assert not rl.take(1)
    t[0] = 3.0
    assert rl.take(1)
    rl.lower_to(1, 10.0)  # a level above ours never raises it
    assert not rl.take(1)
