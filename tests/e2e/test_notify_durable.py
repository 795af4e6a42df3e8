"""The notify webhook owes what was committed, durably: a node killed (kill -9) while
its webhook was down posts every acked message after it restarts, at least once, and a
full queue defers to the store instead of dropping."""

from __future__ import annotations

import signal
from pathlib import Path

from protocol.frames import ConvOk, OpenP2P, Send, SendAck
from tests.conftest import StartGateway
from tests.support.proc import GatewayProcess
from tests.support.webhook import Receiver
from tests.support.wire import Wire


async def test_a_killed_node_posts_what_it_owed_after_its_restart(tmp_path: Path) -> None:
    receiver = await Receiver().start()
    receiver.status = 503  # the webhook is down: nothing is acknowledged
    gw = GatewayProcess(tmp_path / "data", None, "--notify-url", receiver.url).start()
    try:
        w = await Wire.login(gw.port, 1)
        opened = await w.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        acked: set[int] = set()
        for i in range(50):
            ack = await w.request(Send(0, opened.conv_id, f"k{i}", 1, f"m{i}".encode()))
            assert isinstance(ack, SendAck)
            acked.add(ack.msg_id)
        gw.signal(signal.SIGKILL)
        gw.wait()
        assert not receiver.posts
        receiver.status = 200
        gw.start()
        got = await receiver.wait_for(len(acked), timeout=20)
        posted = [int(m["msg_id"]) for m in got]
        assert acked <= set(posted), f"{len(acked - set(posted))} acked messages never posted"
    finally:
        gw.kill()
        await receiver.close()


async def test_a_full_queue_defers_to_the_store(start_gateway: StartGateway) -> None:
    receiver = await Receiver().start()
    receiver.status = 503
    try:
        gw = await start_gateway(notify_url=receiver.url, notify_queue_max=5)
        assert gw.node is not None and gw.node.hooks is not None
        w = await Wire.login(gw.port, 1)
        opened = await w.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        acked = set()
        for i in range(40):
            ack = await w.request(Send(0, opened.conv_id, f"q{i}", 1, b"x"))
            assert isinstance(ack, SendAck)
            acked.add(ack.msg_id)
        notifier = gw.node.hooks
        assert notifier.deferred >= 30 and notifier.dropped == 0
        receiver.status = 200
        got = await receiver.wait_for(len(acked), timeout=20)
        assert acked <= {int(m["msg_id"]) for m in got}
        seqs = [m["seq"] for m in got]
        assert seqs == sorted(seqs), "in commit order"
    finally:
        await receiver.close()
