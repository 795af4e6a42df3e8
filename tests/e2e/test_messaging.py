"""SEND, PUSH, PULL, HISTORY, RECALL: durability, idempotency, order, limits."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import msgpack
import pytest

from gateway.server import Server
from protocol.codec import encode
from protocol.frames import (
    ConvOk,
    Error,
    History,
    HistoryResult,
    OpenP2P,
    Pull,
    PullResult,
    Push,
    Recall,
    RecallOk,
    Send,
    SendAck,
)
from protocol.ops import ErrorCode, MsgType
from tests.conftest import StartGateway
from tests.support.wire import Wire

pytestmark = pytest.mark.websocket


async def p2p(w: Wire, peer: int) -> int:
    ok = await w.request(OpenP2P(0, peer))
    assert isinstance(ok, ConvOk)
    return ok.conv_id


async def send(w: Wire, conv: int, cmid: str, body: bytes = b"hi", msg_type: int = 1) -> SendAck:
    ack = await w.request(Send(0, conv, cmid, msg_type, body))
    assert isinstance(ack, SendAck), ack
    return ack


async def test_send_is_acked_and_pushed_to_every_other_device(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1, "phone")
    alice2 = await Wire.login(gw.port, 1, "laptop")
    bob = await Wire.login(gw.port, 2, "phone")
    conv = await p2p(alice, 2)
    ack = await send(alice, conv, "m-1", b"hello")
    assert (ack.conv_id, ack.seq) == (conv, 1) and ack.msg_id > 0 and ack.server_ms > 0
    expected = Push(conv, 1, ack.msg_id, 1, 1, b"hello", ack.server_ms, "m-1")
    assert await bob.wait_for(Push) == expected
    assert await alice2.wait_for(Push) == expected  # the sender's other device
    assert [f for f in await alice.quiet(0.3) if isinstance(f, Push)] == []  # not the sender


async def test_pipelined_sends_get_increasing_seqs_in_send_order(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    for i in range(50):
        await alice.send(Send(1000 + i, conv, f"p-{i}", 1, str(i).encode()))
    acks = [await alice.wait_for(SendAck, rid=1000 + i) for i in range(50)]
    assert [a.seq for a in acks] == list(range(1, 51))
    pulled = await alice.request(Pull(0, conv, 0, 0))
    assert isinstance(pulled, PullResult)
    assert [m.content for m in pulled.msgs] == [str(i).encode() for i in range(50)]


async def test_resend_returns_original_ack_and_stores_once(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    first = await send(alice, conv, "same", b"x")
    again = await send(alice, conv, "same", b"x")
    assert (again.seq, again.msg_id, again.server_ms) == (first.seq, first.msg_id, first.server_ms)
    # from another device of the same user too
    other = await Wire.login(gw.port, 1, "tablet")
    third = await send(other, conv, "same", b"x")
    assert third.msg_id == first.msg_id
    pulled = await alice.request(Pull(0, conv, 0, 0))
    assert isinstance(pulled, PullResult) and len(pulled.msgs) == 1


async def test_concurrent_duplicates_store_one_row(gw: Server) -> None:
    a1 = await Wire.login(gw.port, 1, "a")
    a2 = await Wire.login(gw.port, 1, "b")
    conv = await p2p(a1, 2)
    # Pipelined on both connections before any ack can come back.
    sent = [(w, 500 + i) for i, w in enumerate((a1, a2, a1, a2))]
    for w, rid in sent:
        await w.send(Send(rid, conv, "race", 1, b"r"))
    acks = [await w.wait_for(SendAck, rid=rid) for w, rid in sent]
    assert len({(a.seq, a.msg_id, a.server_ms) for a in acks}) == 1
    pulled = await a1.request(Pull(0, conv, 0, 0))
    assert isinstance(pulled, PullResult) and len(pulled.msgs) == 1


async def test_changed_resend_is_idempotency_conflict(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    other = await p2p(alice, 3)
    await send(alice, conv, "id-1", b"x")
    assert await alice.error(Send(0, conv, "id-1", 1, b"y")) == ErrorCode.IDEMPOTENCY_CONFLICT
    assert await alice.error(Send(0, conv, "id-1", 2, b"x")) == ErrorCode.IDEMPOTENCY_CONFLICT
    assert await alice.error(Send(0, other, "id-1", 1, b"x")) == ErrorCode.IDEMPOTENCY_CONFLICT


async def test_resend_after_leaving_still_gets_original_ack(gw: Server) -> None:
    from protocol.frames import GroupCreate, GroupMembers, Ok

    alice = await Wire.login(gw.port, 1)
    created = await alice.request(GroupCreate(0, "g", (2,)))
    assert isinstance(created, ConvOk)
    first = await send(alice, created.conv_id, "before-leave")
    assert isinstance(await alice.request(GroupMembers(0, created.conv_id, (), (1,))), Ok)
    again = await send(alice, created.conv_id, "before-leave")
    assert again.msg_id == first.msg_id
    code = await alice.error(Send(0, created.conv_id, "after-leave", 1, b"x"))
    assert code == ErrorCode.NOT_MEMBER


async def test_reserved_and_unknown_msg_types_are_refused(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    for t in (0, MsgType.RECALL, MsgType.SYSTEM, 7, 99, 128):
        assert await alice.error(Send(0, conv, f"t{t}", t, b"x")) == ErrorCode.BAD_MSG_TYPE
    for t in (1, 2, 3, 4, 100, 127):
        await send(alice, conv, f"ok{t}", msg_type=t)


async def test_content_limit(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    await send(alice, conv, "max", b"x" * 2048)
    code = await alice.error(Send(0, conv, "big", 1, b"x" * 2049))
    assert code == ErrorCode.CONTENT_TOO_LARGE


async def test_non_member_and_unknown_conversation(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1)
    eve = await Wire.login(gw.port, 9)
    conv = await p2p(alice, 2)
    await send(alice, conv, "secret", b"s")
    assert await eve.error(Send(0, conv, "x", 1, b"x")) == ErrorCode.NOT_MEMBER
    assert await eve.error(Pull(0, conv, 0, 0)) == ErrorCode.NOT_MEMBER
    assert await eve.error(History(0, conv, 0, 0)) == ErrorCode.NOT_MEMBER
    assert await eve.error(Send(0, 99999, "x", 1, b"x")) == ErrorCode.NO_SUCH_CONVERSATION
    assert await eve.error(Pull(0, 99999, 0, 0)) == ErrorCode.NO_SUCH_CONVERSATION


async def test_rate_limit_refuses_and_stores_nothing(start_gateway: StartGateway) -> None:
    gw = await start_gateway(rate_burst=5, rate_per_s=0.001)
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    for i in range(5):
        await send(alice, conv, f"r{i}")
    assert await alice.error(Send(0, conv, "r5", 1, b"x")) == ErrorCode.RATE_LIMITED
    await send(alice, conv, "r0")  # a resend of an acked message still gets its ack
    pulled = await alice.request(Pull(0, conv, 0, 0))
    assert isinstance(pulled, PullResult) and len(pulled.msgs) == 5


async def test_pull_and_history_paging(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    for i in range(1, 8):
        await send(alice, conv, f"h{i}", str(i).encode())
    page = await alice.request(Pull(0, conv, 0, 3))
    assert isinstance(page, PullResult) and page.has_more is True
    assert [m.seq for m in page.msgs] == [1, 2, 3]
    page = await alice.request(Pull(0, conv, 6, 3))
    assert isinstance(page, PullResult) and page.has_more is False
    assert [m.seq for m in page.msgs] == [7]
    hist = await alice.request(History(0, conv, 0, 3))
    assert isinstance(hist, HistoryResult) and hist.has_more is True
    assert [m.seq for m in hist.msgs] == [5, 6, 7]
    hist = await alice.request(History(0, conv, 3, 5))
    assert isinstance(hist, HistoryResult) and hist.has_more is False
    assert [m.seq for m in hist.msgs] == [1, 2]
    capped = await alice.request(Pull(0, conv, 0, 100_000))
    assert isinstance(capped, PullResult) and len(capped.msgs) == 7


async def test_recall(start_gateway: StartGateway) -> None:
    gw = await start_gateway(recall_window=1.0)
    alice = await Wire.login(gw.port, 1)
    bob = await Wire.login(gw.port, 2)
    conv = await p2p(alice, 2)
    ack = await send(alice, conv, "oops", b"typo")
    assert await bob.error(Recall(0, conv, ack.seq)) == ErrorCode.RECALL_DENIED
    assert await alice.error(Recall(0, conv, 999)) == ErrorCode.NO_SUCH_MESSAGE
    ok = await alice.request(Recall(0, conv, ack.seq))
    assert isinstance(ok, RecallOk) and ok.recall_seq == ack.seq + 1
    push = await bob.wait_for(Push, seq=ok.recall_seq)
    assert (push.msg_type, push.sender_uid, msgpack.unpackb(push.content)) == (5, 1, [ack.seq])
    pulled = await bob.request(Pull(0, conv, 0, 0))
    assert isinstance(pulled, PullResult)
    original, recall = pulled.msgs
    assert (original.seq, original.msg_type, original.content) == (ack.seq, 5, b"")
    assert recall.seq == ok.recall_seq
    again = await alice.request(Recall(0, conv, ack.seq))
    assert again == RecallOk(again.rid, conv, ok.recall_seq)  # type: ignore[union-attr]
    assert await alice.error(Recall(0, conv, ok.recall_seq)) == ErrorCode.RECALL_DENIED
    late = await send(alice, conv, "late")
    await asyncio.sleep(1.2)
    assert await alice.error(Recall(0, conv, late.seq)) == ErrorCode.RECALL_DENIED
    again = await alice.request(Recall(0, conv, ack.seq))  # still answered after the window
    assert isinstance(again, RecallOk) and again.recall_seq == ok.recall_seq


@pytest.mark.backends("embedded")
async def test_store_unavailable_answers_unavailable_then_recovers(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    db = tmp_path / "fault.db"
    gw = await start_gateway(store=f"sqlite:///{db}?busy_timeout_ms=200")
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    await send(alice, conv, "before", b"1")
    # Another process takes the database's write lock and holds it: commits fail.
    blocker = sqlite3.connect(db, isolation_level=None, timeout=5)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        reply = await alice.request(Send(0, conv, "during", 1, b"2"), timeout=10)
        assert isinstance(reply, Error) and reply.code == ErrorCode.UNAVAILABLE
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    ack = await send(alice, conv, "during", b"2")  # the retry with the same id succeeds
    pulled = await alice.request(Pull(0, conv, 0, 0))
    assert isinstance(pulled, PullResult)
    assert [(m.seq, m.content) for m in pulled.msgs] == [(1, b"1"), (ack.seq, b"2")]


async def test_ids_at_the_top_of_u64(gw: Server) -> None:
    top = (1 << 64) - 1
    alice = await Wire.login(gw.port, top, "d")
    bob = await Wire.login(gw.port, top - 1, "d")
    conv = await p2p(alice, top - 1)
    ack = await send(alice, conv, "big-ids", b"x")
    push = await bob.wait_for(Push)
    assert push.sender_uid == top and push.seq == ack.seq
    pulled = await bob.request(Pull(0, conv, 0, 0))
    assert isinstance(pulled, PullResult) and pulled.msgs[0].sender_uid == top
    assert await bob.error(Pull(0, top, 0, 0)) == ErrorCode.NO_SUCH_CONVERSATION
    page = await bob.request(Pull(0, conv, top, 0))
    assert isinstance(page, PullResult) and page.msgs == ()
    page2 = await bob.request(History(0, conv, top, 0))
    assert isinstance(page2, HistoryResult) and len(page2.msgs) == 1
    assert await alice.error(Recall(0, conv, top)) == ErrorCode.NO_SUCH_MESSAGE


async def test_overload_is_refused_not_queued(start_gateway: StartGateway) -> None:
    gw = await start_gateway(max_pending_sends=2, batch_delay_ms=50)
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    for i in range(20):
        await alice.send(Send(900 + i, conv, f"o{i}", 1, b"x"))
    replies = [await alice.wait_for(SendAck | Error, rid=900 + i) for i in range(20)]  # type: ignore[arg-type]
    acked = {r.rid - 900 for r in replies if isinstance(r, SendAck)}
    refused = {r.rid - 900 for r in replies if isinstance(r, Error)}
    assert acked and refused
    assert {r.code for r in replies if isinstance(r, Error)} == {ErrorCode.UNAVAILABLE}
    pulled = await alice.request(Pull(0, conv, 0, 0))
    assert isinstance(pulled, PullResult)
    assert {m.client_msg_id for m in pulled.msgs} == {f"o{i}" for i in acked}


async def test_overload_stops_reading_from_senders_and_resumes(
    start_gateway: StartGateway,
) -> None:
    """Past send_backpressure queued SENDs the gateway stops reading from a connection
    that sends; once the queue is down to half it reads again. Nothing is refused or
    lost on the way, and order is kept."""
    gw = await start_gateway(
        send_backpressure=8, batch_delay_ms=20, batch_wait_ms=20, rate_burst=1000
    )
    node = gw.node
    assert node is not None
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    n = 240
    for chunk in range(0, n, 40):
        await alice.write(
            b"".join(
                encode(Send(2000 + i, conv, f"b{i}", 1, b"x")) for i in range(chunk, chunk + 40)
            )
        )
        await asyncio.sleep(0.005)
    replies = [await alice.wait_for(SendAck | Error, rid=2000 + i) for i in range(n)]  # type: ignore[arg-type]
    assert all(isinstance(r, SendAck) for r in replies), [
        r for r in replies if isinstance(r, Error)
    ]
    seqs = [r.seq for r in replies if isinstance(r, SendAck)]
    assert seqs == sorted(seqs) and len(set(seqs)) == n
    assert node.metrics.send_holds._value.get() >= 1  # it did stop reading
    assert not node.held  # and every held connection reads again
    assert isinstance(await alice.request(Pull(0, conv, seqs[-1] - 1, 5)), PullResult)


async def test_resend_of_a_recalled_message_still_gets_its_ack(gw: Server) -> None:
    alice = await Wire.login(gw.port, 1)
    conv = await p2p(alice, 2)
    first = await send(alice, conv, "to-recall", b"oops")
    assert isinstance(await alice.request(Recall(0, conv, first.seq)), RecallOk)
    again = await send(alice, conv, "to-recall", b"oops")
    assert (again.seq, again.msg_id, again.server_ms) == (first.seq, first.msg_id, first.server_ms)
    code = await alice.error(Send(0, conv + 1000, "to-recall", 1, b"oops"))
    assert code == ErrorCode.IDEMPOTENCY_CONFLICT


async def test_stale_route_naming_a_live_connection_gets_no_push(gw: Server) -> None:
    """A route left behind by an earlier process (same node id, a reused connection id)
    must not make another user's connection receive the push."""
    from storage.models import Route

    alice = await Wire.login(gw.port, 1)
    bystander = await Wire.login(gw.port, 7)
    node = gw.node
    assert node is not None
    victim_conn = node.by_device[(7, "d1")]
    # Bob (uid 2) is offline, but a stale route claims he is on the bystander's connection.
    await node.routes.register(Route(2, "old", node.node_id, victim_conn.conn_id, 1))
    conv = await p2p(alice, 2)
    await send(alice, conv, "for-bob", b"private")
    assert [f for f in await bystander.quiet(0.3) if isinstance(f, Push)] == []
