"""Push events (--push-url, docs/push.md), on every backend: each committed message's
registered devices that had no online session get exactly its event, less the
sender's own and those that muted the conversation, with the text only where the
device allowed a preview and the unread count for the badge; a sink that fails is
retried until it answers, and a node killed before the sink's answer delivers after
its restart."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.hooks.push import PushStage
from gateway.server import Server
from protocol.frames import ConvOk, Mute, Ok, OpenP2P, PushRegister, PushRegisterOk, Send, SendAck
from tests.conftest import StartGateway
from tests.support.proc import GatewayProcess
from tests.support.waiting import wait_until
from tests.support.webhook import Receiver
from tests.support.wire import Wire


async def register(w: Wire, token: str, **opts: Any) -> None:
    reply = await w.request(PushRegister(0, "apns", token, **opts))
    assert isinstance(reply, PushRegisterOk), reply


async def send(w: Wire, conv: int, text: str) -> str:
    """Send `text`; the id of its push event."""
    ack = await w.request(Send(0, conv, text, 1, text.encode()))
    assert isinstance(ack, SendAck), ack
    return f"{conv}:{ack.seq}"


def recipients(events: list[dict[str, Any]], event_id: str) -> set[tuple[Any, ...]]:
    """(uid, device, token, unread, text) of each recipient of `event_id`'s events."""
    return {
        (r["uid"], r["device"], r["token"], r["unread"], r.get("text"))
        for e in events
        if e["id"] == event_id
        for r in e["recipients"]
    }


async def test_offline_devices_get_events_and_muting_stops_them(
    start_gateway: StartGateway,
) -> None:
    sink = await Receiver().start()
    try:
        gw = await start_gateway(push_url=sink.url, push_token="push-secret")
        alice = await Wire.login(gw.port, 1, "phone")
        await register(alice, "alice-phone")  # the sender's own devices get no event
        opened = await alice.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        conv = opened.conv_id
        phone = await Wire.login(gw.port, 2, "phone")
        await register(phone, "bob-phone", preview=True)
        tablet = await Wire.login(gw.port, 2, "tablet")
        await register(tablet, "bob-tablet")  # no preview: the event carries no text
        await phone.close()  # the phone goes to the background; the tablet stays online

        first = await send(alice, conv, "hello")
        await sink.wait_for_events({first})  # the badge counts what is unread when built
        second = await send(alice, conv, "again")
        events = await sink.wait_for_events({second})
        assert recipients(events, first) == {(2, "phone", "bob-phone", 1, "hello")}
        assert recipients(events, second) == {(2, "phone", "bob-phone", 2, "again")}
        [event] = [e for e in events if e["id"] == first][:1]
        assert (event["conv_id"], event["sender_uid"], event["msg_type"]) == (conv, 1, 1)
        assert sink.auth[0] == "Bearer push-secret"

        await tablet.close()  # now no device of bob is online
        third = await send(alice, conv, "both")
        events = await sink.wait_for_events({third})
        assert recipients(events, third) == {
            (2, "phone", "bob-phone", 3, "both"),
            (2, "tablet", "bob-tablet", 3, None),
        }

        tablet = await Wire.login(gw.port, 2, "tablet")  # back online: no event for it
        fourth = await send(alice, conv, "online")
        events = await sink.wait_for_events({fourth})
        assert recipients(events, fourth) == {(2, "phone", "bob-phone", 4, "online")}

        muted = await tablet.request(Mute(0, conv, 2**62))
        assert isinstance(muted, Ok)
        await send(alice, conv, "muted")
        marker = await send(await Wire.login(gw.port, 3), await _p2p(gw, 3, 2), "marker")
        events = await sink.wait_for_events({marker})
        assert [e["id"] for e in events].count(f"{conv}:5") == 0, "a muted member got an event"
        stage = _push_stage(gw)
        assert stage.events >= 5 and stage.recipients >= 6
    finally:
        await sink.close()


