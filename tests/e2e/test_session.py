"""LOGIN, liveness, kicks and LOGOUT over real TCP sockets."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import msgpack
import pytest

import gateway.connection
from gateway.server import Server
from protocol.codec import encode
from protocol.frames import (
    ConvOk,
    Error,
    Kick,
    Login,
    LoginOk,
    Logout,
    OpenP2P,
    Ping,
    Pong,
    Pull,
    Sync,
    SyncResult,
    Typing,
)
from protocol.ops import ErrorCode, KickReason
from protocol.token import sign_token
from tests.conftest import StartGateway
from tests.support.wire import KID, SECRET, Wire, token

pytestmark = pytest.mark.websocket


async def test_login_ok_announces_limits(gw: Server) -> None:
    w = await Wire.open(gw.port)
    ok = await w.request(Login(0, 1, 42, "phone", token(42, "phone")))
    assert isinstance(ok, LoginOk)
    assert (ok.node, ok.hb, ok.idle, ok.max_frame, ok.max_content) == (
        "test-node",
        30,
        75,
        65536,
        2048,
    )
    assert abs(ok.ts - time.time() * 1000) < 5000
    route = await gw.node.routes.get(42, "phone")  # type: ignore[union-attr]
    assert route is not None and route.node == "test-node"
    await w.close()


async def test_first_frame_not_login_is_not_logged_in_and_closes(gw: Server) -> None:
    w = await Wire.open(gw.port)
    await w.send(Pull(7, 1, 0, 0))
    frames = await w.closed()
    assert frames == [Error(7, ErrorCode.NOT_LOGGED_IN, "LOGIN must come first")]


async def test_login_with_bad_fields_is_bad_request_and_closes(gw: Server) -> None:
    w = await Wire.open(gw.port)
    await w.write(_raw([1, 3, {"v": 1, "uid": "x", "device": "d", "token": "t"}]))
    frames = await w.closed()
    assert len(frames) == 1 and isinstance(frames[0], Error)
    assert (frames[0].rid, frames[0].code) == (3, ErrorCode.BAD_REQUEST)


async def test_device_outside_pattern_is_bad_request(gw: Server) -> None:
    w = await Wire.open(gw.port)
    await w.send(Login(2, 1, 5, "bad device!", token(5, "x")))
    [err] = await w.closed()
    assert isinstance(err, Error) and err.code == ErrorCode.BAD_REQUEST


async def test_version_unsupported_closes(gw: Server) -> None:
    w = await Wire.open(gw.port)
    await w.send(Login(2, 2, 5, "d", token(5, "d")))
    [err] = await w.closed()
    assert isinstance(err, Error) and err.code == ErrorCode.VERSION_UNSUPPORTED


async def test_bad_tokens_fail_auth(gw: Server) -> None:
    now = int(time.time())
    bad = {
        "garbage": "not-a-token",
        "wrong secret": sign_token(KID, "other", 5, "d", now + 60),
        "unknown kid": sign_token("nokid", SECRET, 5, "d", now + 60),
        "expired": sign_token(KID, SECRET, 5, "d", now - 120),
        "other uid": sign_token(KID, SECRET, 6, "d", now + 60),
        "other device": sign_token(KID, SECRET, 5, "e", now + 60),
        "100 years": sign_token(KID, SECRET, 5, "d", now + 100 * 365 * 86_400),
        "31 days": sign_token(KID, SECRET, 5, "d", now + 31 * 86_400),
    }
    for why, tok in bad.items():
        w = await Wire.open(gw.port)
        await w.send(Login(9, 1, 5, "d", tok))
        frames = await w.closed()
        assert frames == [Error(9, ErrorCode.AUTH_FAILED, "token refused")], why
    assert await gw.node.routes.get(5, "d") is None  # type: ignore[union-attr]


async def test_token_within_leeway_is_accepted(gw: Server) -> None:
    tok = sign_token(KID, SECRET, 5, "d", int(time.time()) - 30)
    w = await Wire.open(gw.port)
    assert isinstance(await w.request(Login(0, 1, 5, "d", tok)), LoginOk)
    await w.close()


async def test_rotated_keys_both_verify(start_gateway: StartGateway) -> None:
    gw = await start_gateway(token_keys=("old:s1", "new:s2"))
    for kid, secret in (("old", "s1"), ("new", "s2")):
        w = await Wire.open(gw.port)
        tok = sign_token(kid, secret, 5, kid, int(time.time()) + 60)
        assert isinstance(await w.request(Login(0, 1, 5, kid, tok)), LoginOk)
        await w.close()


async def test_second_login_on_same_connection_is_bad_request_and_kept(gw: Server) -> None:
    w = await Wire.login(gw.port, 5)
    assert await w.error(Login(0, 1, 5, "d1", token(5, "d1"))) == ErrorCode.BAD_REQUEST
    await w.send(Ping())
    assert isinstance(await w.wait_for(Pong), Pong)
    await w.close()


async def test_a_sync_pipelined_behind_login_is_answered_in_the_login_oks_write(
    gw: Server,
) -> None:
    """Apps send SYNC in the LOGIN's write: LOGIN_OK then waits for the SYNC's answer,
    and both arrive in one write (one wakeup of the client, not two)."""
    w = await Wire.open(gw.port)
    await w.write(encode(Login(1, 1, 61, "d1", token(61, "d1"))) + encode(Sync(2, 0, 0, 50)))
    first = await asyncio.wait_for(w.reader.read(65536), 5)
    frames = w.decoder.feed(first)
    assert [type(f) for f in frames] == [LoginOk, SyncResult], frames
    assert frames[1].rid == 2
    await w.close()


async def test_login_ok_held_for_a_request_that_answers_nothing_goes_when_it_is_handled(
    gw: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TYPING has no answer: the held LOGIN_OK goes once it is handled, not at the
    cork's time limit (set to a minute here)."""
    monkeypatch.setattr(gateway.connection, "CORK_MAX_S", 60.0)
    a = await Wire.login(gw.port, 62)
    conv = await a.request(OpenP2P(0, 63))
    assert isinstance(conv, ConvOk)
    w = await Wire.open(gw.port)
    await w.write(encode(Login(1, 1, 62, "d2", token(62, "d2"))) + encode(Typing(conv.conv_id)))
    assert isinstance(await w.recv(timeout=5), LoginOk)
    await w.send(Ping())
    assert isinstance(await w.recv(timeout=5), Pong)
    await a.close()
    await w.close()


