"""How many connections a worker admits under its open-file limit."""

from __future__ import annotations

from gateway.net.openfiles import FD_RESERVE, connection_cap


def test_the_limit_minus_the_reserve() -> None:
    assert connection_cap(1_000_000, 20_000) == 20_000 - FD_RESERVE
    assert connection_cap(5_000, 20_000) == 5_000  # --max-connections is tighter


def test_a_small_limit_still_admits_clients() -> None:
    """Below 2,048 descriptors the reserve is a quarter of them (at least 64), never all."""
    assert connection_cap(1_000_000, 600) == 450
    assert connection_cap(1_000_000, 256) == 192
    assert connection_cap(1_000_000, 100) == 36
    assert connection_cap(1_000_000, 0) == 0
