"""The log throttle: one record per key per interval, with a count of those held back."""

from __future__ import annotations

from gateway.logs import Throttle


def test_one_record_per_key_per_interval_counts_the_rest() -> None:
    now = [100.0]
    t = Throttle(lambda: now[0], every_s=1.0)
    assert t.allow("Sync") == 0  # the first is logged
    assert [t.allow("Sync") for _ in range(5)] == [None] * 5
    assert t.allow("Pull") == 0  # keys are independent
    now[0] += 1.0
    assert t.allow("Sync") == 5  # logged again, saying 5 were held back
    assert t.allow("Sync") is None
