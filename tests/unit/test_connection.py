"""Connection without sockets: a node on the embedded store (SQLite in a temp dir,
in-process routes and bus), the fake transport of tests.support.fakes, and the timing
wheel's decisions (`on_timer`) driven with chosen times, no sleeping."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest

from gateway.config import Config
from gateway.connection import CLOSE_GRACE_S, READ_BATCH, Connection, State
from gateway.node import Node
from gateway.ratelimit import UidRateLimiter
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.frames import (
    Error,
    Kick,
    Login,
    LoginOk,
    Ping,
    Pong,
    Presence,
    ServerFrame,
    SyncHint,
)
from protocol.ops import ErrorCode, KickReason, Op
from storage.factory import open_backends
from tests.support.fakes import FakeTransport
from tests.support.wire import TOKEN_KEY, token


def frames_of(t: FakeTransport) -> list[ServerFrame]:
    """Every frame the connection wrote that the test has not read yet."""
    decoder = FrameDecoder(max_frame=1 << 24, side=Side.CLIENT)
    return decoder.feed(t.take())  # type: ignore[return-value]


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    config = Config(
        port=0,
        token_keys=(TOKEN_KEY,),
        data_dir=str(tmp_path),
        node_id="unit",
        op_rate_burst=20,
        op_rate_per_s=1.0,
        max_write_buffer=1000,
    )
    b = open_backends(f"sqlite:///{tmp_path}/imgw.db", "memory://", "local://")
    await b.store.start()
    n = Node(config, node_id="unit", store=b.store, routes=b.routes, bus=b.bus)
    yield n
    n.close()
    await n.settle()
    await b.store.close()


def connect(node: Node) -> tuple[Connection, FakeTransport]:
    conn = node.protocol_factory()
    transport = FakeTransport(conn)
    conn.connection_made(transport)
    return conn, transport


async def logged_in(node: Node, uid: int = 7) -> tuple[Connection, FakeTransport]:
    conn, t = connect(node)
    conn.data_received(encode(Login(1, 1, uid, "ios", token(uid, "ios"))))
    for _ in range(100):
        if conn.active:
            break
        await asyncio.sleep(0.01)
    (ok,) = frames_of(t)
    assert isinstance(ok, LoginOk)
    return conn, t


async def test_login_activates_and_registers_the_session(node: Node) -> None:
    conn, _ = await logged_in(node)
    assert conn.state == State.ACTIVE and (conn.uid, conn.device) == (7, "ios")
    assert node.sessions[conn.conn_id] is conn
    assert await node.routes.get(7, "ios") == conn.route


async def test_a_lone_ping_is_answered_pong(node: Node) -> None:
    conn, t = await logged_in(node)
    conn.data_received(encode(Ping()))
    conn.data_received(encode(Ping()) + encode(Ping()))  # two in one read: decoded
    assert frames_of(t) == [Pong(), Pong(), Pong()]


async def test_a_frame_before_login_closes_with_not_logged_in(node: Node) -> None:
    conn, t = connect(node)
    conn.data_received(encode(Presence(5, (1, 2))))
    (err,) = frames_of(t)
    assert isinstance(err, Error) and err.code == ErrorCode.NOT_LOGGED_IN and err.rid == 5
    assert t.closed and conn.state == State.CLOSING


async def test_a_login_with_bad_fields_is_bad_request(node: Node) -> None:
    conn, t = connect(node)
    body = msgpack.packb([int(Op.LOGIN), 3, {"v": 1, "uid": "seven"}])  # uid: not an int
    conn.data_received(len(body).to_bytes(4, "big") + body)
    (err,) = frames_of(t)
    assert isinstance(err, Error) and err.code == ErrorCode.BAD_REQUEST and err.rid == 3
    assert t.closed


async def test_login_deadline(node: Node) -> None:
    conn, t = connect(node)
    deadline = conn.phase_deadline
    assert deadline == pytest.approx(node.loop.time() + node.config.login_timeout, abs=1)
    assert conn.on_timer(deadline - 1) == deadline  # not yet: look again then
    assert frames_of(t) == []
    assert conn.on_timer(deadline) is None
    (err,) = frames_of(t)
    assert isinstance(err, Error) and err.code == ErrorCode.NOT_LOGGED_IN
    assert err.text == "login timeout" and t.closed


async def test_idle_connection_is_closed_without_a_frame(node: Node) -> None:
    conn, t = await logged_in(node)
    idle_at = conn.last_rx + node.config.idle
    nxt = conn.on_timer(idle_at - 1)
    assert nxt is not None and nxt <= idle_at
    assert not t.closed
    assert conn.on_timer(idle_at) is None
    assert t.closed and frames_of(t) == [] and conn.state == State.CLOSING
    assert conn.conn_id not in node.sessions  # no longer routed to


async def test_the_idle_deadline_it_returns_closes_when_it_comes(node: Node) -> None:
    """The timer fires at the deadline on_timer returned, and that closes: even where
    `deadline - last_rx` rounds below `idle`, as it does when the sum crosses a power of
    two (the loop's clock counts seconds since boot: 4,096 s is an hour and eight
    minutes), so the timer does not come back at the same time again."""
    conn, t = await logged_in(node)
    idle = node.config.idle
    last_rx = next(x for k in range(1, 100_000) if ((x := 4096.0 - k / 7919) + idle) - x < idle)
    conn.last_rx = last_rx
    conn.last_renew = last_rx + idle  # no route renewal due before the idle deadline
    deadline = conn.on_timer(last_rx + 1)
    assert deadline == last_rx + idle
    assert conn.on_timer(deadline) is None and t.closed


async def test_an_unfinished_frame_has_frame_timeout(node: Node) -> None:
    conn, t = await logged_in(node)
    frame = encode(Presence(9, (1,)))
    conn.data_received(frame[:3])
    started = conn.last_rx
    assert conn.phase_deadline == started + node.config.frame_timeout
    conn.data_received(frame[3:])  # completed in time: no deadline left
    assert conn.phase_deadline == 0.0
    frames_of(t)
    conn.data_received(frame[:3])
    assert conn.on_timer(conn.phase_deadline) is None
    (err,) = frames_of(t)
    assert isinstance(err, Error) and err.code == ErrorCode.BAD_FRAME and t.closed


async def test_an_expired_token_is_kicked(node: Node) -> None:
    conn, t = await logged_in(node)
    assert conn.token_deadline > conn.last_rx + 3000  # an hour's token, plus leeway
    conn.last_rx = conn.token_deadline  # still talking: only the token ends it
    conn.last_renew = conn.token_deadline
    assert conn.on_timer(conn.token_deadline) is None
    (kick,) = frames_of(t)
    assert isinstance(kick, Kick) and kick.reason == KickReason.AUTH_REVOKED


async def test_the_route_is_renewed_only_after_traffic(node: Node) -> None:
    conn, _ = await logged_in(node)
    renew_at = conn.last_renew + node.config.route_renew_s
    conn.on_timer(renew_at)  # nothing received since the login: no renewal
    assert node._renewals == []
    conn.last_rx = renew_at - 1
    conn.on_timer(renew_at)
    assert node._renewals == [conn.route]


async def test_a_closing_connection_is_aborted_after_the_grace(node: Node) -> None:
    conn, t = await logged_in(node)
    conn.kick(KickReason.SHUTDOWN, "bye")
    assert t.closed and not t.aborted
    grace_end = conn.phase_deadline
    assert grace_end == pytest.approx(node.loop.time() + CLOSE_GRACE_S, abs=1)
    assert conn.on_timer(grace_end - 1) == grace_end
    assert conn.on_timer(grace_end) is None
    assert t.aborted


async def test_a_slow_consumer_queues_then_is_kicked(node: Node) -> None:
    conn, t = await logged_in(node)
    conn.pause_writing()  # the transport is past its high-water mark
    hint = encode(SyncHint())
    conn.write(hint)
    assert t.unread == b""  # held in the node's backlog, not the transport
    conn.resume_writing()
    assert frames_of(t) == [SyncHint()]
    conn.pause_writing()
    for _ in range(node.config.max_write_buffer // len(hint) + 1):
        conn.write(hint)
    frames = frames_of(t)
    assert len(frames) == 1 and isinstance(frames[0], Kick)
    assert frames[0].reason == KickReason.SLOW_CONSUMER  # the queue was dropped
    assert t.closed and conn not in node.backlog


async def test_over_the_op_budget_requests_are_refused_and_reading_pauses(node: Node) -> None:
    conn, t = await logged_in(node)
    burst = node.config.op_rate_burst
    conn.data_received(b"".join(encode(Presence(i + 1, (1,))) for i in range(burst + 5)))
    assert not t.reading  # the penalty: not read for a while
    await asyncio.sleep(0.05)  # the refusals go out together at the iteration's end
    await node.settle()
    for _ in range(100):
        frames = frames_of(t)
        if frames:
            break
        await asyncio.sleep(0.01)
    refused = [f for f in frames if isinstance(f, Error)]
    assert refused and all(f.code == ErrorCode.RATE_LIMITED for f in refused)
    assert refused[0].rid == burst + 1


async def answers(t: FakeTransport, n: int) -> list[ServerFrame]:
    """The next `n` frames the connection writes (its requests run as tasks)."""
    got: list[ServerFrame] = []
    for _ in range(200):
        got += frames_of(t)
        if len(got) >= n:
            break
        await asyncio.sleep(0.01)
    return got


async def test_over_the_op_budget_the_rest_of_a_read_waits_undecoded(node: Node) -> None:
    """A read of 5,000 requests costs the node READ_BATCH of them while the uid is over
    its budget: the rest waits as bytes (counted with unfinished frames), and is read,
    in order, once the budget has refilled: after READ_BATCH tokens' worth of refill
    (here 20 tokens at 100/s: 0.2 s), not after a fixed pause."""
    node.op_limiter = UidRateLimiter(burst=20, rate=100.0, clock=node.loop.time)
    conn, t = await logged_in(node)
    requests = [encode(Presence(i + 1, (1,))) for i in range(5000)]
    conn.data_received(b"".join(requests))
    assert not t.reading
    assert conn.decoder is not None and conn.decoder.ahead
    assert conn.decoder.buffered == sum(map(len, requests[READ_BATCH:]))  # not decoded
    assert node.partial_bytes == conn.decoder.buffered
    first = await answers(t, READ_BATCH)
    assert len(first) == READ_BATCH  # 20 answered, 12 refused: nothing more decoded
    assert sum(isinstance(f, Error) for f in first) == READ_BATCH - 20
    assert not t.reading and t.pauses == 1
    started = node.loop.time()
    more = await answers(t, READ_BATCH)
    assert 0.15 <= node.loop.time() - started <= 0.45  # 20 tokens at 100/s
    assert t.pauses == 2  # the next batch ran out again
    rids = [getattr(f, "rid", 0) for f in more]
    assert len(more) == READ_BATCH and min(rids) == READ_BATCH + 1  # in order, behind
    assert sum(isinstance(f, Error) for f in more) <= READ_BATCH - 19
    assert node.partial_bytes == sum(map(len, requests[2 * READ_BATCH :]))


async def test_a_flood_paused_with_requests_queued_stays_paused(node: Node) -> None:
    """Answering the requests queued before the budget ran out does not end its pause."""
    node.op_limiter = UidRateLimiter(burst=20, rate=1.0, clock=node.loop.time)
    conn, t = await logged_in(node)
    conn.data_received(b"".join(encode(Presence(i + 1, (1,))) for i in range(1000)))
    await answers(t, READ_BATCH)
    await asyncio.sleep(0.1)
    assert not t.reading and conn in node.penalized
    conn.connection_lost(None)
    assert conn not in node.penalized and node.partial_bytes == 0


async def log_in(node: Node, uid: int, device: str) -> tuple[Connection, FakeTransport]:
    conn, t = connect(node)
    conn.data_received(encode(Login(1, 1, uid, device, token(uid, device))))
    for _ in range(100):
        if conn.active or conn.state >= State.CLOSING:
            break
        await asyncio.sleep(0.01)
    return conn, t


async def test_a_uid_has_at_most_max_connections_per_uid(node: Node) -> None:
    node.config = dataclasses.replace(node.config, max_connections_per_uid=2)
    first, _ = await log_in(node, 7, "a")
    second, _ = await log_in(node, 7, "b")
    third, t = await log_in(node, 7, "c")
    assert first.active and second.active and not third.active
    (err,) = frames_of(t)
    assert isinstance(err, Error) and err.code == ErrorCode.RATE_LIMITED and err.rid == 1
    assert t.closed
    again, _ = await log_in(node, 7, "b")  # a device online already: replaces itself
    assert again.active and second.state >= State.CLOSING
    other, _ = await log_in(node, 8, "a")  # another uid is not concerned
    assert other.active
    first.connection_lost(None)
    fourth, _ = await log_in(node, 7, "c")  # a place came free
    assert fourth.active


async def test_logins_sent_at_once_cannot_all_pass_the_uid_cap(node: Node) -> None:
    node.config = dataclasses.replace(node.config, max_connections_per_uid=3)
    conns = [connect(node) for _ in range(10)]
    for i, (conn, _) in enumerate(conns):  # all before any route is written
        conn.data_received(encode(Login(1, 1, 7, f"d{i}", token(7, f"d{i}"))))
    for _ in range(100):
        if all(c.active or c.state >= State.CLOSING for c, _ in conns):
            break
        await asyncio.sleep(0.01)
    assert sum(c.active for c, _ in conns) == 3


async def test_connections_per_ip_are_capped(node: Node) -> None:
    node.config = dataclasses.replace(node.config, max_connections_per_ip=2)
    a, _ = connect(node)
    connect(node)
    refused, t = connect(node)
    assert t.aborted and refused.conn_id == 0
    a.connection_lost(None)
    admitted, t = connect(node)
    assert admitted.conn_id and not t.aborted


def test_the_defaults_cap_connections_per_uid_and_per_ip() -> None:
    config = Config(port=0)
    assert config.max_connections_per_uid == 16 and config.max_connections_per_ip == 20_000


async def test_a_frame_over_max_frame_closes_with_bad_frame(node: Node) -> None:
    conn, t = await logged_in(node)
    too_big = node.config.max_frame + 1
    conn.data_received(too_big.to_bytes(4, "big") + b"\x00")
    (err,) = frames_of(t)
    assert isinstance(err, Error) and err.code == ErrorCode.FRAME_TOO_LARGE
    assert t.closed


async def test_a_second_login_of_the_device_kicks_the_first(node: Node) -> None:
    first, t1 = await logged_in(node)
    second, _ = await logged_in(node)
    (kick,) = frames_of(t1)
    assert isinstance(kick, Kick) and kick.reason == KickReason.DUPLICATE_LOGIN
    assert node.by_device[(7, "ios")] is second and first.conn_id not in node.sessions


async def test_connection_lost_forgets_it(node: Node) -> None:
    conn, _ = await logged_in(node)
    assert node.open_count == 1
    conn.connection_lost(None)
    assert node.open_count == 0 and conn.state == State.CLOSED
    assert conn.conn_id not in node.sessions


async def test_a_full_node_refuses_the_connection(node: Node) -> None:
    node.max_connections = 1
    connect(node)
    conn, t = connect(node)
    assert t.aborted and conn.state == State.CLOSED and conn.conn_id == 0


async def test_the_batcher_runs_as_many_commits_at_once_as_the_store_pays_for(
    node: Node, tmp_path: Path
) -> None:
    """The default (`batch_inflight` 0) is the store's own: 2 on the embedded store's
    single writer, 4 on MySQL; a value given wins."""
    assert node.config.batch_inflight == 0
    assert node.batcher.max_inflight == 2
    from storage.mysql import MySQLSettings, MySQLStore

    mysql = MySQLStore(MySQLSettings.from_url("mysql://root:@127.0.0.1:1/none"))  # never opened
    for chosen, expected in ((0, 4), (3, 3)):
        config = dataclasses.replace(node.config, batch_inflight=chosen)
        n = Node(config, node_id="unit2", store=mysql, routes=node.routes, bus=node.bus)
        assert n.batcher.max_inflight == expected
        n.close()


async def test_the_node_finds_each_device_of_a_uid(node: Node) -> None:
    a, _ = await log_in(node, 7, "a")
    b, _ = await log_in(node, 7, "b")
    c, _ = await log_in(node, 8, "a")
    devices = node.by_device
    assert devices[(7, "a")] is a and devices[(7, "b")] is b and devices[(8, "a")] is c
    assert (7, "c") not in devices and devices.get((9, "a")) is None
    assert devices.count(7) == 2 and devices.count(8) == 1 and len(devices) == 3
    a.connection_lost(None)
    assert (7, "a") not in devices and devices[(7, "b")] is b and devices.count(7) == 1
    b.connection_lost(None)
    assert devices.count(7) == 0 and len(devices) == 1


async def test_pipelined_pings_are_answered_and_draw_on_the_op_budget(node: Node) -> None:
    """A lone PING is free; PINGs that come several in a read are answered too, but a
    read of 5,000 of them costs READ_BATCH PONGs, then the connection waits for its
    budget like any other flood."""
    conn, t = await logged_in(node)
    conn.data_received(encode(Ping()) * 5000)
    pongs = frames_of(t)
    assert pongs == [Pong()] * READ_BATCH and not t.reading
    assert conn.decoder is not None and conn.decoder.ahead
    conn.connection_lost(None)
    other, t = await logged_in(node)  # the same uid, its budget spent
    other.data_received(encode(Ping()))  # alone in its read: answered, and free
    assert frames_of(t) == [Pong()] and t.reading
