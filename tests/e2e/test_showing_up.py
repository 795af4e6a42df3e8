"""Showing up in a conversation (storage/membership.py): what a user did there, never
what others did to it, decides whether others see its presence and whether the
conversation takes a slot of its quota (max_conversations)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.server import Server
from protocol.frames import (
    ConvOk,
    GroupCreate,
    GroupMembers,
    Ok,
    OpenP2P,
    Presence,
    PresenceResult,
    Read,
    Send,
    SendAck,
)
from protocol.ops import ErrorCode
from tests.conftest import StartGateway
from tests.support.wire import Wire

# Both stores: the rules are SQL in each (SQLite; MySQL behind Redis's read positions).
pytestmark = pytest.mark.backends("embedded", "production")


async def conv_of(reply: object) -> int:
    assert isinstance(reply, ConvOk), reply
    return reply.conv_id


async def presence(w: Wire, uid: int) -> tuple[str, ...]:
    res = await w.request(Presence(0, (uid,)))
    assert isinstance(res, PresenceResult), res
    [(who, devices)] = res.entries
    assert who == uid
    return devices


async def counts(gw: Server, uids: list[int]) -> dict[int, int]:
    got: dict[int, int] = await gw.node.store.conversation_counts(uids)  # type: ignore[union-attr]
    return got


async def read_all(w: Wire, conv: int, seq: int) -> None:
    """READ up to `seq`, and wait until the store has it (the production store writes
    read positions to MySQL about once a second)."""
    await w.send(Read(conv, seq))
    await asyncio.sleep(1.2)


async def test_inherited_ownership_shows_no_presence(gw: Server) -> None:
    a = await Wire.login(gw.port, 1, "a-phone")
    s = await Wire.login(gw.port, 2, "s-laptop")
    b = await Wire.login(gw.port, 3, "b-phone")
    g = await conv_of(await a.request(GroupCreate(0, "g", (2, 3))))
    assert await presence(b, 1) == ("a-phone",)  # the creator showed up by creating it
    assert await presence(b, 2) == ()
    assert isinstance(await a.request(GroupMembers(0, g, (), (1,))), Ok)  # A leaves
    # S owns the group now, but has done nothing there
    assert await presence(b, 2) == ()
    assert await presence(s, 3) == ()
    ack = await b.request(Send(0, g, "b1", 1, b"hi"))
    assert isinstance(ack, SendAck)
    await read_all(s, g, ack.seq)  # S reads: now it has shown up
    assert await presence(b, 2) == ("s-laptop",)


async def test_strangers_cannot_fill_a_quota(start_gateway: StartGateway) -> None:
    gw = await start_gateway(max_conversations=3)
    victim = await Wire.login(gw.port, 2)
    groups = []
    for stranger in (11, 12, 13, 14, 15):  # more groups than the victim's quota
        w = await Wire.login(gw.port, stranger)
        groups.append(await conv_of(await w.request(GroupCreate(0, "spam", (2,)))))
    assert (await counts(gw, [2, 11])) == {11: 1}  # the creators' quotas, not the victim's
    # the victim can still open its own conversations, and be asked into a friend's
    await conv_of(await victim.request(OpenP2P(0, 5)))
    friend = await Wire.login(gw.port, 6)
    with_friend = await conv_of(await friend.request(GroupCreate(0, "team", (2,))))
    assert (await counts(gw, [2]))[2] == 1  # the p2p
    # a group counts once the victim reads there
    await read_all(victim, with_friend, 1)
    assert (await counts(gw, [2]))[2] == 2
    await conv_of(await victim.request(GroupCreate(0, "mine", (6,))))
    assert (await counts(gw, [2]))[2] == 3
    # full now: what the victim would start is refused, an invitation still is not
    assert await victim.error(OpenP2P(0, 7)) == ErrorCode.FORBIDDEN
    assert await victim.error(GroupCreate(0, "more", ())) == ErrorCode.FORBIDDEN
    await conv_of(await friend.request(GroupCreate(0, "team 2", (2,))))
    # leaving a stranger's group it never read in frees nothing: it took nothing
    assert isinstance(await victim.request(GroupMembers(0, groups[0], (), (2,))), Ok)
    assert (await counts(gw, [2]))[2] == 3
    # the p2p counts for both sides: one per pair
    seven = await Wire.login(gw.port, 7)
    assert await seven.error(OpenP2P(0, 2)) == ErrorCode.FORBIDDEN
