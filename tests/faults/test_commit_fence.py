"""An ERROR never hides a stored message, even when MySQL's COMMIT is held up in the
network: a link that delays the packet carrying COMMIT past the store's timeout (3 s in
the tests) and delivers it later. The gateway fences the server thread (KILL, from another
connection) before it answers; when it cannot learn the outcome it says so
(outcome_unknown, or unavailable to clients that did not ask for the new code)."""

from __future__ import annotations

import asyncio
import time

from protocol.frames import ConvOk, Error, GroupCreate, Login, LoginOk, Send, SendAck
from protocol.ops import CAP_OUTCOME_UNKNOWN, ErrorCode
from tests.faults.conftest import Prod
from tests.faults.test_production_faults import pull_all
from tests.support.wire import Wire, token

# A send batch's COMMIT rides at the end of its writes ("...;COMMIT"), other
# transactions' alone (COM_QUERY "COMMIT"): hold any packet that carries one.
COMMIT_PACKET = b"COMMIT"
HOLD_S = 6.0  # past the store's 3 s timeout plus its rollback attempt and the fence


async def _send_all(w: Wire, conv: int, cmids: list[str]) -> dict[str, object]:
    """Pipelined SENDs (one group commit); each one's reply."""
    rids = {}
    for cmid in cmids:
        rid = w.rid()
        rids[rid] = cmid
        await w.send(Send(rid, conv, cmid, 1, cmid.encode()))
    replies: dict[str, object] = {}
    while len(replies) < len(cmids):
        f = await w.recv(timeout=20)
        if (rid := getattr(f, "rid", None)) in rids:
            replies[rids[rid]] = f
    return replies


async def test_error_answered_sends_stay_unstored_when_the_commit_arrives_late(
    prod: Prod,
) -> None:
    w = await Wire.login(prod.port, 1, "d")  # a v1 client: no caps
    g = await w.request(GroupCreate(0, "g", (2,)))
    assert isinstance(g, ConvOk)
    erred: set[str] = set()
    acked: dict[str, SendAck] = {}
    for run in range(3):
        started = time.monotonic()
        prod.mysql.hold(COMMIT_PACKET, HOLD_S)
        replies = await _send_all(w, g.conv_id, [f"r{run}-{i}" for i in range(4)])
        prod.mysql.stop_holding()
        for cmid, reply in replies.items():
            if isinstance(reply, SendAck):
                acked[cmid] = reply
            else:
                assert isinstance(reply, Error) and reply.code == ErrorCode.UNAVAILABLE, reply
                erred.add(cmid)
        # let the held COMMIT reach MariaDB (it would commit on a live thread)
        await asyncio.sleep(max(0.0, started + HOLD_S + 1.0 - time.monotonic()))
    assert prod.mysql.held >= 3, "the COMMITs were held"
    assert erred, "the held COMMITs made the sends fail"
    stored = {cmid: seq for seq, _, cmid in await pull_all(w, g.conv_id) if cmid}
    assert not erred & set(stored), f"ERROR-answered but stored: {sorted(erred & set(stored))}"
    for cmid, ack in acked.items():
        assert stored[cmid] == ack.seq
    # and the sender's retry with the same ids stores each exactly once
    for cmid in sorted(erred):
        assert isinstance(await w.request(Send(0, g.conv_id, cmid, 1, cmid.encode())), SendAck)
    rows = [cmid for _, _, cmid in await pull_all(w, g.conv_id) if cmid]
    assert sorted(rows) == sorted(set(rows)) and erred <= set(rows)


async def _login_with_caps(port: int, uid: int) -> Wire:
    w = await Wire.open(port)
    ok = await w.request(Login(0, 1, uid, "d", token(uid, "d"), (CAP_OUTCOME_UNKNOWN,)))
    assert isinstance(ok, LoginOk), ok
    return w


async def test_outcome_unknown_when_mysql_cannot_be_asked(prod: Prod) -> None:
    new = await _login_with_caps(prod.port, 1)
    old = await Wire.login(prod.port, 2, "d")
    g = await new.request(GroupCreate(0, "g", (2,)))
    assert isinstance(g, ConvOk)
    prod.mysql.hold(COMMIT_PACKET, HOLD_S)
    sending = asyncio.gather(
        _send_all(new, g.conv_id, ["new-1"]), _send_all(old, g.conv_id, ["old-1"])
    )
    await asyncio.sleep(1.0)
    prod.mysql.blackhole()  # the COMMIT is on its way, and MySQL can no longer be asked
    new_replies, old_replies = await sending
    prod.mysql.stop_holding()
    prod.mysql.restore()
    reply = new_replies["new-1"]
    assert isinstance(reply, Error) and reply.code == ErrorCode.OUTCOME_UNKNOWN, reply
    reply = old_replies["old-1"]
    assert isinstance(reply, Error) and reply.code == ErrorCode.UNAVAILABLE, reply
    # Sending again with the same id learns the outcome (here: not stored, so now it is).
    deadline = time.monotonic() + 10
    for w, cmid in ((new, "new-1"), (old, "old-1")):
        while not isinstance(
            ack := await w.request(Send(0, g.conv_id, cmid, 1, cmid.encode()), timeout=10),
            SendAck,
        ):
            assert time.monotonic() < deadline, ack
            await asyncio.sleep(0.2)
    rows = [cmid for _, _, cmid in await pull_all(new, g.conv_id) if cmid]
    assert sorted(rows) == ["new-1", "old-1"]
