"""PUSH_REGISTER, PUSH_UNREGISTER and MUTE over the wire (docs/protocol.md, Offline
push), on every backend: what each answers, and what the store then holds."""

from __future__ import annotations

import time
from typing import Any

import msgpack
import pytest

from gateway.server import Server
from protocol.codec import frame_bytes
from protocol.frames import (
    ConvOk,
    Error,
    GroupCreate,
    Logout,
    Mute,
    Ok,
    OpenP2P,
    PushRegister,
    PushRegisterOk,
    PushUnregister,
)
from protocol.ops import ErrorCode
from storage.errors import StoreUnavailable
from storage.models import PushDevice
from tests.support.stores import muted_uids
from tests.support.wire import Wire


async def registered(gw: Server, *uids: int) -> dict[int, list[tuple[str, str, str]]]:
    """(device, provider, token) of each uid's registrations, newest first."""
    found: dict[int, list[PushDevice]] = await gw.node.store.push_devices(uids)  # type: ignore[union-attr]
    return {u: [(d.device, d.provider, d.token) for d in rows] for u, rows in found.items()}


async def register(w: Wire, provider: str, token: str, **opts: Any) -> None:
    reply = await w.request(PushRegister(0, provider, token, **opts))
    assert isinstance(reply, PushRegisterOk), reply


async def test_register_and_register_again(gw: Server) -> None:
    w = await Wire.login(gw.port, 1, "phone")
    await register(w, "apns", "a1" * 32, preview=True, locale="pt-BR")
    [dev] = (await gw.node.store.push_devices([1]))[1]  # type: ignore[union-attr]
    assert (dev.uid, dev.device, dev.provider, dev.token) == (1, "phone", "apns", "a1" * 32)
    assert (dev.preview, dev.locale) == (True, "pt-BR")
    assert abs(dev.updated_ms - time.time() * 1000) < 60_000
    await register(w, "fcm", "fcm-token")  # a new token, and the opts' defaults
    [dev] = (await gw.node.store.push_devices([1]))[1]  # type: ignore[union-attr]
    assert (dev.provider, dev.token, dev.preview, dev.locale) == ("fcm", "fcm-token", False, "")


async def test_a_token_moves_to_the_uid_registering_it(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1, "phone")
    await register(alice, "fcm", "the-phone")
    await alice.close()  # the app goes to the background: the registration stays
    assert await registered(gw, 1) == {1: [("phone", "fcm", "the-phone")]}
    bob = await Wire.login(gw.port, 2, "phone")  # bob logs in on the same phone
    await register(bob, "fcm", "the-phone")
    assert await registered(gw, 1, 2) == {2: [("phone", "fcm", "the-phone")]}


async def test_unregister(gw: Server) -> None:
    w = await Wire.login(gw.port, 1, "phone")
    other = await Wire.login(gw.port, 1, "tablet")
    await register(w, "apns", "p")
    await register(other, "apns", "t")
    assert isinstance(await w.request(PushUnregister(0)), Ok)
    assert await registered(gw, 1) == {1: [("tablet", "apns", "t")]}
    assert isinstance(await w.request(PushUnregister(0)), Ok)  # none left: OK too


async def test_logout_unregisters_and_a_dropped_connection_does_not(gw: Server) -> None:
    phone = await Wire.login(gw.port, 1, "phone")
    tablet = await Wire.login(gw.port, 1, "tablet")
    await register(phone, "apns", "p")
    await register(tablet, "apns", "t")
    await phone.close()
    await tablet.send(Logout())
    assert await tablet.closed() == []
    assert await registered(gw, 1) == {1: [("phone", "apns", "p")]}


