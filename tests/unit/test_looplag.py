"""Backend deadlines under a late event loop (storage/looplag.py): a call whose answer
waits behind the node's own work is given more time; a slow backend on an idle node is
cut at its deadline; and a route check that failed while the node was late sends no
SYNC_HINT."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.routewatch import RouteWatch
from storage.errors import CacheUnavailable
from storage.looplag import MAX_EXTENSIONS, Deadline, loop_lag
from storage.redis.errors import unavailable


def block_loop(seconds: float) -> None:
    """The node busy with a flood: nothing else runs meanwhile."""
    time.sleep(seconds)


async def test_a_deadline_passed_while_the_loop_was_busy_is_extended() -> None:
    loop = asyncio.get_running_loop()
    answer = loop.create_future()
    loop.call_later(0.05, answer.set_result, "ok")  # the backend answers in 50 ms ...
    loop.call_later(0.01, block_loop, 0.25)  # ... while the loop is busy for 250 ms
    started = time.monotonic()
    async with Deadline(0.1):
        assert await answer == "ok"
    assert time.monotonic() - started < 0.5


async def test_the_same_answer_is_cut_by_a_plain_timeout() -> None:
    """What the node did before: its own lateness taken for an outage."""
    loop = asyncio.get_running_loop()
    answer = loop.create_future()
    loop.call_later(0.05, answer.set_result, "ok")
    loop.call_later(0.01, block_loop, 0.25)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await answer


async def test_a_slow_backend_on_an_idle_node_is_cut_at_the_limit() -> None:
    loop_lag()  # ticking, and quiet
    await asyncio.sleep(0.05)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with Deadline(0.1):
            await asyncio.sleep(5)
    assert 0.09 <= time.monotonic() - started < 0.3


async def test_a_node_late_for_ever_still_cuts_after_a_few_limits() -> None:
    loop = asyncio.get_running_loop()
    stop = time.monotonic() + 0.8

    def busy() -> None:
        block_loop(0.07)
        if time.monotonic() < stop:
            loop.call_soon(busy)

    loop.call_soon(busy)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with Deadline(0.1):
            await asyncio.sleep(5)
    assert time.monotonic() - started < (MAX_EXTENSIONS + 1) * 0.1 + 0.5


async def test_redis_calls_get_the_extension_too() -> None:
    loop = asyncio.get_running_loop()
    answer = loop.create_future()
    loop.call_later(0.05, answer.set_result, "ok")
    loop.call_later(0.01, block_loop, 0.25)
    async with unavailable("get", 0.1):
        assert await answer == "ok"


class FailingRoutes:
    async def mark(self, node_id: str) -> bool:
        raise CacheUnavailable("redis: mark failed: TimeoutError")


class Log:
    def warning(self, *args: Any, **kw: Any) -> None:
        pass


async def test_a_route_check_failed_while_the_node_was_late_owes_no_hints() -> None:
    watch = RouteWatch(
        FailingRoutes(),  # type: ignore[arg-type]
        "n",
        every_s=1.0,
        sessions=list,
        hint_all=lambda why: None,
        log=Log(),
    )
    loop_lag()
    await asyncio.sleep(0.05)
    await watch.check()  # on time: the route store is out of reach
    assert watch.owes_hints
    watch = RouteWatch(
        FailingRoutes(),  # type: ignore[arg-type]
        "n",
        every_s=1.0,
        sessions=list,
        hint_all=lambda why: None,
        log=Log(),
    )
    block_loop(0.2)  # the node was busy: the tick is overdue
    await watch.check()
    assert not watch.owes_hints
