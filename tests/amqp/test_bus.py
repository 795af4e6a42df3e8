"""AmqpBus against a real RabbitMQ on 127.0.0.1:5672 (guest/guest). When RabbitMQ is down
the tests fail and say how to start it; they never skip. Every node id is random, and
every node queue expires soon after its test (`expires_s`)."""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aio_pika
import pytest

from storage.amqp import AmqpBus, AmqpOptions, parse_amqp_url
from storage.errors import BusUnavailable
from storage.factory import BackendError, open_backends
from tests.support.services import require_port
from tests.support.tcpproxy import TcpProxy
from tests.support.waiting import wait_until

RABBIT = "amqp://guest:guest@127.0.0.1:5672/"
OPTS = "?expires_s=15&publish_timeout_s=1"


def node_id() -> str:
    return f"t-{secrets.token_hex(6)}"


Handler = Callable[[bytes], None] | Callable[[bytes], Awaitable[None]]


class Node:
    """A started bus and what it received."""

    def __init__(self, bus: AmqpBus, name: str) -> None:
        self.bus, self.name = bus, name
        self.inbox: list[bytes] = []
        self.resumed = 0


StartNode = Callable[..., Awaitable[Node]]


@pytest.fixture
async def nodes() -> AsyncIterator[StartNode]:
    require_port(5672, "RabbitMQ")
    started: list[AmqpBus] = []

    async def start(url: str = RABBIT + OPTS, handler: Handler | None = None) -> Node:
        bus = AmqpBus(url)
        node = Node(bus, node_id())

        def resumed() -> None:
            node.resumed += 1

        started.append(bus)
        await bus.start(node.name, handler or node.inbox.append, resumed)
        return node

    yield start
    for bus in started:
        await bus.close()


def counters(bus: AmqpBus) -> tuple[int, int, int, int, int]:
    return bus.published, bus.lost, bus.unroutable, bus.dead_lettered, bus.outages


async def test_two_nodes_exchange_envelopes_in_order(nodes: StartNode) -> None:
    b = await nodes()
    got_a: list[bytes] = []

    async def slow_handler(body: bytes) -> None:  # an awaiting handler must keep the order
        await asyncio.sleep(0.001 * (len(got_a) % 3))
        got_a.append(body)

    a = await nodes(handler=slow_handler)
    to_a = [f"to-a {i}".encode() for i in range(50)]
    to_b = [f"to-b {i}".encode() for i in range(50)]
    for x, y in zip(to_a, to_b, strict=True):
        await b.bus.publish(a.name, x)
        await a.bus.publish(b.name, y)
    await wait_until(lambda: len(got_a) == 50 and len(b.inbox) == 50, 10, "50 envelopes each")
    assert got_a == to_a
    assert b.inbox == to_b
    assert counters(a.bus) == counters(b.bus) == (50, 0, 0, 0, 0)
    await a.bus.close()
    await b.bus.close()
    assert a.resumed == b.resumed == 0
    assert counters(a.bus) == (50, 0, 0, 0, 0)  # a clean close is no outage


async def test_publish_to_a_node_without_queue_is_unroutable(
    nodes: StartNode,
) -> None:
    a = await nodes()
    t0 = time.monotonic()
    await a.bus.publish(node_id(), b"nobody home")
    assert time.monotonic() - t0 < 1.0
    # publisher confirms: the broker sends basic.return before the ack it answers with
    assert counters(a.bus) == (0, 0, 1, 0, 0)
    await a.bus.publish(a.name, b"to myself")  # the channel is still usable
    await wait_until(lambda: a.inbox == [b"to myself"], 5, "the envelope to itself")
    assert counters(a.bus) == (1, 0, 1, 0, 0)


async def test_handler_failure_dead_letters_and_delivery_goes_on(
    nodes: StartNode,
) -> None:
    got: list[bytes] = []
    tag = secrets.token_hex(4).encode()
    bad = b"bad " + tag

    def handler(body: bytes) -> None:
        if body == bad:
            raise ValueError("cannot decode")
        got.append(body)

    a = await nodes(handler=handler)
    b = await nodes()
    # a private queue on the dead-letter fanout sees a copy of every dead letter
    watcher = await aio_pika.connect(RABBIT, timeout=5)
    try:
        channel = await watcher.channel()
        spy = await channel.declare_queue(exclusive=True, auto_delete=True)
        await spy.bind("imgw.dlx")
        for body in (b"ok1 " + tag, bad, b"ok2 " + tag):
            await b.bus.publish(a.name, body)
        await wait_until(lambda: len(got) == 2, 5, "the good envelopes")
        assert got == [b"ok1 " + tag, b"ok2 " + tag]
        assert a.bus.dead_lettered == 1
        dead: list[aio_pika.abc.AbstractIncomingMessage] = []
        deadline = time.monotonic() + 5
        while not dead and time.monotonic() < deadline:
            msg = await spy.get(fail=False, no_ack=True)
            if msg is None:
                await asyncio.sleep(0.05)
            elif msg.body == bad:
                dead.append(msg)
        assert dead, "the failed envelope was not dead-lettered to imgw.dlx"
        death = dead[0].headers["x-death"][0]  # type: ignore[index]
        assert death["queue"] == f"imgw.node.{a.name}"  # type: ignore[index]
        assert death["reason"] == "rejected"  # type: ignore[index]
    finally:
        await watcher.close()
    assert counters(a.bus) == (0, 0, 0, 1, 0)
    assert counters(b.bus) == (3, 0, 0, 0, 0)


