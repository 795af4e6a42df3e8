"""The push worker of docs/push.md works as the page says: its code block, run as it is
against the real RabbitMQ (127.0.0.1:5672) and an in-process gateway with --push-amqp
and a `push` API key, notifies an offline device through the provider function it is
given, acknowledges a repeated event without notifying again, deletes the registration
of a token the provider called invalid (so no later event names it), and sends an event
whose provider call failed to imgw.push.dead. The block stays at most 30 lines.

The queues have fixed names: the test deletes them first (the gateway declares them
again). When RabbitMQ is down the test fails and says how to start it; never skips."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from gateway.hooks.amqp import DEAD_EXCHANGE, DEAD_QUEUE, EXCHANGE, QUEUE, ROUTING_KEY
from gateway.server import Server
from protocol.frames import (
    ConvOk,
    GroupCreate,
    OpenP2P,
    PushRegister,
    PushRegisterOk,
    Send,
    SendAck,
)
from tests.conftest import StartGateway
from tests.support.api import TOKEN
from tests.support.proc import free_port
from tests.support.services import require_port
from tests.support.wire import Wire

DOC = Path(__file__).resolve().parent.parent / "docs" / "push.md"
RABBIT = "amqp://guest:guest@127.0.0.1:5672/"
PUSH_KEY = "push-worker-secret-0123"
WAIT_S = 15.0

Worker = Callable[[str, str, str, Callable[..., Awaitable[str]]], Coroutine[Any, Any, None]]


def worker_block() -> str:
    """The python block of docs/push.md that defines the worker."""
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.MULTILINE | re.DOTALL)
    [block] = [b for b in blocks if "async def worker(" in b]
    return str(block)


def load_worker() -> Worker:
    namespace: dict[str, Any] = {"__name__": "push_worker_doc"}
    exec(compile(worker_block(), f"{DOC}:worker", "exec"), namespace)
    worker: Worker = namespace["worker"]
    return worker


def test_the_worker_block_is_short_and_takes_what_the_page_says() -> None:
    lines = worker_block().splitlines()
    assert len(lines) <= 30, f"the worker is {len(lines)} lines; the page promises 30"
    assert list(inspect.signature(load_worker()).parameters) == [
        "amqp_url", "api_url", "api_key", "send",
    ]  # fmt: skip
    text = DOC.read_text()
    assert "POST /api/v1/push-tokens/invalid" in text and '"push-tokens/invalid"' in text


async def register(port: int, uid: int, token: str) -> None:
    """Register `uid`'s phone under `token`, then drop its connection (offline)."""
    w = await Wire.login(port, uid, "phone")
    reply = await w.request(PushRegister(0, "apns", token, preview=True))
    assert isinstance(reply, PushRegisterOk), reply
    await w.close()


async def send(w: Wire, conv: int, text: str) -> str:
    """Send `text`; the id of its push event."""
    ack = await w.request(Send(0, conv, text, 1, text.encode()))
    assert isinstance(ack, SendAck), ack
    return f"{conv}:{ack.seq}"


async def until(what: str, pred: Callable[[], Awaitable[bool]], task: asyncio.Task[None]) -> None:
    """Poll `pred` until true; fail naming `what` after WAIT_S, or at once with the
    worker's own error if it stopped."""
    deadline = time.monotonic() + WAIT_S
    while not await pred():
        if task.done():
            task.result()
            raise AssertionError(f"the worker returned while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_S}s waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.backends("embedded")
async def test_the_documented_worker_notifies_dedupes_and_forgets_invalid_tokens(
    start_gateway: StartGateway,
) -> None:
    require_port(5672, "RabbitMQ")
    rabbit = await aio_pika.connect(RABBIT)
    try:
        channel = await rabbit.channel()
        for queue in (QUEUE, DEAD_QUEUE):
            await channel.queue_delete(queue)
        for exchange in (EXCHANGE, DEAD_EXCHANGE):
            await channel.exchange_delete(exchange)
        await run_worker(start_gateway, channel)
    finally:
        await rabbit.close()


async def run_worker(start_gateway: StartGateway, channel: aio_pika.abc.AbstractChannel) -> None:
    admin = free_port()
    gw: Server = await start_gateway(
        push_amqp=RABBIT, admin_port=admin, admin_token=TOKEN,
        api_keys=(f"pusher:{PUSH_KEY}:push",),
    )  # fmt: skip
    assert gw.node is not None
    store = gw.node.store
    await register(gw.port, 2, "bob-phone")
    await register(gw.port, 3, "carol-old")  # the provider says: invalid
    await register(gw.port, 4, "dave-phone")  # the provider fails
    alice = await Wire.login(gw.port, 1)
    group = await alice.request(GroupCreate(0, "trip", (2, 3)))
    assert isinstance(group, ConvOk), group
    to_dave = await alice.request(OpenP2P(0, 4))
    assert isinstance(to_dave, ConvOk), to_dave

    notified: list[tuple[str, str, str | None]] = []  # (event id, token, text)

    async def provider(recipient: dict[str, Any], event: dict[str, Any]) -> str:
        if recipient["token"] == "dave-phone":
            raise ConnectionError("the push service is down")
        notified.append((event["id"], recipient["token"], recipient.get("text")))
        return "invalid_token" if recipient["token"] == "carol-old" else "ok"

    api_url = f"http://127.0.0.1:{admin}/api/v1/"
    task = asyncio.create_task(load_worker()(RABBIT, api_url, PUSH_KEY, provider))
    try:
        first = await send(alice, group.conv_id, "hello")

        async def carol_forgotten() -> bool:
            return 3 not in await store.push_devices([3]) and len(notified) >= 2

        await until("carol's invalid token deleted", carol_forgotten, task)
        assert Counter(notified) == Counter(
            [(first, "bob-phone", "hello"), (first, "carol-old", "hello")]
        )
        assert 2 in await store.push_devices([2])

        # the same event again (a sink's retry): acknowledged, not sent again
        [event] = {e for e, _, _ in notified}
        again = aio_pika.Message(
            json.dumps({"id": event, "recipients": [{"token": "bob-phone"}]}).encode(),
            message_id=event, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )  # fmt: skip
        exchange = await channel.get_exchange(EXCHANGE)
        await exchange.publish(again, routing_key=ROUTING_KEY)
        second = await send(alice, group.conv_id, "again")  # queued behind the repeat

        async def second_done() -> bool:
            return any(e == second for e, _, _ in notified)

        await until("the second event", second_done, task)
        assert Counter(notified) == Counter([
            (first, "bob-phone", "hello"), (first, "carol-old", "hello"),
            (second, "bob-phone", "again"),
        ]), "a repeat was notified again, or an event named the deleted token"  # fmt: skip

        failed = await send(alice, to_dave.conv_id, "lost?")
        dead = await channel.get_queue(DEAD_QUEUE)
        found: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def dead_lettered() -> bool:
            if (message := await dead.get(fail=False)) is not None:
                found.append(message)
                await message.ack()
            return bool(found)

        await until("the failed event in imgw.push.dead", dead_lettered, task)
        assert [m.message_id for m in found] == [failed]
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
