"""The push events' RabbitMQ sink (--push-amqp, docs/push.md) against the real RabbitMQ
on 127.0.0.1:5672 (guest/guest): an offline device's event lands in imgw.push.events as
one persistent JSON message whose message_id is the event's id, on the documented
topology; a worker's rejection sends it to imgw.push.dead; and a RabbitMQ restart under
traffic (`rabbitmqctl stop_app`, then `start_app`) loses no event and holds up no SEND.

The queues have fixed names: each test deletes them first (the gateway declares them
again), so runs are independent; two runs at once on one broker are not. When RabbitMQ
is down the tests fail and say how to start it; they never skip."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from gateway.hooks.amqp import DEAD_EXCHANGE, DEAD_QUEUE, EXCHANGE, QUEUE, ROUTING_KEY
from gateway.hooks.push import PushStage
from gateway.server import Server
from protocol.frames import ConvOk, OpenP2P, PushRegister, PushRegisterOk, Send, SendAck
from tests.conftest import StartGateway
from tests.support.services import require_port
from tests.support.waiting import wait_until
from tests.support.wire import Wire

pytestmark = pytest.mark.backends("embedded")

RABBIT = "amqp://guest:guest@127.0.0.1:5672/"
RABBITMQCTL_S = 90.0  # the longest a stop_app or start_app may take
# A SEND never waits for the sink; its publish alone may take 5 s (the sink's timeout).
SEND_MAX_S = 2.0


@pytest.fixture
async def broker() -> AsyncIterator[AbstractChannel]:
    """A channel on the real RabbitMQ, with the push queues and exchanges deleted (the
    gateway declares them on its first event)."""
    require_port(5672, "RabbitMQ")
    conn = await aio_pika.connect(RABBIT)
    try:
        channel = await conn.channel()
        for queue in (QUEUE, DEAD_QUEUE):
            await channel.queue_delete(queue)
        for exchange in (EXCHANGE, DEAD_EXCHANGE):
            await channel.exchange_delete(exchange)
        yield channel
    finally:
        with contextlib.suppress(Exception):  # the restart test leaves it dead
            await conn.close()


async def register(port: int, uid: int, device: str, token: str, **opts: Any) -> None:
    """Register `uid`'s `device` for push under `token`, then drop its connection: the
    device is offline."""
    w = await Wire.login(port, uid, device)
    reply = await w.request(PushRegister(0, "apns", token, **opts))
    assert isinstance(reply, PushRegisterOk), reply
    await w.close()


async def p2p(w: Wire, peer: int) -> int:
    opened = await w.request(OpenP2P(0, peer))
    assert isinstance(opened, ConvOk), opened
    return opened.conv_id


async def send(w: Wire, conv: int, text: str) -> SendAck:
    ack = await w.request(Send(0, conv, text, 1, text.encode()))
    assert isinstance(ack, SendAck), ack
    return ack


async def take(
    channel: AbstractChannel, queue: str, want: int, timeout: float = 10.0
) -> list[AbstractIncomingMessage]:
    """The first `want` messages of `queue` (which must exist), unacknowledged."""
    q = await channel.get_queue(queue)
    got: list[AbstractIncomingMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < want:
        message = await q.get(fail=False)
        if message is not None:
            got.append(message)
        elif time.monotonic() > deadline:
            raise AssertionError(f"{len(got)} of {want} messages in {queue} after {timeout}s")
        else:
            await asyncio.sleep(0.05)
    return got


def push_stage(gw: Server) -> PushStage:
    assert gw.node is not None and gw.node.hooks is not None
    [stage] = [s for s in gw.node.hooks.stages if isinstance(s, PushStage)]
    return stage


async def test_an_offline_device_gets_one_persistent_json_message_per_event(
    start_gateway: StartGateway, broker: AbstractChannel
) -> None:
    gw = await start_gateway(push_amqp=RABBIT)
    await register(gw.port, 2, "phone", "bob-phone", preview=True, locale="fr")
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    ack = await send(alice, conv, "hello")
    stage = push_stage(gw)
    await wait_until(lambda: stage.events == 1, 10, "the event confirmed by RabbitMQ")

    [message] = await take(broker, QUEUE, 1)
    event_id = f"{conv}:{ack.seq}"
    assert message.message_id == event_id
    assert message.content_type == "application/json"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert (message.exchange, message.routing_key) == (EXCHANGE, ROUTING_KEY)
    assert json.loads(message.body) == {
        "id": event_id,
        "conv_id": conv,
        "seq": ack.seq,
        "msg_id": str(ack.msg_id),
        "sender_uid": 1,
        "msg_type": 1,
        "server_ms": ack.server_ms,
        "recipients": [
            {"uid": 2, "device": "phone", "provider": "apns", "token": "bob-phone",
             "locale": "fr", "unread": 1, "text": "hello"},
        ],
    }  # fmt: skip
    await message.ack()
    # the topology is the documented one: declaring it so again is no PRECONDITION_FAILED
    await broker.declare_exchange(EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
    await broker.declare_exchange(DEAD_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    await broker.declare_queue(DEAD_QUEUE, durable=True)
    await broker.declare_queue(
        QUEUE, durable=True, arguments={"x-dead-letter-exchange": DEAD_EXCHANGE}
    )
    assert (stage.recipients, stage.sinks[0].failures) == (1, 0)


async def test_a_rejected_event_goes_to_the_dead_letter_queue(
    start_gateway: StartGateway, broker: AbstractChannel
) -> None:
    gw = await start_gateway(push_amqp=RABBIT)
    await register(gw.port, 2, "phone", "bob-phone")
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    first = await send(alice, conv, "cannot deliver")
    second = await send(alice, conv, "fine")
    stage = push_stage(gw)
    await wait_until(lambda: stage.events == 2, 10, "both events confirmed by RabbitMQ")

    bad, good = await take(broker, QUEUE, 2)
    assert [bad.message_id, good.message_id] == [f"{conv}:{first.seq}", f"{conv}:{second.seq}"]
    await bad.reject(requeue=False)
    await good.ack()
    [dead] = await take(broker, DEAD_QUEUE, 1)
    assert dead.message_id == bad.message_id
    assert dead.body == bad.body and "text" not in json.loads(dead.body)  # no preview
    assert dead.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    headers: Any = dead.headers
    [death] = headers["x-death"]
    assert (death["queue"], death["reason"]) == (QUEUE, "rejected")
    await dead.ack()
    assert await (await broker.get_queue(QUEUE)).get(fail=False) is None


async def rabbitmqctl(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "rabbitmqctl", *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), RABBITMQCTL_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"rabbitmqctl {' '.join(args)} took over {RABBITMQCTL_S}s") from None
    assert proc.returncode == 0, f"rabbitmqctl {' '.join(args)}: {out.decode(errors='replace')}"


def port_answers() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        return False
    return True


async def push_channels() -> list[int]:
    """The channels each connection of a push sink ("imgw push") has open on the broker."""
    proc = await asyncio.create_subprocess_exec(
        "rabbitmqctl", "list_connections", "client_properties", "channels", "-q",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), RABBITMQCTL_S)
    assert proc.returncode == 0, out
    lines = out.decode(errors="replace").splitlines()
    return [int(line.rsplit("\t", 1)[1]) for line in lines if '"imgw push"' in line]


@contextlib.asynccontextmanager
async def rabbit_stopped() -> AsyncIterator[None]:
    """RabbitMQ's application stopped (the Erlang node stays up) for the block; started
    again at its end, whatever happened."""
    await rabbitmqctl("stop_app")
    try:
        yield
    finally:
        await rabbitmqctl("start_app")
        await rabbitmqctl("await_startup")


async def test_a_rabbitmq_restart_under_traffic_loses_no_event(
    start_gateway: StartGateway, broker: AbstractChannel
) -> None:
    """Alice sends to Bob and to Carol (both offline, Carol with two devices) and to
    Dave (online, no event) without a pause while RabbitMQ stops for a few seconds and
    starts again. Every SEND is acknowledged in time; then every acked message's event
    is in imgw.push.events (repeats allowed and counted) naming exactly the offline
    recipients of its conversation."""
    gw = await start_gateway(push_amqp=RABBIT)
    await register(gw.port, 2, "phone", "bob-phone")
    await register(gw.port, 3, "phone", "carol-phone")
    await register(gw.port, 3, "tablet", "carol-tablet")
    dave = await Wire.login(gw.port, 4, "phone")
    registered = await dave.request(PushRegister(0, "apns", "dave-phone"))
    assert isinstance(registered, PushRegisterOk), registered
    alice = await Wire.login(gw.port, 1)
    convs = {await p2p(alice, uid): tokens for uid, tokens in (
        (2, {"bob-phone"}), (3, {"carol-phone", "carol-tablet"}), (4, set()),
    )}  # fmt: skip
    expected: dict[str, set[str]] = {}  # event id: its recipients' tokens
    slowest = 0.0
    sending = True

    async def traffic() -> None:
        nonlocal slowest
        sent = 0
        while sending:
            for conv, tokens in convs.items():
                t0 = time.monotonic()
                sent += 1
                ack = await send(alice, conv, f"m{sent}")
                slowest = max(slowest, time.monotonic() - t0)
                if tokens:
                    expected[f"{conv}:{ack.seq}"] = tokens
            await asyncio.sleep(0.02)

    task = asyncio.create_task(traffic())
    try:
        stage = push_stage(gw)
        await wait_until(lambda: stage.events > 0, 10, "the first events confirmed")
        await asyncio.sleep(0.5)
        async with rabbit_stopped():
            await wait_until(lambda: not port_answers(), 30, "RabbitMQ to stop listening")
            down_from = len(expected)
            await asyncio.sleep(2.0)
            down_to = len(expected)
        await asyncio.sleep(1.0)
    finally:
        sending = False
        await task
    assert 0 < down_from < down_to < len(expected), (down_from, down_to, len(expected))
    assert slowest < SEND_MAX_S, f"a SEND took {slowest:.2f}s while RabbitMQ was away"

    conn = await aio_pika.connect(RABBIT)  # a fresh channel: the fixture's died
    try:
        channel = await conn.channel()
        got = await drain(channel, set(expected), timeout=60)
    finally:
        await conn.close()
    channels = await push_channels()
    assert channels and max(channels) == 1, f"a channel left open by the outage: {channels}"
    counts = Counter(e["id"] for e in got)
    assert set(counts) == set(expected), f"missing {sorted(set(expected) - set(counts))[:10]}"
    for e in got:
        assert {r["token"] for r in e["recipients"]} == expected[e["id"]], e
    repeats = sum(counts.values()) - len(counts)
    print(
        f"{len(expected)} events ({down_to - down_from} sent while RabbitMQ was down), {repeats} "
        f"repeats, {stage.sinks[0].failures} failed sends, slowest SEND {slowest * 1000:.0f} ms"
    )
    assert stage.sinks[0].failures >= 1


async def drain(channel: AbstractChannel, ids: set[str], timeout: float) -> list[dict[str, Any]]:
    """Consume imgw.push.events, acknowledging, until every id in `ids` came (and the
    queue is then empty); the events, repeats included."""
    queue = await channel.get_queue(QUEUE)
    got: list[dict[str, Any]] = []
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while True:
        message = await queue.get(fail=False)
        if message is None:
            if ids <= seen:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(ids - seen)} of {len(ids)} events missing after {timeout}s"
                )
            await asyncio.sleep(0.1)
            continue
        event = json.loads(message.body)
        assert message.message_id == event["id"]
        got.append(event)
        seen.add(event["id"])
        await message.ack()