async def _p2p(gw: Server, a: int, b: int) -> int:
    w = await Wire.login(gw.port, a, "other")
    opened = await w.request(OpenP2P(0, b))
    assert isinstance(opened, ConvOk)
    return opened.conv_id


def _push_stage(gw: Server) -> PushStage:
    assert gw.node is not None and gw.node.hooks is not None
    [stage] = [s for s in gw.node.hooks.stages if isinstance(s, PushStage)]
    return stage


async def test_a_failing_sink_is_retried_and_the_notify_webhook_goes_on_its_own(
    start_gateway: StartGateway,
) -> None:
    """Both hooks on: the push sink answers 503 a few times; the notify webhook gets
    each message once, the sink gets each event, repeats counted (none here)."""
    sink = await Receiver([503, 503, 503]).start()
    notify = await Receiver().start()
    try:
        gw = await start_gateway(push_url=sink.url, notify_url=notify.url)
        bob = await Wire.login(gw.port, 2, "phone")
        await register(bob, "bob-phone")
        await bob.close()
        alice = await Wire.login(gw.port, 1)
        opened = await alice.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        ids = {await send(alice, opened.conv_id, f"m{i}") for i in range(10)}
        events = await sink.wait_for_events(ids, timeout=20)
        assert Counter(e["id"] for e in events) == dict.fromkeys(ids, 1)
        got = await notify.wait_for(10)
        assert len(got) == 10, "the notify webhook got a batch again for the sink's retry"
        assert _push_stage(gw).sinks[0].failures == 3
    finally:
        await sink.close()
        await notify.close()


@pytest.mark.slow
async def test_a_sink_down_for_a_minute_gets_every_event_after(tmp_path: Path) -> None:
    """The sink answers 503 for 60 s under traffic, then 200: every offline recipient
    gets exactly its events (repeats counted), and the backlog showed in /metrics."""
    sink = await Receiver().start()
    sink.status = 503
    gw = GatewayProcess(tmp_path / "data", None, "--push-url", sink.url).start()
    try:
        bob = await Wire.login(gw.port, 2, "phone")
        await register(bob, "bob-phone")
        await bob.close()
        alice = await Wire.login(gw.port, 1)
        opened = await alice.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        ids: set[str] = set()
        down_until = time.monotonic() + 60
        while time.monotonic() < down_until:
            ids.add(await send(alice, opened.conv_id, f"m{len(ids)}"))
            await asyncio.sleep(0.05)
        assert not sink.events()
        sink.status = 200
        events = await sink.wait_for_events(ids, timeout=60)
        counts = Counter(e["id"] for e in events)
        assert set(counts) == ids
        assert all(
            recipients([e], e["id"]) and {r["token"] for r in e["recipients"]} == {"bob-phone"}
            for e in events
        )
        print(f"{len(ids)} events, {sum(counts.values()) - len(ids)} repeats")
    finally:
        gw.kill()
        await sink.close()


async def test_a_killed_node_delivers_the_events_it_owed_after_its_restart(
    tmp_path: Path,
) -> None:
    sink = await Receiver().start()
    sink.status = 503  # nothing is acknowledged before the kill
    gw = GatewayProcess(tmp_path / "data", None, "--push-url", sink.url).start()
    try:
        bob = await Wire.login(gw.port, 2, "phone")
        await register(bob, "bob-phone", preview=True)
        await bob.close()
        alice = await Wire.login(gw.port, 1)
        opened = await alice.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        ids = {await send(alice, opened.conv_id, f"k{i}") for i in range(30)}
        await wait_until(lambda: sink.refused >= 1, 10, "the sink was tried")
        gw.signal(signal.SIGKILL)
        gw.wait()
        assert not sink.events()
        sink.status = 200
        gw.start()
        events = await sink.wait_for_events(ids, timeout=30)
        for e in events:
            assert [(r["uid"], r["device"], r["token"]) for r in e["recipients"]] == [
                (2, "phone", "bob-phone")
            ]
    finally:
        gw.kill()
        await sink.close()
