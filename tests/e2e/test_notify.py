"""The notify webhook (--notify-url, gateway/hooks/notify.py), on every backend: every committed
message reaches it after the commit, in batches, at least once (failed posts are retried
in order), with the bearer token; a receiver that is down never holds up a send, and
the queue is bounded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.hooks.notify import NotifyStage
from gateway.server import Server
from protocol.frames import ConvOk, GroupCreate, OpenP2P, Send, SendAck
from protocol.mediakeys import media_content
from protocol.ops import MsgType
from tests.conftest import StartGateway
from tests.support.webhook import Receiver
from tests.support.wire import Wire


@pytest.fixture
async def receiver() -> Any:
    r = await Receiver().start()
    yield r
    await r.close()


async def _p2p(gw: Server, uid: int, peer: int) -> tuple[Wire, int]:
    w = await Wire.login(gw.port, uid, "d")
    opened = await w.request(OpenP2P(0, peer))
    assert isinstance(opened, ConvOk)
    return w, opened.conv_id


async def test_committed_messages_reach_the_webhook(
    start_gateway: StartGateway, receiver: Receiver
) -> None:
    gw = await start_gateway(notify_url=receiver.url, notify_token="hook-secret")
    w, conv = await _p2p(gw, 1, 2)

    acks = [await w.request(Send(0, conv, f"m{i}", 1, f"hello {i}".encode())) for i in range(3)]
    assert all(isinstance(a, SendAck) for a in acks)
    key = "media/1/" + "cd" * 32
    image = media_content(key, size=99, type="image/jpeg")
    assert isinstance(await w.request(Send(0, conv, "img", int(MsgType.IMAGE), image)), SendAck)
    group = await w.request(GroupCreate(0, "team", (2, 3)))
    assert isinstance(group, ConvOk)
    got = await receiver.wait_for(5)
    texts = [(m["conv_id"], m["seq"], m.get("text")) for m in got if m["conv_id"] == conv]
    assert texts == [
        (conv, 1, "hello 0"),
        (conv, 2, "hello 1"),
        (conv, 3, "hello 2"),
        (conv, 4, None),
    ]
    [sent_image] = [m for m in got if m["client_msg_id"] == "img"]
    assert sent_image["media"] == {"key": key, "size": 99, "content_type": "image/jpeg"}
    [created] = [m for m in got if m["conv_id"] == group.conv_id]
    assert created["sender_uid"] == 0 and created["event"]["event"] == "created"
    assert created["event"]["uids"] == [1, 2, 3]
    first = got[0]
    assert first["sender_uid"] == 1 and first["client_msg_id"] == "m0"
    assert set(receiver.auth) == {"Bearer hook-secret"}
    assert {p["node"] for p in receiver.posts} == {gw.node.node_id if gw.node else ""}


async def test_failed_posts_are_retried_in_order(start_gateway: StartGateway) -> None:
    receiver = await Receiver([500, 503]).start()
    try:
        gw = await start_gateway(notify_url=receiver.url)
        w, conv = await _p2p(gw, 1, 2)

        for i in range(5):
            assert isinstance(await w.request(Send(0, conv, f"m{i}", 1, b"x")), SendAck)
        got = await receiver.wait_for(5)
        assert [m["seq"] for m in got] == [1, 2, 3, 4, 5]  # in order, each once here
        assert gw.node is not None and gw.node.hooks is not None
        stage = gw.node.hooks.stages[0]
        assert isinstance(stage, NotifyStage) and stage.post.failures == 2
    finally:
        await receiver.close()


async def test_a_dead_receiver_never_holds_up_a_send(start_gateway: StartGateway) -> None:
    receiver = Receiver()  # not started: connections are refused
    gw = await start_gateway(notify_url=receiver.url, notify_queue_max=3)
    w, conv = await _p2p(gw, 1, 2)

    async with asyncio.timeout(5):
        for i in range(6):
            assert isinstance(await w.request(Send(0, conv, f"m{i}", 1, b"x")), SendAck)
    notifier = gw.node.hooks if gw.node else None
    assert notifier is not None and (notifier.deferred, notifier.dropped) == (3, 0)
    await receiver.start()  # back: the queued three, then the three the store kept
    try:
        got = await receiver.wait_for(6, timeout=40)
        assert [m["seq"] for m in got] == [1, 2, 3, 4, 5, 6]
    finally:
        await receiver.close()
