"""The admin port (/healthz, /readyz, /metrics) and draining a node: POST /drain (what
`imgw drain --admin` sends) moves every client away with KICK draining and the reconnect
hint, paced at the asked rate, then the node stops."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.cli.adminclient import DrainError, drain_by_admin, revoke_by_admin
from gateway.config import Config, ConfigError
from gateway.server import Server
from protocol.frames import (
    ConvOk,
    Error,
    Frame,
    Kick,
    Login,
    OpenP2P,
    Ping,
    Pong,
    Pull,
    PullResult,
    PushRegister,
    PushRegisterOk,
    Send,
)
from protocol.ops import ErrorCode, KickReason
from protocol.token import sign_token
from tests import conftest
from tests.conftest import StartGateway
from tests.support.proc import free_port
from tests.support.wire import KID, SECRET, Wire, token

pytestmark = pytest.mark.backends("embedded")


async def http(port: int, method: str, target: str, *headers: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "".join(f"{h}\r\n" for h in headers)
    writer.write(f"{method} {target} HTTP/1.0\r\n{head}\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


@pytest.fixture
async def admin_gw(start_gateway: StartGateway) -> tuple[Server, int]:
    port = free_port()
    return await start_gateway(admin_port=port), port


async def test_health_ready_and_metrics(admin_gw: tuple[Server, int]) -> None:
    gw, admin = admin_gw
    w = await Wire.login(gw.port, 1, "d")
    assert await http(admin, "GET", "/healthz") == (200, "ok\n")
    assert await http(admin, "GET", "/readyz") == (200, "ready\n")
    status, body = await http(admin, "GET", "/metrics")
    assert status == 200
    assert "imgw_sessions 1.0" in body
    assert "imgw_bus_lost_total 0.0" in body  # the bus adapter's counters are exported
    assert (await http(admin, "GET", "/nope"))[0] == 404
    await w.close()


async def test_drain_refuses_bad_requests(admin_gw: tuple[Server, int]) -> None:
    gw, admin = admin_gw
    assert (await http(admin, "GET", "/drain"))[0] == 405  # state changes need POST
    assert (await http(admin, "POST", "/drain?rate=fast"))[0] == 400
    assert (await http(admin, "POST", "/drain?rate=-1"))[0] == 400
    assert gw.node is not None and gw.node.accepting  # none of them started a drain


async def test_drain_kicks_everyone_with_the_hint_and_stops(admin_gw: tuple[Server, int]) -> None:
    gw, admin = admin_gw
    port = gw.port
    wires = [await Wire.login(port, uid, "d") for uid in range(1, 4)]
    assert await http(admin, "POST", "/drain?rate=0&hint=10.0.0.2:7070") == (202, "draining\n")
    for w in wires:
        assert await w.closed() == [Kick(KickReason.DRAINING, "server draining", "10.0.0.2:7070")]
    await asyncio.wait_for(gw.wait_stopped(), timeout=10)
    with pytest.raises(OSError):  # no longer accepting
        await Wire.login(port, 9, "d")


async def test_drain_paces_kicks_at_the_asked_rate(admin_gw: tuple[Server, int]) -> None:
    gw, admin = admin_gw
    wires = [await Wire.login(gw.port, uid, "d") for uid in range(1, 31)]
    started = time.monotonic()
    assert (await http(admin, "POST", "/drain?rate=100"))[0] == 202
    assert (await http(admin, "POST", "/drain"))[0] == 409  # already draining

    async def kicked_at(w: Wire) -> float:
        frames = await w.closed(timeout=10)
        assert frames == [Kick(KickReason.DRAINING, "server draining", "")]
        return time.monotonic() - started

    times = sorted(await asyncio.gather(*(kicked_at(w) for w in wires)))
    # 30 kicks at 100/s take about 0.3 s; all at once would take a few ms.
    assert times[-1] - times[0] >= 0.2
    assert times[-1] < 5
    await asyncio.wait_for(gw.wait_stopped(), timeout=10)


async def test_drain_refuses_a_non_finite_rate(admin_gw: tuple[Server, int]) -> None:
    gw, admin = admin_gw
    assert (await http(admin, "POST", "/drain?rate=inf"))[0] == 400
    assert (await http(admin, "POST", "/drain?rate=nan"))[0] == 400
    assert gw.node is not None and gw.node.accepting


async def test_a_login_during_a_drain_is_sent_elsewhere(admin_gw: tuple[Server, int]) -> None:
    gw, admin = admin_gw
    port = gw.port
    wires = [await Wire.login(port, uid, "d") for uid in range(1, 41)]
    late = await Wire.open(port)  # connected before the drain, logs in during it
    assert (await http(admin, "POST", "/drain?rate=20&hint=10.0.0.3:7070"))[0] == 202
    await late.send(Login(1, 1, 99, "d", token(99, "d")))
    assert await late.closed() == [Kick(KickReason.DRAINING, "server draining", "10.0.0.3:7070")]
    for w in wires:
        await w.close()
    await asyncio.wait_for(gw.wait_stopped(), timeout=10)


@pytest.mark.backends("production", "cluster")
async def test_pulls_answered_by_the_recent_cache_are_counted(
    start_gateway: StartGateway,
) -> None:
    port = free_port()
    gw = await start_gateway(admin_port=port)
    alice = await Wire.login(gw.port, 1)
    opened = await alice.request(OpenP2P(0, 2))
    assert isinstance(opened, ConvOk)
    for i in range(3):
        await alice.request(Send(0, opened.conv_id, f"c-{i}", 1, b"x"))
    pulled: Frame = PullResult(0, 0, False, ())
    for _ in range(50):  # the cache write follows the commit: soon, not at once
        pulled = await alice.request(Pull(0, opened.conv_id, 1, 0))
        if "imgw_recent_cache_hits_total 1.0" in (await http(port, "GET", "/metrics"))[1]:
            break
        await asyncio.sleep(0.02)
    assert isinstance(pulled, PullResult) and [m.seq for m in pulled.msgs] == [2, 3]
    assert "imgw_recent_cache_hits_total 1.0" in (await http(port, "GET", "/metrics"))[1]
    await alice.close()


async def test_admin_actions_need_the_token_when_one_is_set(start_gateway: StartGateway) -> None:
    port = free_port()
    gw = await start_gateway(admin_port=port, admin_token="s3cret")
    assert await http(port, "GET", "/healthz") == (200, "ok\n")  # open
    assert (await http(port, "GET", "/metrics"))[0] == 200  # open
    assert (await http(port, "POST", "/drain"))[0] == 401
    assert (await http(port, "POST", "/drain", "Authorization: Bearer wrong"))[0] == 401
    assert (await http(port, "POST", "/drain", "Authorization: Basic s3cret"))[0] == 401
    assert gw.node is not None and gw.node.accepting  # none of them started a drain
    assert (await http(port, "POST", "/drain", "authorization: bearer s3cret"))[0] == 202
    await asyncio.wait_for(gw.wait_stopped(), timeout=10)  # the drain ran to its end


async def test_imgw_drain_and_revoke_say_what_the_admin_port_answered(
    start_gateway: StartGateway,
) -> None:
    """The CLI's client (gateway/cli/adminclient.py) against the admin listener: a refusal says the
    message of its JSON error, not the JSON; a revoke prints the node's answer."""
    port = free_port()
    gw = await start_gateway(admin_port=port, admin_token="s3cret")
    addr = f"127.0.0.1:{port}"
    with pytest.raises(DrainError) as refused:
        await asyncio.to_thread(
            drain_by_admin, addr, rate=None, hint=None, wait=False, timeout=5, token="wrong"
        )
    assert str(refused.value).startswith(f"{addr} answered 401: ")
    assert "{" not in str(refused.value), refused.value
    revoked = await asyncio.to_thread(revoke_by_admin, addr, 5, None, token="s3cret")
    assert revoked == "revoked; 0 session(s) kicked"
    await asyncio.to_thread(
        drain_by_admin, addr, rate=None, hint=None, wait=False, timeout=5, token="s3cret"
    )
    await asyncio.wait_for(gw.wait_stopped(), timeout=10)


