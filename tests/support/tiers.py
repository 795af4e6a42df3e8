"""The fast tier and the slow tier.

`pytest -m "not slow"` is the fast tier: tests that need no MariaDB, Redis or RabbitMQ,
start no gateway and run no archive end to end, so it runs in seconds on every change.
Everything else is marked `slow` at collection by `is_slow` (tests/conftest.py calls it),
never by hand, so a new test in a service directory, or one that asks for a service or
gateway fixture, is slow without anyone remembering to say so. In the fast tier,
property tests try a share of their examples (`examples`).

While a fast-tier test sets up and runs, `fast_tier_guard` refuses connections to the
service ports and reports any process the test left running, so a test that slips past
the rules fails, in the fast tier and under plain `pytest` in CI alike, and says why.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent.parent

# Directories and files (relative to tests/) whose every test is a service or process test.
SLOW_PATHS = (
    "amqp/",  # RabbitMQ
    # archive runs end to end: stores filled with history, moved to file:// and s3://
    # tiers at their paced rate, `imgw archive run` subprocesses, MariaDB and Redis
    "archive/",
    "bench/",  # `imgw bench` controllers and agents, coordinated through Redis
    "cluster/",  # gateway processes on MariaDB + Redis + RabbitMQ
    "e2e/",  # gateways on real sockets: in-process on every backend, or processes
    "faults/",  # MariaDB and Redis through fault-injecting proxies
    "redis/",  # Redis
    "test_bench_cli.py",  # `imgw bench` runs, each its own gateway
    "test_bench_smoke.py",  # `python -m bench.send_bench` subprocesses
    "test_bench_ws.py",  # `imgw bench` runs over WebSocket, each its own gateway
    "test_raw_protocol.py",  # a gateway subprocess
    "test_revocations_mysql.py",  # MariaDB
)

# Fixtures (module.function) that connect to a service or start a gateway (in-process or
# as a process), or a local S3 server: a test that uses one, directly or through another
# fixture, is slow.
SLOW_FIXTURES = frozenset(
    {
        "tests.conftest.start_gateway",
        "tests.archive.test_archive_embedded.moto_server",
        "tests.conftest.redis_cluster",
        "tests.test_client.gateway",
        "tests.test_query_plans.mysql_store",
    }
)

# A parametrized test whose parameter names a service backend is slow (the embedded
# backend is SQLite in a temporary directory and stays fast).
SERVICE_BACKENDS = frozenset({"mysql", "production", "sharded", "cluster"})

# Helpers that start a service connection or a gateway: a test whose body names one is slow.
SLOW_NAMES = frozenset(
    {
        "Gateway",
        "GatewayProcess",
        "Server",
        "fresh_mysql",
        "fresh_redis_url",
        "fresh_cluster_url",
        "require_port",
    }
)

SERVICE_PORTS = {
    3306: "MariaDB",
    3307: "MariaDB (second)",
    6379: "Redis",
    5672: "RabbitMQ",
    **{p: "Redis Cluster" for p in (7101, 7102, 7103)},
    **{p: "Redis Cluster with replicas" for p in range(7111, 7117)},
    **{p: "Redis with Sentinels" for p in (7121, 7122, 7131, 7132, 7133)},
}


# Property tests run this share of their examples in the fast tier, and all of them in a
# run that includes the slow tier (CI's): the fast tier samples, the full run searches.
FAST_EXAMPLES_SHARE = 0.1
_fast_tier = False


def select_tier(markexpr: str) -> None:
    """Called at configuration with `-m`'s expression: "not slow" is the fast tier."""
    global _fast_tier
    _fast_tier = markexpr.replace(" ", "") == "notslow"


def examples(n: int) -> int:
    """A property test's `max_examples`: `n`, or a share of it in the fast tier."""
    return max(25, int(n * FAST_EXAMPLES_SHARE)) if _fast_tier else n


def _fixture_names(item: pytest.Item) -> set[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    names: set[str] = set()
    for defs in info.name2fixturedefs.values():
        for fixturedef in defs:
            func = fixturedef.func
            names.add(f"{getattr(func, '__module__', '')}.{getattr(func, '__name__', '')}")
    return names


def is_slow(item: pytest.Item) -> str | None:
    """Why `item` belongs to the slow tier, or None when it is a fast-tier test."""
    try:
        rel = item.path.resolve().relative_to(TESTS).as_posix()
    except ValueError:
        rel = ""
    for prefix in SLOW_PATHS:
        if rel.startswith(prefix):
            return f"in {prefix}"
    slow_fixtures = _fixture_names(item) & SLOW_FIXTURES
    if slow_fixtures:
        return f"uses {min(slow_fixtures)}"
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        for name, value in callspec.params.items():
            if isinstance(value, str) and value in SERVICE_BACKENDS:
                return f"{name}={value}"
    function = getattr(item, "function", None)
    code = getattr(function, "__code__", None)
    if code is not None:
        named = set(code.co_names) & SLOW_NAMES
        if named:
            return f"calls {min(named)}"
    return None


class FastTierViolation(Exception):
    pass


def _service_port(address: Any) -> int | None:
    if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[1], int):
        return address[1] if address[1] in SERVICE_PORTS else None
    return None


def _still_running(proc: subprocess.Popen[Any]) -> bool:
    """Without reaping it (asyncio's child watcher may still want its status)."""
    if proc.returncode is not None:
        return False
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


@contextlib.contextmanager
def fast_tier_guard() -> Iterator[list[str]]:
    """While open, a connect to a service port raises ConnectionRefusedError without
    touching the network, and is recorded; on exit, every process started inside and still
    running is recorded too. Yields the list of records (empty: the code behaved as a
    fast-tier test must)."""
    problems: list[str] = []
    started: list[subprocess.Popen[Any]] = []
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_popen_init = subprocess.Popen.__init__

    def refuse(address: Any) -> None:
        port = _service_port(address)
        if port is not None:
            problems.append(f"connected to {SERVICE_PORTS[port]} on port {port}")
            raise ConnectionRefusedError(f"fast-tier test may not use {SERVICE_PORTS[port]}")

    def connect(self: socket.socket, address: Any) -> None:
        refuse(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        refuse(address)
        return real_connect_ex(self, address)

    def popen_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        real_popen_init(self, *args, **kwargs)
        started.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket.socket, "connect_ex", connect_ex)
        patch.setattr(subprocess.Popen, "__init__", popen_init)
        try:
            yield problems
        finally:
            for proc in started:
                if _still_running(proc):
                    problems.append(f"left process {proc.pid} running: {proc.args!r}")


HOW_TO_FIX = (
    "A fast-tier test (not marked slow) {problems}. If it needs a service or a gateway, "
    "make it slow: put it under a slow directory or use a slow fixture (see "
    "tests/support/tiers.py)."
)