async def test_link_cut_counts_lost_then_resumes(
    nodes: StartNode,
) -> None:
    require_port(5672, "RabbitMQ")
    proxy = TcpProxy("127.0.0.1", 5672)
    port = await proxy.start()
    try:
        a = await nodes(f"amqp://guest:guest@127.0.0.1:{port}/{OPTS}")
        b = await nodes()
        await b.bus.publish(a.name, b"before")
        await a.bus.publish(b.name, b"hello b")
        await wait_until(lambda: a.inbox == [b"before"] and b.inbox == [b"hello b"], 5, "warm-up")

        proxy.cut()
        t0 = time.monotonic()
        await a.bus.publish(b.name, b"into the void")
        assert time.monotonic() - t0 < 1.5
        assert a.bus.lost == 1
        await wait_until(lambda: a.bus.outages == 1, 5, "the outage to be noticed")
        t0 = time.monotonic()
        await a.bus.publish(b.name, b"still down")
        assert time.monotonic() - t0 < 0.1  # known down: no wait at all
        assert a.bus.lost == 2
        # a's queue outlives its connection and buffers what other nodes send meanwhile
        await b.bus.publish(a.name, b"during")
        assert counters(b.bus) == (2, 0, 0, 0, 0)
        await asyncio.sleep(0.5)
        assert a.resumed == 0

        proxy.restore()
        await wait_until(lambda: a.resumed == 1, 15, "on_resume after the reconnect")
        # queue, binding and consumer are back: the buffered envelope and new ones arrive
        await b.bus.publish(a.name, b"after")
        await wait_until(lambda: a.inbox[-1:] == [b"after"], 5, "delivery after resume")
        assert a.inbox == [b"before", b"during", b"after"]
        await a.bus.publish(b.name, b"back")
        await wait_until(lambda: b.inbox[-1:] == [b"back"], 5, "a publishing again")
        assert counters(a.bus) == (2, 2, 0, 0, 1)
        await a.bus.close()
        assert (a.resumed, a.bus.outages) == (1, 1)
    finally:
        await proxy.close()


def test_url_options() -> None:
    url, opts = parse_amqp_url(
        "amqp://u:secret@mq:5673/v?queue_max=10&expires_s=2.5&prefetch=7&publish_timeout_s=0.2"
        "&name=gw"
    )
    assert opts == AmqpOptions(queue_max=10, expires_s=2.5, prefetch=7, publish_timeout_s=0.2)
    assert url.startswith("amqp://u:secret@mq:5673/v?")
    for option in ("queue_max", "expires_s", "prefetch", "publish_timeout_s"):
        assert option not in url
    assert "heartbeat=10" in url and "name=gw" in url
    assert parse_amqp_url("amqps://mq")[1] == AmqpOptions()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("amqp://u:secret@mq/?bogus=1", "unknown option 'bogus'"),
        ("amqp://mq/?queue_max=0", "queue_max >= 1"),
        ("amqp://mq/?expires_s=soon", "bad number"),
        ("amqp://mq/?prefetch=70000", "prefetch must be"),
        ("amqp://mq/?publish_timeout_s=0", "publish_timeout_s > 0"),
        ("http://mq/", "bad bus URL"),
    ],
)
def test_bad_urls_are_rejected(url: str, match: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=match) as e:
        AmqpBus(url)
    assert "secret" not in str(e.value)
    if url.startswith("amqp"):
        with pytest.raises(BackendError, match=match):
            open_backends(f"sqlite:///{tmp_path}/s.db", "memory://", url)


def test_factory_opens_an_amqp_bus(tmp_path: Path) -> None:
    backends = open_backends(f"sqlite:///{tmp_path}/s.db", "memory://", RABBIT + "?prefetch=64")
    assert isinstance(backends.bus, AmqpBus)
    assert backends.bus.options.prefetch == 64
    with pytest.raises(BackendError, match="local:// or amqp://"):
        open_backends(f"sqlite:///{tmp_path}/s.db", "memory://", "kafka://k")


async def test_unreachable_rabbitmq_fails_start_promptly() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    bus = AmqpBus(f"amqp://guest:secret@127.0.0.1:{port}/")
    t0 = time.monotonic()
    with pytest.raises(BusUnavailable) as e:
        await bus.start(node_id(), lambda body: None, lambda: None)
    assert time.monotonic() - t0 < 6
    message = str(e.value)
    assert f"127.0.0.1:{port}" in message and "rabbitmq-server" in message
    assert "secret" not in message
    await bus.publish("anyone", b"x")  # not started: counted, never raises
    assert counters(bus) == (0, 1, 0, 0, 0)
    await bus.close()
