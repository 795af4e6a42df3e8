"""OPEN_P2P, groups, READ / DELIVERED / TYPING, PRESENCE and SYNC."""

from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest

from gateway.server import Server
from protocol.codec import encode
from protocol.frames import (
    ConvOk,
    ConvRecord,
    Delivered,
    Error,
    GroupCreate,
    GroupInfo,
    GroupInfoResult,
    GroupMembers,
    History,
    HistoryResult,
    Ok,
    OpenP2P,
    Presence,
    PresenceResult,
    Pull,
    PullResult,
    Push,
    Read,
    ReadNotify,
    Send,
    SendAck,
    Sync,
    SyncResult,
    Typing,
    TypingNotify,
)
from protocol.ops import ConvKind, ErrorCode, MsgType
from tests.support.wire import Wire

pytestmark = pytest.mark.websocket


async def conv_of(reply: object) -> int:
    assert isinstance(reply, ConvOk), reply
    return reply.conv_id


async def send(w: Wire, conv: int, cmid: str, body: bytes = b"hi") -> SendAck:
    ack = await w.request(Send(0, conv, cmid, 1, body))
    assert isinstance(ack, SendAck), ack
    return ack


def event(push: Push) -> dict[str, object]:
    assert (push.msg_type, push.sender_uid, push.client_msg_id) == (MsgType.SYSTEM, 0, "")
    decoded: dict[str, object] = msgpack.unpackb(push.content)
    return decoded


async def test_open_p2p_is_idempotent_and_symmetric(gw: Server) -> None:
    a = await Wire.login(gw.port, 1)
    b = await Wire.login(gw.port, 2)
    c1 = await conv_of(await a.request(OpenP2P(0, 2)))
    c2 = await conv_of(await a.request(OpenP2P(0, 2)))
    c3 = await conv_of(await b.request(OpenP2P(0, 1)))
    assert c1 == c2 == c3
    assert await a.error(OpenP2P(0, 1)) == ErrorCode.BAD_REQUEST
    assert await a.error(GroupInfo(0, c1)) == ErrorCode.BAD_REQUEST
    assert await a.error(GroupMembers(0, c1, (3,), ())) == ErrorCode.BAD_REQUEST


async def test_group_lifecycle(gw: Server) -> None:
    owner = await Wire.login(gw.port, 1)
    bob = await Wire.login(gw.port, 2)
    carol = await Wire.login(gw.port, 3)
    dave = await Wire.login(gw.port, 4)
    g = await conv_of(await owner.request(GroupCreate(0, "team", (2, 3, 2))))
    created = await bob.wait_for(Push, conv_id=g)
    assert event(created) == {"event": "created", "by": 1, "uids": [1, 2, 3], "title": "team"}
    info = await bob.request(GroupInfo(0, g))
    assert info == GroupInfoResult(info.rid, g, "team", 1, (1, 2, 3))  # type: ignore[union-attr]

    assert await bob.error(GroupMembers(0, g, (4,), ())) == ErrorCode.FORBIDDEN
    assert await bob.error(GroupMembers(0, g, (), (3,))) == ErrorCode.FORBIDDEN
    assert await dave.error(GroupMembers(0, g, (), (4,))) == ErrorCode.NOT_MEMBER
    assert await dave.error(GroupInfo(0, g)) == ErrorCode.NOT_MEMBER
    assert await owner.error(GroupMembers(0, g, (4,), (4,))) == ErrorCode.BAD_REQUEST
    assert await owner.error(GroupInfo(0, 424242)) == ErrorCode.NO_SUCH_CONVERSATION

    before = await send(owner, g, "pre-join", b"old news")
    assert isinstance(await owner.request(GroupMembers(0, g, (4,), (3,))), Ok)
    added = await dave.wait_for(Push, conv_id=g)
    assert event(added) == {"event": "added", "by": 1, "uids": [4]}
    removed = await carol.wait_for(Push, conv_id=g, msg_type=MsgType.SYSTEM, seq=added.seq + 1)
    assert event(removed) == {"event": "removed", "by": 1, "uids": [3]}
    # The joiner sees history only from its "added" message.
    pulled = await dave.request(Pull(0, g, 0, 0))
    assert isinstance(pulled, PullResult)
    assert [m.seq for m in pulled.msgs] == [added.seq, removed.seq]
    hist = await dave.request(History(0, g, 0, 0))
    assert isinstance(hist, HistoryResult) and before.seq not in [m.seq for m in hist.msgs]
    # The removed member can still fetch up to its removal, but not send.
    pulled = await carol.request(Pull(0, g, 0, 0))
    assert isinstance(pulled, PullResult) and pulled.msgs[-1].seq == removed.seq
    assert await carol.error(Send(0, g, "x", 1, b"x")) == ErrorCode.NOT_MEMBER

    # The owner leaves: the earliest remaining member becomes owner.
    assert isinstance(await owner.request(GroupMembers(0, g, (), (1,))), Ok)
    left = await bob.wait_for(Push, conv_id=g, seq=removed.seq + 1)
    assert event(left) == {"event": "left", "by": 1, "uids": [1]}
    info = await bob.request(GroupInfo(0, g))
    assert isinstance(info, GroupInfoResult) and (info.owner_uid, info.uids) == (2, (2, 4))
    assert isinstance(await bob.request(GroupMembers(0, g, (5,), ())), Ok)


