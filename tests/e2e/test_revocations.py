"""Revocations outlive the route store: a revoked token stays refused after Redis lost
its keys (FLUSHDB, a restart without persistence, an empty replica) and after the
gateway restarted on the same data (storage/revocations.py); and a v2 token's minting
time is checked against the clock and its own expiry (protocol/token.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import pytest

from gateway.server import Server
from protocol.frames import Error, Kick, Login, LoginOk, Ping, Pong
from protocol.ops import ErrorCode, KickReason
from protocol.token import TOKEN_LEEWAY_S, sign_token
from tests.conftest import StartGateway
from tests.support.api import TOKEN, Api
from tests.support.proc import free_port
from tests.support.services import drop_redis
from tests.support.wire import KID, SECRET, Wire, token


def minted(uid: int, device: str, iat: int, *, ttl: int = 3600) -> str:
    """A v2 token minted at `iat`."""
    return sign_token(KID, SECRET, uid, device, iat + ttl, iat=iat)


async def login(port: int, uid: int, device: str, tok: str) -> LoginOk | Error:
    w = await Wire.open(port)
    answer = await w.request(Login(0, 1, uid, device, tok))
    assert isinstance(answer, LoginOk | Error), answer
    if isinstance(answer, Error):
        assert answer.code == ErrorCode.AUTH_FAILED, answer
    return answer


def refused(answer: LoginOk | Error, why: str = "revoked") -> bool:
    return isinstance(answer, Error) and why in answer.text


@pytest.mark.backends("embedded", "mysql", "production", "sharded", "cluster")
async def test_a_revoked_token_stays_refused_when_the_route_store_loses_everything(
    start_gateway: StartGateway, backend_urls: dict[str, str]
) -> None:
    admin = free_port()
    config = {"admin_port": admin, "admin_token": TOKEN}
    gw = await start_gateway(**config)
    api = Api(admin)
    before = int(time.time()) - 10
    old_v1 = token(5, "a")  # no minting time: any revocation covers it
    old_a, old_b = minted(5, "a", before), minted(5, "b", before)
    a = await Wire.login(gw.port, 5, "a", tok=old_a)
    b = await Wire.login(gw.port, 5, "b", tok=old_b)

    assert await api.ok("POST", "revoke", {"uid": 5, "device": "a"}) == {"kicked": 1}
    [kick] = await a.closed()
    assert isinstance(kick, Kick) and kick.reason == KickReason.AUTH_REVOKED
    cache = backend_urls.get("cache", "memory://")
    if cache.startswith("redis"):
        await drop_redis(cache)  # the test's FLUSHDB: every key of its prefix
        # this node's copy still refuses the old tokens
        assert refused(await login(gw.port, 5, "a", old_a))
        assert refused(await login(gw.port, 5, "a", old_v1))

    # A gateway restarted on the same data (its route store empty) refuses them too.
    await gw.shutdown()
    if cache.startswith("redis"):
        await drop_redis(cache)
    gw = await start_gateway(**config)
    assert refused(await login(gw.port, 5, "a", old_a))
    assert refused(await login(gw.port, 5, "a", old_v1))
    assert isinstance(await login(gw.port, 5, "b", old_b), LoginOk)  # another device
    # a token minted after the revocation is let in (a second after: `before` may be
    # seconds old on a busy machine)
    assert isinstance(await login(gw.port, 5, "a", minted(5, "a", int(time.time()) + 1)), LoginOk)

    # every device now: b's old token goes too, here and after another loss
    await b.close()
    assert (await api.ok("POST", "revoke", {"uid": 5}))["kicked"] >= 1
    await gw.shutdown()
    if cache.startswith("redis"):
        await drop_redis(cache)
    gw = await start_gateway(**config)
    assert refused(await login(gw.port, 5, "b", old_b))
    assert isinstance(await login(gw.port, 6, "b", minted(6, "b", before)), LoginOk)  # another uid


@pytest.mark.backends("production")
async def test_a_revocation_made_on_another_node_reaches_this_one_through_the_store(
    start_gateway: StartGateway, backend_urls: dict[str, str]
) -> None:
    """Node B was up before node A revoked the token; then Redis lost its keys. B reads
    the revocation from MySQL within a route check and refuses the token."""
    admin = free_port()
    gw_a = await start_gateway(node_id="node-a", admin_port=admin, admin_token=TOKEN)
    gw_b = await start_gateway(node_id="node-b")
    old = minted(7, "d", int(time.time()) - 10)
    assert isinstance(await login(gw_b.port, 7, "d", old), LoginOk)
    await Api(admin).ok("POST", "revoke", {"uid": 7})
    await drop_redis(backend_urls["cache"])
    deadline = time.monotonic() + 5
    while not refused(answer := await login(gw_b.port, 7, "d", old)):
        assert time.monotonic() < deadline, f"node B still lets the revoked token in: {answer}"
    assert refused(await login(gw_a.port, 7, "d", old))


def signed(body: str) -> str:
    """`body` with its signature, whatever its claims (a login service's bug)."""
    mac = hmac.new(SECRET.encode(), body.encode(), hashlib.sha256).digest()
    return f"{body}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"


@pytest.mark.backends("embedded")
async def test_a_token_minted_in_the_future_or_after_its_expiry_is_refused(gw: Server) -> None:
    port = gw.port
    now = int(time.time())
    # minted "50 minutes from now": it would escape a revocation made now
    assert refused(await login(port, 8, "d", minted(8, "d", now + 3000)), "token refused")
    # minted after its own expiry (which the leeway still accepts)
    assert refused(await login(port, 8, "d", signed(f"v2.{KID}.8.d.{now}.{now - 5}")), "refused")
    # within the clock leeway, it is let in
    w = await Wire.login(port, 8, "d", tok=minted(8, "d", now + TOKEN_LEEWAY_S // 2))
    await w.send(Ping())
    assert isinstance(await w.wait_for(Pong), Pong)
