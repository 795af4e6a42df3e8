"""What a killed node owed the notify webhook is posted by a survivor: its hook rows are
adopted with its lease (gateway/outbox.py), so no acked message goes unnotified."""

from __future__ import annotations

from protocol.frames import ConvOk, OpenP2P, Send, SendAck
from tests.cluster.conftest import Cluster
from tests.support.webhook import Receiver
from tests.support.wire import Wire


async def test_a_survivor_posts_what_a_killed_node_owed(cluster: Cluster) -> None:
    receiver = await Receiver().start()
    receiver.status = 503
    try:
        for _ in range(2):
            await cluster.start_node("--notify-url", receiver.url, "--node-lease", "2")
        doomed = cluster.nodes[0]
        w = await Wire.login(doomed.port, 1)
        opened = await w.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        acked = set()
        for i in range(30):
            ack = await w.request(Send(0, opened.conv_id, f"t{i}", 1, f"m{i}".encode()))
            assert isinstance(ack, SendAck)
            acked.add(ack.msg_id)
        doomed.kill()
        receiver.status = 200
        got = await receiver.wait_for(len(acked), timeout=30)
        assert acked <= {int(m["msg_id"]) for m in got}
        survivor = cluster.nodes[1]
        assert survivor.proc is not None and survivor.proc.poll() is None
    finally:
        await receiver.close()
