"""`imgw chat`'s session and receipts without a gateway (gateway/chat/session.py,
gateway/chat/view.py): the orders of lines that races between the sender, the incoming
loop and the connection decide, forced one way."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import msgpack
import pytest

from gateway.chat.session import ChatSession
from gateway.chat.view import Receipts, removal
from gateway.client import Client
from gateway.client.inbox import ClientStats
from protocol.frames import LoginOk, Push, ReadNotify, SendAck
from protocol.ops import MsgType

CONV = 9


class FakeClient:
    """What ChatSession uses of a Client; `send` waits until the test answers it."""

    def __init__(self) -> None:
        self.stats = ClientStats(connects=1)
        self.connected = True
        self.login_ok = LoginOk(0, "node-b", 30, 90, 65536, 2048, 0)
        self.acks: asyncio.Queue[asyncio.Future[SendAck]] = asyncio.Queue()
        self.reads: list[int] = []

    async def send(self, conv_id: int, content: bytes) -> SendAck:
        ack: asyncio.Future[SendAck] = asyncio.get_running_loop().create_future()
        await self.acks.put(ack)
        return await ack

    async def read(self, conv_id: int, seq: int) -> None:
        self.reads.append(seq)

    async def catch_up(self) -> None:
        pass


def session(fake: FakeClient) -> ChatSession:
    return ChatSession(cast(Client, fake), 1, CONV, 'group "crew"')


def printed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


async def test_sent_shows_after_the_reconnect_that_let_it_through(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeClient()
    chat = session(fake)
    fake.connected = False  # lost; the incoming loop has not looked yet
    chat._queue("typed while down")
    sender = asyncio.create_task(chat._send_all())
    ack = await fake.acks.get()
    fake.connected, fake.stats.connects = True, 2  # back: the send goes through at once
    ack.set_result(SendAck(0, CONV, 5, 500, 0))
    await chat.outbox.join()
    sender.cancel()
    assert printed(capsys) == [
        "* connection to the gateway lost; reconnecting",
        '(pending) "typed while down": sent once the gateway acks it',
        "* reconnected to node-b; catching up",
        '(sent) "typed while down"',
    ]
    assert chat.catching is not None
    await chat.catching


async def test_a_receipt_that_overtakes_the_ack_shows_once_the_ack_lands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeClient()
    chat = session(fake)
    chat._queue("hi crew")
    sender = asyncio.create_task(chat._send_all())
    ack = await fake.acks.get()
    # members read it off its PUSH before our ack is handled
    await chat._show_event(ReadNotify(CONV, 2, 5))
    await chat._show_event(ReadNotify(CONV, 3, 5))
    assert printed(capsys) == []
    ack.set_result(SendAck(0, CONV, 5, 500, 0))
    await chat.outbox.join()
    sender.cancel()
    await chat._show_event(ReadNotify(CONV, 2, 5))  # another device of 2: said already
    assert printed(capsys) == ['(read by 2, 3: "hi crew")']


def system(event: str, by: int, uids: list[int], seq: int = 4) -> Push:
    content = msgpack.packb({"event": event, "by": by, "uids": uids})
    return Push(CONV, seq, 400 + seq, 0, MsgType.SYSTEM, content, 0, "")


async def test_removed_it_says_so_reads_nothing_and_stops(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeClient()
    chat = session(fake)
    await chat._show_event(system("removed", 7, [5]))  # someone else
    assert chat.gone is None and fake.reads == [4]
    await chat._show_event(system("removed", 7, [1, 5], seq=6))
    assert chat.gone == 'you were removed from group "crew" by 7'
    assert fake.reads == [4]  # a READ now would only be refused: not_member
    lines = printed(capsys)
    assert lines[-1] == '* you were removed from group "crew" by 7; leaving'
    await chat.show_incoming()  # returns at once: the session is over


def test_removal_names_what_took_us_out() -> None:
    assert removal(system("left", 1, [1]), 1, "g") == "you left g (from another window or device)"
    assert removal(system("left", 5, [5]), 1, "g") is None
    assert removal(system("added", 7, [1]), 1, "g") is None
    text = Push(CONV, 4, 404, 7, MsgType.TEXT, b"removed 1", 0, "c")
    assert removal(text, 1, "g") is None


def test_receipts_name_each_reader_once() -> None:
    r = Receipts()
    assert r.own(5, "hi") is None
    assert r.read(2, 5) == '(read by 2: "hi")'
    assert r.read(3, 5) == '(read by 3: "hi")'  # not "2, 3": 2 was said
    assert r.read(3, 5) is None
    assert r.read(2, 6) is None  # not one of ours
    assert r.own(7, "more") is None
    assert r.read(2, 9) == '(read by 2: "more")'
    assert r.own(8, "late ack") == '(read by 2: "late ack")'  # 2 read up to 9 already
    assert r.read(3, 9) == '(read by 3: "late ack")'  # its latest: 7 and 8 in one line


def test_receipts_forget_old_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.chat.view as view

    monkeypatch.setattr(view, "OWN_KEPT", 2)
    r = Receipts()
    for seq in (1, 2, 3):
        r.own(seq, f"m{seq}")
    assert r.read(2, 1) is None  # forgotten
    assert r.read(2, 3) == '(read by 2: "m3")'
    kept: Any = r._own
    assert sorted(kept) == [2, 3]
