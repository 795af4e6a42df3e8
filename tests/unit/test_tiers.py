"""The fast/slow split (tests/support/tiers.py): the guard that fails a fast-tier test
reaching a service or leaving a process behind, and the rule that every protocol and unit
test is in the fast tier."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest

from tests.support.tiers import TESTS, fast_tier_guard, is_slow


def test_guard_refuses_every_service_port_without_connecting() -> None:
    with fast_tier_guard() as problems:
        for port in (3306, 6379, 5672):
            with socket.socket() as s, pytest.raises(ConnectionRefusedError):
                s.connect(("127.0.0.1", port))
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect_ex(("localhost", 6379))
    assert problems == [
        "connected to MariaDB on port 3306",
        "connected to Redis on port 6379",
        "connected to RabbitMQ on port 5672",
        "connected to Redis on port 6379",
    ]


async def test_guard_sees_asyncio_connections() -> None:
    """The drivers (aiomysql, redis, aio-pika) connect through the event loop."""
    with fast_tier_guard() as problems, pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", 6379)
    assert problems == ["connected to Redis on port 6379"]


async def test_guard_lets_other_ports_through() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        with fast_tier_guard() as problems:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
    assert problems == []


def test_guard_reports_a_process_left_running_not_one_that_finished() -> None:
    sleeper = None
    try:
        with fast_tier_guard() as problems:
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        assert len(problems) == 1
        assert problems[0].startswith(f"left process {sleeper.pid} running")
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()


def test_every_protocol_and_unit_test_is_in_the_fast_tier(request: pytest.FixtureRequest) -> None:
    fast_dirs = (TESTS / "protocol", TESTS / "unit")
    slow = [
        f"{item.nodeid} ({is_slow(item) or 'marked by hand'})"
        for item in request.session.items
        if item.path.resolve().is_relative_to(fast_dirs[0])
        or item.path.resolve().is_relative_to(fast_dirs[1])
        if item.get_closest_marker("slow") is not None
    ]
    assert slow == []
