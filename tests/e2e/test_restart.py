"""Gateway processes killed and restarted: no acked message is lost."""

from __future__ import annotations

import signal
from pathlib import Path

from protocol.frames import ConvOk, Error, Kick, OpenP2P, Pull, PullResult, Send, SendAck
from protocol.ops import KickReason
from tests.support.proc import GatewayProcess
from tests.support.wire import Wire


async def pull_all(w: Wire, conv: int) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    after = 0
    while True:
        page = await w.request(Pull(0, conv, after, 200))
        assert isinstance(page, PullResult)
        out += [(m.seq, m.msg_id, m.content) for m in page.msgs]
        if not page.has_more:
            return out
        after = page.msgs[-1].seq


async def test_kill_9_loses_no_acked_message(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "data").start()
    try:
        w = await Wire.login(gw.port, 1)
        opened = await w.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        conv = opened.conv_id
        acked: dict[bytes, SendAck] = {}
        total = 400
        for i in range(total):
            await w.send(Send(100 + i, conv, f"k{i}", 1, f"msg-{i}".encode()))
            if i == 100:
                acked[b"msg-100"] = await w.wait_for(SendAck, rid=200)  # commits are landing
            if i == 300:
                gw.signal(signal.SIGKILL)  # mid-stream, with sends in flight
                break
        for f in [*w.frames, *await w.closed(timeout=10)]:
            if isinstance(f, SendAck):
                acked[f"msg-{f.rid - 100}".encode()] = f
        gw.wait()
        gw.start()
        w2 = await Wire.login(gw.port, 1)
        stored = await pull_all(w2, conv)
        seqs = [s for s, _, _ in stored]
        assert seqs == sorted(set(seqs)), "seqs strictly increasing, never reused"
        by_content = {c: (s, mid) for s, mid, c in stored}
        assert len(by_content) == len(stored), "no message stored twice"
        for content, ack in acked.items():
            assert by_content.get(content) == (ack.seq, ack.msg_id), content
        # After the restart, new sends continue above every seq issued before.
        ack = await w2.request(Send(0, conv, "after-restart", 1, b"new"))
        assert isinstance(ack, SendAck) and ack.seq > max(seqs)
    finally:
        gw.kill()


async def test_sigterm_finishes_inflight_sends_and_exits_0(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "data").start()
    try:
        w = await Wire.login(gw.port, 1)
        opened = await w.request(OpenP2P(0, 2))
        assert isinstance(opened, ConvOk)
        conv = opened.conv_id
        for i in range(150):
            await w.send(Send(100 + i, conv, f"t{i}", 1, f"m{i}".encode()))
        gw.signal(signal.SIGTERM)
        frames = await w.closed(timeout=15)
        assert gw.wait() == 0
        acks = [f for f in frames if isinstance(f, SendAck)]
        errors = [f for f in frames if isinstance(f, Error)]
        assert frames[-1] == Kick(KickReason.DRAINING, "server draining", "")
        assert errors == []
        assert len(acks) == 150, "every send the gateway read before stopping is answered"
        gw.start()
        w2 = await Wire.login(gw.port, 1)
        stored = {(s, mid) for s, mid, _ in await pull_all(w2, conv)}
        assert {(a.seq, a.msg_id) for a in acks} <= stored
    finally:
        gw.kill()