def test_a_public_admin_address_needs_a_token(tmp_path: Path) -> None:
    def config(**kw: object) -> Config:
        return conftest.make_config(tmp_path, port=7070, admin_port=9100, **kw)

    with pytest.raises(ConfigError, match="admin token"):
        config(admin_host="0.0.0.0").validate()
    config(admin_host="0.0.0.0", admin_token="t").validate()
    config(admin_host="127.0.0.1").validate()


async def _revoke(port: int, query: str) -> tuple[int, str]:
    return await http(port, "POST", f"/revoke?{query}", "Authorization: Bearer s3cret")


@pytest.mark.backends("embedded", "production", "cluster")
async def test_revoke_refuses_old_tokens_and_kicks_sessions(start_gateway: StartGateway) -> None:
    port = free_port()
    gw = await start_gateway(admin_port=port, admin_token="s3cret")
    now = int(time.time())
    old_a = token(5, "a")  # v1: no minting time
    a = await Wire.login(gw.port, 5, "a", tok=old_a)
    b = await Wire.login(gw.port, 5, "b", tok=v2_token(5, "b", iat=now - 10))
    for w, push_token in ((a, "token-a"), (b, "token-b")):
        assert isinstance(await w.request(PushRegister(0, "fcm", push_token)), PushRegisterOk)
    assert (await _revoke(port, "uid=5&device=a"))[0] == 200
    [kick] = await a.closed()
    store = gw.node.store  # type: ignore[union-attr]
    # the revoked device is told nothing more; the other keeps its registration
    assert [d.device for d in (await store.push_devices([5]))[5]] == ["b"]
    assert isinstance(kick, Kick) and kick.reason == KickReason.AUTH_REVOKED
    await b.send(Ping())
    assert isinstance(await b.wait_for(Pong), Pong)  # the other device stays
    # the revoked device's old token is refused; a token minted after the revocation works
    again = await Wire.open(gw.port)
    refused = await again.request(Login(0, 1, 5, "a", old_a))
    assert isinstance(refused, Error) and refused.code == ErrorCode.AUTH_FAILED
    assert "revoked" in refused.text
    # (minted a second after the revocation: `now` may be seconds old on a busy machine)
    await Wire.login(gw.port, 5, "a", tok=v2_token(5, "a", iat=int(time.time()) + 1))
    # every device: b is kicked too
    assert (await _revoke(port, "uid=5"))[0] == 200
    [kick] = await b.closed()
    assert isinstance(kick, Kick) and kick.reason == KickReason.AUTH_REVOKED
    assert await store.push_devices([5]) == {}
    assert (await http(port, "POST", "/revoke?uid=5"))[0] == 401  # the admin token
    assert (await _revoke(port, "uid=zero"))[0] == 400
    assert (await _revoke(port, "uid=5&device=no%20spaces"))[0] == 400


def v2_token(uid: int, device: str, *, iat: int) -> str:
    return sign_token(KID, SECRET, uid, device, iat + 3600, iat=iat)