async def test_group_size_limit(gw: Server) -> None:
    owner = await Wire.login(gw.port, 1)
    too_many = tuple(range(2, 1002))  # 1,000 others + the owner
    assert await owner.error(GroupCreate(0, "big", too_many)) == ErrorCode.BAD_REQUEST
    g = await conv_of(await owner.request(GroupCreate(0, "big", too_many[:-1])))
    assert await owner.error(GroupMembers(0, g, (5000,), ())) == ErrorCode.BAD_REQUEST


async def test_read_notify_and_clamping(gw: Server) -> None:
    a = await Wire.login(gw.port, 1)
    a2 = await Wire.login(gw.port, 1, "d2")
    b = await Wire.login(gw.port, 2)
    conv = await conv_of(await a.request(OpenP2P(0, 2)))
    for i in range(3):
        await send(a, conv, f"m{i}")
    await b.send(Read(conv, 2))
    assert await a.wait_for(ReadNotify) == ReadNotify(conv, 2, 2)
    assert await a2.wait_for(ReadNotify) == ReadNotify(conv, 2, 2)
    await b.send(Read(conv, 1))  # lower: ignored
    await b.send(Read(conv, 99))  # above max_seq: clamped
    assert await a.wait_for(ReadNotify) == ReadNotify(conv, 2, 3)
    assert [f for f in await a.quiet(0.2) if isinstance(f, ReadNotify)] == []
    await b.send(Read(424242, 1))
    err = await b.wait_for(Error)
    assert (err.rid, err.code) == (0, ErrorCode.NO_SUCH_CONVERSATION)


async def test_typing_goes_to_others_only(gw: Server) -> None:
    a = await Wire.login(gw.port, 1)
    a2 = await Wire.login(gw.port, 1, "d2")
    b = await Wire.login(gw.port, 2)
    conv = await conv_of(await a.request(OpenP2P(0, 2)))
    await a.send(Typing(conv))
    assert await b.wait_for(TypingNotify) == TypingNotify(conv, 1)
    assert [f for f in await a2.quiet(0.2) if isinstance(f, TypingNotify)] == []
    eve = await Wire.login(gw.port, 9)
    await eve.send(Typing(conv))
    err = await eve.wait_for(Error)
    assert (err.rid, err.code) == (0, ErrorCode.NOT_MEMBER)


async def test_presence_only_for_contacts(gw: Server) -> None:
    a = await Wire.login(gw.port, 1, "phone")
    b = await Wire.login(gw.port, 2, "phone")
    await Wire.login(gw.port, 2, "web")
    await Wire.login(gw.port, 3, "phone")  # online, but no shared conversation
    p2p = await conv_of(await a.request(OpenP2P(0, 2)))
    await a.request(OpenP2P(0, 4))  # a contact who is offline
    # Opening a p2p with someone shows nothing of them until they show up in it.
    res = await a.request(Presence(0, (2, 3, 4, 1, 2)))
    assert isinstance(res, PresenceResult)
    assert res.entries == ((2, ()), (3, ()), (4, ()), (1, ("phone",)))
    ack = await send(a, p2p, "hi")
    await b.send(Read(p2p, ack.seq))  # uid 2 reads: now a contact
    for _ in range(50):  # the production store flushes read positions to MySQL each second
        res = await a.request(Presence(0, (2, 3, 4, 1, 2)))
        assert isinstance(res, PresenceResult)
        if res.entries[0] != (2, ()):
            break
        await asyncio.sleep(0.1)
    assert res.entries == ((2, ("phone", "web")), (3, ()), (4, ()), (1, ("phone",)))
    # the owner of a group is seen by its members, a member the owner added is not
    g = await conv_of(await a.request(GroupCreate(0, "g", (3,))))
    c = await Wire.login(gw.port, 3, "web")
    seen = await c.request(Presence(0, (1,)))
    assert isinstance(seen, PresenceResult) and seen.entries == ((1, ("phone",)),)
    res = await a.request(Presence(0, (3,)))
    assert isinstance(res, PresenceResult) and res.entries == ((3, ()),)
    assert g > 0


