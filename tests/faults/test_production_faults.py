"""Faults under traffic on MySQL + Redis: Redis losing everything or restarting, MySQL
unreachable or hanging. The invariants: no (conv_id, seq) issued twice, every acked
message pullable exactly once, nothing acked that is not stored, and recovery without a
restart of the gateway."""

from __future__ import annotations

import asyncio
import time

from protocol.frames import (
    ConvOk,
    Error,
    GroupCreate,
    Login,
    Ping,
    Pong,
    Pull,
    PullResult,
    Send,
    SendAck,
)
from protocol.ops import ErrorCode
from tests.faults.conftest import Prod
from tests.support.services import drop_redis
from tests.support.wire import Wire, token


async def pull_all(w: Wire, conv: int) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    after = 0
    while True:
        page = await w.request(Pull(0, conv, after, 200), timeout=10)
        assert isinstance(page, PullResult), page
        out += [(m.seq, m.msg_id, m.client_msg_id) for m in page.msgs]
        if not page.has_more:
            return out
        after = page.msgs[-1].seq


async def traffic(
    w: Wire,
    uid: int,
    convs: list[int],
    stop: asyncio.Event,
    acked: dict[str, SendAck],
    failed: dict[str, int],
) -> None:
    """Pipelined sends, 20 in flight, round-robin over `convs`, until `stop`."""
    i = 0
    pending: dict[int, str] = {}
    while not stop.is_set() or pending:
        while not stop.is_set() and len(pending) < 20:
            cmid = f"u{uid}-{i}"
            rid = w.rid()
            pending[rid] = cmid
            await w.send(Send(rid, convs[i % len(convs)], cmid, 1, cmid.encode()))
            i += 1
        f = await w.recv(timeout=15)
        rid = getattr(f, "rid", None)
        if rid in pending:
            cmid = pending.pop(rid)
            if isinstance(f, SendAck):
                acked[cmid] = f
            elif isinstance(f, Error):
                failed[cmid] = f.code


async def run_traffic_with_fault(prod: Prod, fault: object) -> None:
    senders = [await Wire.login(prod.port, uid, "d") for uid in (1, 2, 3, 4)]
    g1 = await senders[0].request(GroupCreate(0, "g1", (2, 3, 4)))
    g2 = await senders[0].request(GroupCreate(0, "g2", (2, 3, 4)))
    assert isinstance(g1, ConvOk) and isinstance(g2, ConvOk)
    convs = [g1.conv_id, g2.conv_id]
    stop = asyncio.Event()
    acked: dict[str, SendAck] = {}
    failed: dict[str, int] = {}
    tasks = [
        asyncio.create_task(traffic(w, uid, convs, stop, acked, failed))
        for uid, w in zip((1, 2, 3, 4), senders, strict=True)
    ]
    await asyncio.sleep(1.0)
    await fault()  # type: ignore[operator]
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.gather(*tasks)
    assert len(acked) > 200, "traffic kept flowing"
    assert set(failed.values()) <= {ErrorCode.UNAVAILABLE}

    reader = await Wire.login(prod.port, 1, "reader")
    stored: dict[str, tuple[int, int, int]] = {}
    for conv in convs:
        rows = await pull_all(reader, conv)
        seqs = [s for s, _, _ in rows]
        assert seqs == sorted(set(seqs)), f"seqs in {conv} unique and increasing"
        for seq, msg_id, cmid in rows:
            if cmid:
                assert cmid not in stored, f"{cmid} stored twice"
                stored[cmid] = (conv, seq, msg_id)
    for cmid, ack in acked.items():
        assert stored.get(cmid) == (ack.conv_id, ack.seq, ack.msg_id), cmid
    for cmid in failed:
        assert cmid not in stored, f"{cmid} failed but is stored"


async def test_redis_loses_everything_mid_traffic(prod: Prod) -> None:
    async def flush() -> None:
        await drop_redis(prod.redis_url)  # every key of this gateway, as FLUSHALL would

    await run_traffic_with_fault(prod, flush)


async def test_redis_restarts_mid_traffic(prod: Prod) -> None:
    async def restart() -> None:
        prod.redis.cut()  # down: connections reset, new ones refused
        await drop_redis(prod.redis_url)  # a restart without persistence keeps nothing
        await asyncio.sleep(1.0)
        prod.redis.restore()

    await run_traffic_with_fault(prod, restart)


async def test_sessions_survive_redis_outage_and_routes_come_back(prod: Prod) -> None:
    a = await Wire.login(prod.port, 1, "d")
    b = await Wire.login(prod.port, 2, "d")
    prod.redis.cut()
    await drop_redis(prod.redis_url)
    await a.send(Ping())
    assert isinstance(await a.wait_for(Pong), Pong)  # heartbeats keep working
    late = await Wire.open(prod.port)
    reply = await late.request(Login(0, 1, 3, "d", token(3, "d")))
    assert isinstance(reply, Error) and reply.code == ErrorCode.UNAVAILABLE  # clear error
    prod.redis.restore()
    node = prod.server.node
    assert node is not None
    # The next renewal re-creates the live routes.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and await node.routes.get(2, "d") is None:
        await a.send(Ping())
        await b.send(Ping())
        await asyncio.sleep(0.3)
    assert await node.routes.get(2, "d") is not None
    ok = await Wire.login(prod.port, 3, "d")  # and logins work again
    await ok.close()


async def test_mysql_unreachable_fails_fast_and_recovers(prod: Prod) -> None:
    w = await Wire.login(prod.port, 1, "d")
    g = await w.request(GroupCreate(0, "g", (2,)))
    assert isinstance(g, ConvOk)
    assert isinstance(await w.request(Send(0, g.conv_id, "before", 1, b"x")), SendAck)
    for fault in (prod.mysql.cut, prod.mysql.blackhole):
        fault()
        started = time.monotonic()
        reply = await w.request(Send(0, g.conv_id, f"during-{fault.__name__}", 1, b"y"), 15)
        assert isinstance(reply, Error) and reply.code == ErrorCode.UNAVAILABLE
        assert time.monotonic() - started < 8.0  # the store's timeout (3 s) plus a margin
        await w.send(Ping())
        assert isinstance(await w.wait_for(Pong), Pong)  # the gateway stays up
        prod.mysql.restore()
        deadline = time.monotonic() + 10
        while True:  # the client's retry, same client_msg_id, until it is acked
            reply = await w.request(Send(0, g.conv_id, f"during-{fault.__name__}", 1, b"y"), 15)
            if isinstance(reply, SendAck) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert isinstance(reply, SendAck), reply
    rows = await pull_all(w, g.conv_id)
    cmids = [c for _, _, c in rows if c]
    assert cmids == ["before", "during-cut", "during-blackhole"]


async def test_route_ttl_is_at_most_90s_and_renewed_by_ping(prod: Prod) -> None:
    node = prod.server.node
    assert node is not None
    w = await Wire.login(prod.port, 7, "d")
    ttl0 = await node.routes.ttl(7, "d")
    assert ttl0 is not None and 85 < ttl0 <= 90
    await asyncio.sleep(2.5)
    ttl1 = await node.routes.ttl(7, "d")
    assert ttl1 is not None and ttl1 < ttl0 - 2  # not renewed without traffic
    await w.send(Ping())
    await w.wait_for(Pong)
    await asyncio.sleep(1.6)  # the next renewal check (every 1 s here)
    ttl2 = await node.routes.ttl(7, "d")
    assert ttl2 is not None and ttl2 > ttl1 + 1.5 and ttl2 <= 90
