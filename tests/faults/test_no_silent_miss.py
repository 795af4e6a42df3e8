"""No silent misses on MySQL + Redis: an online member gets every acked message, pushed or
fetched after a SYNC_HINT, within seconds, whatever happens to Redis meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from protocol.frames import ConvOk, GroupCreate, Push, Send, SendAck, SyncHint
from tests.faults.conftest import Prod
from tests.faults.test_production_faults import pull_all
from tests.support.services import drop_redis
from tests.support.waiting import wait_until
from tests.support.wire import Wire


async def _receive(
    w: Wire, conv: int, got: set[int], hints: list[float], stop: asyncio.Event
) -> None:
    """What a client does: take PUSHes, and on SYNC_HINT pull what it is missing. It
    sends nothing else (no PING), so nothing renews its route in the meantime."""
    while not stop.is_set():
        try:
            f = await w.recv(timeout=0.2)
        except TimeoutError:
            continue
        if isinstance(f, Push) and f.conv_id == conv:
            got.add(f.seq)
        elif isinstance(f, SyncHint):
            hints.append(time.monotonic())
            got.update(seq for seq, _, _ in await pull_all(w, conv))


async def _flush(prod: Prod) -> None:
    await drop_redis(prod.redis_url)  # every key of this gateway, as FLUSHDB would


async def _restart(prod: Prod) -> None:
    prod.redis.cut()  # down: connections reset, new ones refused
    await drop_redis(prod.redis_url)  # and back without persistence
    await asyncio.sleep(1.0)
    prod.redis.restore()


@pytest.mark.parametrize("fault", [_flush, _restart], ids=["flush", "restart"])
async def test_online_member_gets_every_acked_message_through_redis_loss(
    prod: Prod, fault: Callable[[Prod], Awaitable[None]]
) -> None:
    sender = await Wire.login(prod.port, 1, "d")
    receiver = await Wire.login(prod.port, 2, "d")
    g = await sender.request(GroupCreate(0, "g", (2,)))
    assert isinstance(g, ConvOk)
    got: set[int] = set()
    hints: list[float] = []
    stop = asyncio.Event()
    reading = asyncio.create_task(_receive(receiver, g.conv_id, got, hints, stop))
    acked: dict[int, float] = {}  # seq -> when acked
    started = time.monotonic()
    faulted = False
    i = 0
    while time.monotonic() - started < 4.0:  # a message every 100 ms, the fault at 1 s
        if not faulted and time.monotonic() - started >= 1.0:
            faulted = True
            await fault(prod)
            fault_at = time.monotonic()
        reply = await sender.request(Send(0, g.conv_id, f"m{i}", 1, b"x"), timeout=10)
        if isinstance(reply, SendAck):
            acked[reply.seq] = time.monotonic()
        i += 1
        await asyncio.sleep(0.1)
    assert len(acked) > 20
    try:
        await wait_until(lambda: set(acked) <= got, 5.0, "every acked message received")
    finally:
        stop.set()
        await reading
    assert hints, "the receiver was told to SYNC"
    assert hints[0] - fault_at < 4.0, "within a few seconds of Redis coming back"
    node = prod.server.node
    assert node is not None
    assert await node.routes.get(2, "d") is not None  # re-registered without a PING