@pytest.mark.backends("embedded")
async def test_logout_closes_even_when_the_store_cannot_unregister(
    gw: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = await Wire.login(gw.port, 1, "phone")
    await register(w, "apns", "p")

    async def down(uid: int, device: str) -> bool:
        raise StoreUnavailable("sqlite: disk I/O error")

    monkeypatch.setattr(gw.node.store, "push_unregister", down)
    await w.send(Logout())
    assert await w.closed() == []  # LOGOUT's promise holds: the route is gone, closed
    assert await gw.node.routes.get(1, "phone") is None  # type: ignore[union-attr]
    assert await registered(gw, 1) == {1: [("phone", "apns", "p")]}  # kept, and logged


async def test_an_eleventh_device_replaces_the_least_recently_registered(gw: Server) -> None:
    for i in range(11):
        w = await Wire.login(gw.port, 1, f"d{i:02d}")
        await register(w, "fcm", f"t{i:02d}")
        await w.close()
        if i == 0:  # registering again from d00 does not make room: it replaces itself
            w = await Wire.login(gw.port, 1, "d00")
            await register(w, "fcm", "t00")
            await w.close()
    devices = [d for d, _, _ in (await registered(gw, 1))[1]]
    assert devices == [f"d{i:02d}" for i in range(10, 0, -1)]  # d00 went


@pytest.mark.parametrize(
    "body",
    [
        [80, 7, "APNS", "t", {}],
        [80, 7, "", "t", {}],
        [80, 7, "p" * 17, "t", {}],
        [80, 7, "apns", "", {}],
        [80, 7, "apns", "x" * 2049, {}],
        [80, 7, "apns", b"t", {}],
        [80, 7, "apns", "t"],
        [80, 7, "apns", "t", None],
        [80, 7, "apns", "t", {"preview": 1}],
        [80, 7, "apns", "t", {"locale": "x" * 36}],
        [80, 7, "apns", "t", {"locale": "en US"}],
        [84, 7, 0, 5],
        [84, 7, 1, -1],
        [84, 7, 1, "5"],
    ],
)
async def test_bad_inputs_are_bad_requests_and_store_nothing(gw: Server, body: list[Any]) -> None:
    w = await Wire.login(gw.port, 1, "phone")
    await w.write(frame_bytes(msgpack.packb(body, use_bin_type=True)))
    err = await w.wait_for(Error, rid=7)
    assert err.code == ErrorCode.BAD_REQUEST
    assert await registered(gw, 1) == {}
    await register(w, "apns", "t")  # the connection lives on
    assert await registered(gw, 1) == {1: [("phone", "apns", "t")]}


async def test_mute_and_unmute(gw: Server) -> None:
    a = await Wire.login(gw.port, 1)
    reply = await a.request(OpenP2P(0, 2))
    assert isinstance(reply, ConvOk)
    conv = reply.conv_id
    reply = await a.request(GroupCreate(0, "g", (2, 3)))
    assert isinstance(reply, ConvOk)
    group = reply.conv_id
    now = int(time.time() * 1000)
    store: Any = gw.node.store
    assert isinstance(await a.request(Mute(0, conv, now + 3_600_000)), Ok)
    assert isinstance(await a.request(Mute(0, group, 2**64 - 1)), Ok)  # for good
    assert await muted_uids(store, conv, [1, 2], now) == {1}
    assert await muted_uids(store, group, [1, 2, 3], now + 10 * 365 * 86_400_000) == {1}
    assert await muted_uids(store, conv, [1], now + 3_600_000) == set()  # it ends
    assert isinstance(await a.request(Mute(0, conv, 0)), Ok)
    assert await muted_uids(store, conv, [1], now) == set()
    assert isinstance(await a.request(Mute(0, group, now - 1)), Ok)  # a time past unmutes
    assert await muted_uids(store, group, [1], now) == set()


async def test_mute_needs_membership(gw: Server) -> None:
    a = await Wire.login(gw.port, 1)
    stranger = await Wire.login(gw.port, 9)
    reply = await a.request(OpenP2P(0, 2))
    assert isinstance(reply, ConvOk)
    until = int(time.time() * 1000) + 60_000
    assert await stranger.error(Mute(0, reply.conv_id, until)) == ErrorCode.NOT_MEMBER
    assert await stranger.error(Mute(0, 2**40, until)) == ErrorCode.NO_SUCH_CONVERSATION
    assert await muted_uids(gw.node.store, reply.conv_id, [9], 0) == set()