async def test_login_ok_held_for_a_logout_goes_before_the_close(gw: Server) -> None:
    w = await Wire.open(gw.port)
    await w.write(encode(Login(1, 1, 64, "d1", token(64, "d1"))) + encode(Logout()))
    frames = await w.closed(timeout=5)
    assert [type(f) for f in frames] == [LoginOk], frames


async def test_login_ok_held_for_a_slow_answer_goes_alone_at_the_time_limit(
    gw: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request behind the LOGIN that takes longer than CORK_MAX_S does not hold the
    LOGIN_OK beyond it."""
    monkeypatch.setattr(gateway.connection, "CORK_MAX_S", 0.05)
    real_sync = gw.node.store.sync

    async def slow_sync(*args: object, **kw: object) -> object:
        await asyncio.sleep(1.0)
        return await real_sync(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(gw.node.store, "sync", slow_sync)
    w = await Wire.open(gw.port)
    started = asyncio.get_running_loop().time()
    await w.write(encode(Login(1, 1, 65, "d1", token(65, "d1"))) + encode(Sync(2, 0, 0, 50)))
    assert isinstance(await w.recv(timeout=5), LoginOk)
    assert asyncio.get_running_loop().time() - started < 0.9  # before the SYNC's answer
    assert isinstance(await w.recv(timeout=5), SyncResult)
    await w.close()


async def test_login_deadline(start_gateway: StartGateway) -> None:
    gw = await start_gateway(login_timeout=0.5)
    w = await Wire.open(gw.port)
    started = time.monotonic()
    frames = await w.closed(timeout=3)
    assert frames == [Error(0, ErrorCode.NOT_LOGGED_IN, "login timeout")]
    assert 0.4 < time.monotonic() - started < 2.0


async def test_a_login_received_in_time_is_not_failed_for_the_nodes_own_slowness(
    start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """login_timeout is the client's time to send LOGIN: a node that takes longer than
    that to install the route (a reconnect storm) still logs the client in."""
    gw = await start_gateway(login_timeout=0.5)
    assert gw.node is not None
    routes = gw.node.routes
    register = routes.register

    async def slow_register(*args: Any, **kw: Any) -> Any:
        await asyncio.sleep(0.8)
        return await register(*args, **kw)

    monkeypatch.setattr(routes, "register", slow_register)
    w = await Wire.open(gw.port)
    assert isinstance(await w.request(Login(0, 1, 66, "d1", token(66, "d1"))), LoginOk)
    await w.close()


async def test_a_login_the_node_cannot_complete_in_time_is_answered_unavailable(
    start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past three login_timeouts the node gives up on a received LOGIN with
    `unavailable` (retry later), not `not_logged_in`."""
    gw = await start_gateway(login_timeout=0.3)
    assert gw.node is not None

    async def stuck_register(*args: Any, **kw: Any) -> Any:
        await asyncio.sleep(30)

    monkeypatch.setattr(gw.node.routes, "register", stuck_register)
    w = await Wire.open(gw.port)
    started = time.monotonic()
    await w.send(Login(1, 1, 67, "d1", token(67, "d1")))
    frames = await w.closed(timeout=5)
    assert [(type(f), getattr(f, "code", None)) for f in frames] == [(Error, ErrorCode.UNAVAILABLE)]
    assert 0.8 < time.monotonic() - started < 3.0


async def test_idle_connection_is_closed_without_a_frame(start_gateway: StartGateway) -> None:
    gw = await start_gateway(hb=1, idle=2)
    quiet = await Wire.login(gw.port, 5, "quiet")
    chatty = await Wire.login(gw.port, 6, "chatty")
    started = time.monotonic()
    for _ in range(6):  # a PING every 0.5 s keeps the other connection alive
        await chatty.send(Ping())
        await chatty.wait_for(Pong)
        await asyncio.sleep(0.5)
    assert await quiet.closed(timeout=3) == []
    assert time.monotonic() - started < 4.0
    assert await gw.node.routes.get(5, "quiet") is None  # type: ignore[union-attr]
    assert await gw.node.routes.get(6, "chatty") is not None  # type: ignore[union-attr]
    await chatty.close()


async def test_duplicate_login_kicks_the_older_connection(gw: Server) -> None:
    old = await Wire.login(gw.port, 5, "phone")
    new = await Wire.login(gw.port, 5, "phone")
    frames = await old.closed()
    assert frames == [Kick(KickReason.DUPLICATE_LOGIN, "logged in elsewhere", "")]
    await asyncio.sleep(0.05)  # let the old connection's cleanup run
    route = await gw.node.routes.get(5, "phone")  # type: ignore[union-attr]
    assert route is not None and route.conn_id == gw.node.by_device[(5, "phone")].conn_id  # type: ignore[union-attr]
    await new.send(Ping())
    await new.wait_for(Pong)
    await new.close()


async def test_other_device_of_same_user_is_not_kicked(gw: Server) -> None:
    a = await Wire.login(gw.port, 5, "phone")
    b = await Wire.login(gw.port, 5, "laptop")
    assert await a.quiet(0.2) == []
    await a.close()
    await b.close()


async def test_token_expiry_kicks_auth_revoked(gw: Server) -> None:
    # Valid for about 1 more second including the 60 s leeway.
    tok = sign_token(KID, SECRET, 5, "d", int(time.time()) - 59)
    w = await Wire.open(gw.port)
    assert isinstance(await w.request(Login(0, 1, 5, "d", tok)), LoginOk)
    frames = await w.closed(timeout=4)
    assert frames == [Kick(KickReason.AUTH_REVOKED, "token expired", "")]


async def test_logout_removes_route_and_closes(gw: Server) -> None:
    w = await Wire.login(gw.port, 5, "d")
    await w.send(Logout())
    assert await w.closed() == []
    assert await gw.node.routes.get(5, "d") is None  # type: ignore[union-attr]


async def test_ping_pong_and_route_ttl(gw: Server) -> None:
    w = await Wire.login(gw.port, 5, "d")
    await w.send(Ping())
    assert isinstance(await w.recv(), Pong)
    ttl = await gw.node.routes.ttl(5, "d")  # type: ignore[union-attr]
    assert ttl is not None and 0 < ttl <= 90
    await w.close()


async def test_shutdown_drains_sessions(start_gateway: StartGateway) -> None:
    gw = await start_gateway()
    w = await Wire.login(gw.port, 5, "d")
    await gw.shutdown()
    assert await w.closed() == [Kick(KickReason.DRAINING, "server draining", "")]


def _raw(obj: object) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body