async def test_sync_lists_changes_and_pages(gw: Server) -> None:
    a = await Wire.login(gw.port, 1, "phone")
    convs = [await conv_of(await a.request(OpenP2P(0, peer))) for peer in range(2, 7)]
    for i, conv in enumerate(convs):
        await send(a, conv, f"s{i}")
    b = await Wire.login(gw.port, 2)
    await send(b, convs[0], "reply")

    first = await a.request(Sync(0, 0, 0, 2))
    assert isinstance(first, SyncResult) and first.has_more is True
    rows: list[ConvRecord] = list(first.convs)
    res = first
    while res.has_more:
        nxt = await a.request(Sync(0, 0, res.next_cursor, 2))
        assert isinstance(nxt, SyncResult)
        assert nxt.next_since == first.next_since  # the same on every page of a pass
        rows += nxt.convs
        res = nxt
    assert res.next_cursor == 0
    assert {r.conv_id for r in rows} == set(convs)
    by_id = {r.conv_id: r for r in rows}
    assert by_id[convs[0]] == ConvRecord(
        convs[0], ConvKind.P2P, 2, 0, 0, 1, by_id[convs[0]].last_active_ms, True
    )
    actives = [r.last_active_ms for r in rows]
    assert actives == sorted(actives, reverse=True)

    # Read and delivered positions are changes too, and unread follows read.
    await a.send(Delivered(convs[0], 2))
    await a.send(Read(convs[0], 2))
    res2 = await a.request(Sync(0, first.next_since, 0, 0))
    assert isinstance(res2, SyncResult)
    row = next(r for r in res2.convs if r.conv_id == convs[0])
    assert (row.read_seq, row.delivered_seq, row.unread) == (2, 2, 0)

    assert await a.error(Sync(0, "bogus", 0, 0)) == ErrorCode.BAD_REQUEST
    assert await a.error(Sync(0, 12345, 0, 0)) == ErrorCode.BAD_REQUEST
    assert await a.error(Sync(0, first.next_since, b"junk", 0)) == ErrorCode.BAD_REQUEST
    # a forged cursor for the right since, its fields past what the stores hold
    since_ms = struct.unpack(">cQ", first.next_since)[1]
    for forged in (
        struct.pack(">cQQQQ", b"C", 2**64 - 1, since_ms, 2**63, 2**64 - 1),
        struct.pack(">cQQQQ", b"C", 1, since_ms, 1, 2**63),
    ):
        assert await a.error(Sync(0, first.next_since, forged, 0)) == ErrorCode.BAD_REQUEST


async def test_sync_shows_removal_to_removed_member(gw: Server) -> None:
    owner = await Wire.login(gw.port, 1)
    bob = await Wire.login(gw.port, 2)
    g = await conv_of(await owner.request(GroupCreate(0, "g", (2,))))
    first = await bob.request(Sync(0, 0, 0, 0))
    assert isinstance(first, SyncResult)
    assert isinstance(await owner.request(GroupMembers(0, g, (), (2,))), Ok)
    removal = await bob.wait_for(Push, conv_id=g, seq=2)
    res = await bob.request(Sync(0, first.next_since, 0, 0))
    assert isinstance(res, SyncResult)
    [row] = [r for r in res.convs if r.conv_id == g]
    assert (row.is_member, row.max_seq) == (False, removal.seq)


async def test_positions_sent_right_before_a_close_are_stored(gw: Server) -> None:
    """A READ and a DELIVERED queued behind slower requests when the client closes (an
    app that marks a conversation read and goes to the background) are still stored and
    notified; the requests queued with them are dropped, their answers nowhere to go."""
    a = await Wire.login(gw.port, 1)
    conv = await conv_of(await a.request(OpenP2P(0, 2)))
    for i in range(3):
        await send(a, conv, f"m{i}")
    b = await Wire.login(gw.port, 2, "phone")
    ahead = b"".join(encode(Sync(rid, 0, 0, 100)) for rid in range(1, 41))
    await b.write(ahead + encode(Read(conv, 3)) + encode(Delivered(conv, 3)))
    await b.close()  # at once: the SYNCs are still being answered
    assert await a.wait_for(ReadNotify) == ReadNotify(conv, 2, 3)
    again = await Wire.login(gw.port, 2, "phone")
    deadline = asyncio.get_running_loop().time() + 5
    while True:  # the DELIVERED is handled after the READ that notified
        page = await again.request(Sync(0, 0, 0, 100))
        assert isinstance(page, SyncResult)
        [mine] = [c for c in page.convs if c.conv_id == conv]
        if mine.delivered_seq == 3 or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert (mine.read_seq, mine.delivered_seq, mine.unread) == (3, 3, 0)
