"""The pieces of a bench run on agents that need no Redis: what an agent may load, the
source addresses its processes bind, and how the controller sums agents' views."""

from __future__ import annotations

import dataclasses

import pytest

from bench.addresses import allowed
from bench.common import BenchError
from bench.fleet import Fleet, FleetView
from bench.remote import _add


def test_an_agent_loads_only_what_it_is_allowed() -> None:
    assert allowed("127.0.0.1", ["127.0.0.0/8"])
    assert allowed("localhost", ["127.0.0.0/8", "::1/128"])
    assert not allowed("10.0.0.5", ["127.0.0.0/8"])
    assert allowed("10.0.0.5", ["10.0.0.0/24"])
    assert not allowed("10.0.1.5", ["10.0.0.0/24"])
    assert allowed("gw.example", ["gw.example"])  # a host name given as is
    assert not allowed("no-such-host.invalid", ["0.0.0.0/0"])


def test_processes_bind_the_sources_given_one_each() -> None:
    common = {"per_proc": 10_000, "ramp": 100.0, "hb_s": 30, "timeout_s": 60.0}
    fleet = Fleet(connections=25_000, sources=["10.0.0.7", "10.0.0.8", "10.0.0.9"], **common)
    assert [fleet.src_ip(i) for i in range(fleet.procs_n)] == ["10.0.0.7", "10.0.0.8", "10.0.0.9"]
    with pytest.raises(BenchError, match="give at least 3"):
        Fleet(connections=25_000, sources=["10.0.0.7"], **common)
    assert Fleet(connections=25_000, net=131, **common).src_ip(2) == "127.131.0.3"


def test_the_controller_sums_the_agents_views() -> None:
    a = FleetView(held=10, logins=12, drops=1, errors={"x": 1}, kicks={"k": 2}, rss=100,
                  pongs=5, unavailable_max=3)  # fmt: skip
    b = FleetView(held=20, logins=20, errors={"x": 2, "y": 1}, rss=50, pongs=7,
                  unavailable_max=1, unavailable_over_2=4)  # fmt: skip
    total = FleetView()
    for v in (a, b):
        _add(total, dataclasses.asdict(v))
    assert (total.held, total.logins, total.drops, total.rss, total.pongs) == (30, 32, 1, 150, 12)
    assert total.errors == {"x": 3, "y": 1} and total.kicks == {"k": 2}
    assert (total.unavailable_max, total.unavailable_over_2) == (3, 4)
