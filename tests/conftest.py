# ruff: noqa: E402 (the bytecode setting below goes before every import)
"""Shared fixtures: gateways in-process (fast, on the test's loop) for the protocol suite;
the split into a fast and a slow tier (tests/support/tiers.py)."""

from __future__ import annotations

import sys

# Cache the bytecode of the tests (with pytest's rewritten asserts) and of the code they
# import, even where the environment turns it off (PYTHONDONTWRITEBYTECODE): rewriting
# and compiling 380 modules again is most of a collection's time.
sys.dont_write_bytecode = False

import dataclasses
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Config
from gateway.logs import configure
from gateway.server import Server
from tests.support.services import (
    CLUSTER_URL,
    drop_mysql,
    drop_redis,
    fresh_cluster_url,
    fresh_mysql,
    fresh_redis_url,
    start_redis_cluster,
    stop_redis_cluster,
)
from tests.support.tiers import HOW_TO_FIX, fast_tier_guard, is_slow, select_tier
from tests.support.wire import TOKEN_KEY, Wire

configure("console", "warning")

StartGateway = Callable[..., Awaitable[Server]]


def make_config(tmp_path: Path, **overrides: Any) -> Config:
    base = Config(
        host="127.0.0.1",
        port=0,
        token_keys=(TOKEN_KEY,),
        data_dir=str(tmp_path / "data"),
        node_id="test-node",
        shutdown_timeout=5.0,
        log_level="warning",
    )
    return dataclasses.replace(base, **overrides)


# embedded: SQLite + in-process routes. mysql: MySQL alone (what runs while Redis is
# down). production: MySQL + Redis. sharded: MySQL alone, its message shards split over
# two servers (3306 and the second MariaDB, scripts/mariadb-second). cluster: MySQL +
# a 3-master Redis Cluster.
BACKENDS = ("embedded", "mysql", "production", "sharded", "cluster")
# The protocol modules marked `websocket` run on TCP on every backend, and also with
# their clients on WebSocket (Wire over --ws-listen) on these.
WS_BACKENDS = ("embedded", "production")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses a gateway runs on each backend, unless it names its own with
    @pytest.mark.backends(...)."""
    if "backend" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("backends")
        chosen = marker.args if marker else BACKENDS
        defn = metafunc.definition
        if defn.get_closest_marker("websocket") is None or defn.get_closest_marker("tcp_only"):
            metafunc.parametrize("backend", chosen)
            return
        combos = [(b, "tcp") for b in chosen] + [(b, "ws") for b in chosen if b in WS_BACKENDS]
        metafunc.parametrize(("backend", "transport"), combos)


def pytest_configure(config: pytest.Config) -> None:
    select_tier(config.getoption("markexpr") or "")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` every test that needs a service or starts a gateway (the rules are in
    tests/support/tiers.py); `pytest -m "not slow"` runs the rest in seconds."""
    for item in items:
        if item.get_closest_marker("slow") is None and is_slow(item):
            item.add_marker(pytest.mark.slow)


def _guarded(item: pytest.Item) -> Generator[None, object, object]:
    if item.get_closest_marker("slow") is not None:
        return (yield)
    error: BaseException | None = None
    result: object = None
    with fast_tier_guard() as problems:
        try:
            result = yield
        except BaseException as e:  # reported below, after what the guard saw
            error = e
    if problems:
        message = HOW_TO_FIX.format(problems="; ".join(problems))
        raise pytest.fail.Exception(message, pytrace=False) from error
    if error is not None:
        raise error
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    """A fast-tier test may not reach a service or leave a process running, in its
    fixtures or its body (tests/support/tiers.py)."""
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.fixture(scope="session")
def redis_cluster() -> Generator[str, None, None]:
    """The tests' 3-master Redis Cluster (scripts/redis-cluster), started unless its ports
    answer and then stopped at the end of the session; its URL, without a prefix. It
    failing to start fails the tests that need it: they are never skipped."""
    try:
        started = start_redis_cluster()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        pytest.fail(f"the test Redis Cluster did not start: {e}", pytrace=False)
    yield CLUSTER_URL
    if started:
        stop_redis_cluster()


@pytest.fixture
async def backend_urls(
    backend: str, request: pytest.FixtureRequest
) -> AsyncIterator[dict[str, str]]:
    """Config overrides that put a gateway on `backend`, with private, fresh data."""
    if backend == "embedded":
        yield {}
        return
    if backend == "cluster":
        request.getfixturevalue("redis_cluster")
    url = await fresh_mysql(4, sharded=True) if backend == "sharded" else await fresh_mysql()
    caches = {"production": fresh_redis_url, "cluster": fresh_cluster_url}
    cache = caches[backend]() if backend in caches else "memory://"
    try:
        yield {"store": url, "cache": cache}
    finally:
        await drop_mysql(url)
        if backend in caches:
            await drop_redis(cache)


@pytest.fixture
def transport() -> str:
    """How the test's `Wire` clients connect: "tcp", or "ws" (parametrized by the
    `websocket` marker)."""
    return "tcp"


@pytest.fixture
async def start_gateway(
    tmp_path: Path, backend_urls: dict[str, str], transport: str
) -> AsyncIterator[StartGateway]:
    """Start in-process gateways with config overrides; all are shut down at the end.
    With the "ws" transport each also listens for WebSocket clients, and `Wire`
    connects to it that way."""
    servers: list[Server] = []
    ports: list[int] = []

    async def start(**overrides: Any) -> Server:
        if transport == "ws":
            overrides.setdefault("ws_listen", "127.0.0.1:0")
        server = Server(make_config(tmp_path, **{**backend_urls, **overrides}))
        await server.start()
        servers.append(server)
        if transport == "ws":
            Wire.by_websocket[server.port] = server.ws_port
            ports.append(server.port)
        return server

    yield start
    for port in ports:
        Wire.by_websocket.pop(port, None)
    for server in servers:
        await server.shutdown()


@pytest.fixture
async def gw(start_gateway: StartGateway) -> Server:
    """A gateway with default settings."""
    return await start_gateway()


@pytest.fixture(autouse=True)
async def _close_wires() -> AsyncIterator[None]:
    yield
    while Wire.opened:
        await Wire.opened.pop().close()
