"""Push events with two nodes on MariaDB, Redis and RabbitMQ: a device online on the
other node counts as online (the fan-out published its PUSH there), and what a killed
node owed the push sink is delivered by the survivor that adopts its hook rows."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from protocol.frames import (
    ConvOk,
    OpenP2P,
    Presence,
    PresenceResult,
    PushRegister,
    PushRegisterOk,
    Send,
    SendAck,
)
from tests.cluster.conftest import Cluster
from tests.support.webhook import Receiver
from tests.support.wire import Wire


async def _register(w: Wire, token: str) -> None:
    assert isinstance(await w.request(PushRegister(0, "fcm", token)), PushRegisterOk)


async def _gone(port: int, uid: int, device: str) -> None:
    """Wait until `device` of `uid` has no route: its node saw it close. (Until then
    a fan-out on another node publishes to it, and so counts it online.)"""
    watch = await Wire.login(port, uid, "watch")  # unregistered: never a recipient

    async def online() -> tuple[str, ...]:
        reply = await watch.request(Presence(0, (uid,)))
        assert isinstance(reply, PresenceResult)
        return reply.entries[0][1]

    deadline = time.monotonic() + 10
    while device in await online():
        assert time.monotonic() < deadline, f"{uid}/{device} still online"
        await asyncio.sleep(0.02)
    await watch.close()


async def _send(w: Wire, conv: int, text: str) -> str:
    ack = await w.request(Send(0, conv, text, 1, text.encode()))
    assert isinstance(ack, SendAck), ack
    return f"{conv}:{ack.seq}"


async def test_a_device_online_on_another_node_gets_no_event(cluster: Cluster) -> None:
    sink = await Receiver().start()
    try:
        for _ in range(2):
            await cluster.start_node("--push-url", sink.url)
        a, b = cluster.nodes
        phone = await Wire.login(b.port, 2, "phone")
        await _register(phone, "bob-phone")
        await phone.close()
        await _gone(b.port, 2, "phone")
        tablet = await Wire.login(b.port, 2, "tablet")  # online, on the other node
        await _register(tablet, "bob-tablet")
        alice = await Wire.login(a.port, 1)
        opened = await alice.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        ids = {await _send(alice, opened.conv_id, f"x{i}") for i in range(5)}
        events = await sink.wait_for_events(ids, timeout=15)
        for e in events:
            assert [(r["uid"], r["device"]) for r in e["recipients"]] == [(2, "phone")]
    finally:
        await sink.close()


async def test_a_survivor_delivers_the_events_a_killed_node_owed(cluster: Cluster) -> None:
    sink = await Receiver().start()
    sink.status = 503  # nothing is acknowledged before the kill
    try:
        for _ in range(2):
            await cluster.start_node("--push-url", sink.url, "--node-lease", "2")
        doomed, survivor = cluster.nodes
        bob = await Wire.login(survivor.port, 2, "phone")
        await _register(bob, "bob-phone")
        await bob.close()
        await _gone(survivor.port, 2, "phone")
        alice = await Wire.login(doomed.port, 1)
        opened = await alice.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        ids = {await _send(alice, opened.conv_id, f"t{i}") for i in range(30)}
        doomed.kill()
        sink.status = 200
        events = await sink.wait_for_events(ids, timeout=40)
        counts = Counter(e["id"] for e in events)
        assert set(counts) >= ids
        for e in events:
            assert [(r["uid"], r["device"], r["token"]) for r in e["recipients"]] == [
                (2, "phone", "bob-phone")
            ]
        assert survivor.proc is not None and survivor.proc.poll() is None
    finally:
        await sink.close()
