"""gateway.client and `imgw chat` against a real gateway in a subprocess.

The module's gateway runs with hb 2 s and idle 6 s so heartbeats matter. Tests that
restart a gateway start their own; protocol corner cases a real gateway will not
produce on demand (KICK draining with a hint, a silent server) use a small fake
server built on the protocol package.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import pytest
import uvloop

from bench.serve import ServeProcess, free_port
from gateway.chat.view import render
from gateway.client import (
    Client,
    ClientError,
    ConnectionLost,
    RequestTimeout,
    SessionEnded,
    parse_addresses,
)
from gateway.client.inbox import ClientStats, FirstPage, Inbox
from gateway.client.seen import SeenSeqs
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.frames import (
    ConvOk,
    ConvRecord,
    Kick,
    Login,
    LoginOk,
    MsgRecord,
    Opaque,
    OpenP2P,
    PullResult,
    Push,
    ReadNotify,
    Sync,
    TypingNotify,
)
from protocol.ops import ErrorCode, KickReason, MsgType
from protocol.token import sign_token
from tests.support.tcpproxy import TcpProxy

KID, SECRET = "test", "secret"
KEY = f"{KID}:{SECRET}"
ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 10.0  # bound for every wait on something that should happen promptly

_uids = itertools.count(1000)
T = TypeVar("T")


def new_uid() -> int:
    return next(_uids)


def token(uid: int, device: str, secret: str = SECRET) -> str:
    return sign_token(KID, secret, uid, device, int(time.time()) + 3600)


class Gateway:
    """An `imgw serve` subprocess on the embedded store."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.data_dir = data_dir
        self.addr = f"127.0.0.1:{self.port}"
        self.log_path = data_dir / "gateway.log"
        self.server = ServeProcess(
            [
                "--port", str(self.port), "--data-dir", str(data_dir),
                "--token-key", KEY, "--hb", "2", "--idle", "6",
            ],
            port=self.port, log_path=self.log_path, cwd=ROOT,
        )  # fmt: skip

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.server.start(30)

    def stop(self) -> int:
        """SIGTERM; the exit status."""
        self.server.signal(signal.SIGTERM)
        return self.server.wait(30)

    def kill(self) -> None:
        self.server.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("gateway"))
    gw.start()
    try:
        yield gw
        assert gw.stop() == 0, gw.log()
    finally:
        gw.kill()


def make_client(addr: str, uid: int, device: str = "d", **kw: Any) -> Client:
    kw.setdefault("backoff_base", 0.05)
    kw.setdefault("backoff_cap", 0.5)
    return Client(addr, uid, device, lambda: token(uid, device), **kw)


async def next_push(client: Client, timeout: float = WAIT_S) -> Push:
    return await next_of(client, Push, timeout)


async def next_of(client: Client, cls: type[T], timeout: float = WAIT_S) -> T:
    async with asyncio.timeout(timeout):
        while True:
            event = await client.next_event()
            if isinstance(event, cls):
                return event


async def eventually(check: Callable[[], bool], timeout: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout):
        while not check():  # noqa: ASYNC110 - a counter, which no event announces
            await asyncio.sleep(0.05)


def queued_pushes(client: Client) -> list[Push]:
    out: list[Push] = []
    while (event := client.poll_event()) is not None:
        if isinstance(event, Push):
            out.append(event)
    return out


# --- sans-I/O parts ------------------------------------------------------------------


def test_parse_addresses() -> None:
    assert parse_addresses("h:1,  h2:2") == [("h", 1), ("h2", 2)]
    assert parse_addresses("[::1]:7070") == [("::1", 7070)]
    assert parse_addresses([("a", 5)]) == [("a", 5)]
    for bad in ("", "host", "host:x", "h:70000"):
        with pytest.raises(ValueError):
            parse_addresses(bad)


def test_seen_seqs_dedup() -> None:
    seen = SeenSeqs()
    assert seen.add(1) and seen.add(3) and seen.add(2)  # out of order is fine
    assert seen.floor == 3
    assert not seen.add(2) and not seen.add(3)
    seen.skip_to(100)  # a SYNC baseline: pushes still in flight below it are new once
    assert seen.add(99) and not seen.add(99)
    assert not seen.add(100 - 300)  # far below the floor: handled long ago
    for seq in range(200, 200 + 5000):  # a hole at 101..199 that never fills
        seen.add(seq)
    assert len(seen.recent) <= 2048 and seen.floor > 4000
    assert not seen.add(5100)


def test_render_messages() -> None:
    def rec(msg_type: int, content: bytes, sender: int = 0) -> MsgRecord:
        return MsgRecord(7, 1, sender, msg_type, content, 0, "")

    added = msgpack.packb({"event": "added", "by": 1, "uids": [4]})
    assert render(rec(MsgType.SYSTEM, added)).endswith("* 1 added 4")
    created = msgpack.packb({"event": "created", "by": 1, "uids": [1, 2], "title": "t"})
    assert render(rec(MsgType.SYSTEM, created)).endswith('* 1 created "t" with 1, 2')
    assert render(rec(MsgType.RECALL, msgpack.packb([5]), 1)).endswith("* message 5 recalled")
    assert render(rec(MsgType.TEXT, b"hi", 2)).endswith("] 2: hi")
    assert render(rec(120, b"\x00\x01", 2)).endswith("2: [type 120, 2 bytes]")


class FakeRequests:
    """The SYNC / PULL answers a catch-up sees, without a server."""

    uid = 1

    def __init__(self, rows: list[ConvRecord], msgs: dict[int, list[MsgRecord]]) -> None:
        self.rows, self.msgs = rows, msgs
        self.pulls: list[tuple[int, int]] = []
        self.since_seen: list[Opaque] = []
        self.firsts: list[FirstPage | None] = []  # the first page each pass was handed
        self.refuse_since = False

    async def sync_all(
        self, since: Opaque = 0, *, page: int = 0, first: FirstPage | None = None
    ) -> tuple[Opaque, list[Any]]:
        self.since_seen.append(since)
        self.firsts.append(first)
        if self.refuse_since and since != 0:
            raise ClientError(ErrorCode.BAD_REQUEST, "since was not issued here")
        return b"S1", self.rows

    async def pull(self, conv_id: int, after_seq: int = 0, limit: int = 0) -> PullResult:
        self.pulls.append((conv_id, after_seq))
        newer = [m for m in self.msgs.get(conv_id, []) if m.seq > after_seq]
        return PullResult(0, conv_id, len(newer) > 2, tuple(newer[:2]))  # pages of 2


def row(conv_id: int, max_seq: int) -> ConvRecord:
    return ConvRecord(conv_id, 1, max_seq, 0, 0, 0, 0, True)


def msg(seq: int, sender: int = 2, cmid: str = "") -> MsgRecord:
    return MsgRecord(seq, seq, sender, MsgType.TEXT, f"m{seq}".encode(), 0, cmid)


async def test_inbox_catch_up_pulls_only_what_was_missed() -> None:
    api = FakeRequests([row(10, 3), row(11, 7)], {})
    inbox = Inbox(api, ClientStats())
    await inbox.catch_up()  # the baseline: history up to here is not news
    assert api.pulls == [] and inbox.poll() is None
    inbox.deliver(Push(10, 4, 4, 2, 1, b"m4", 0, ""))  # live
    inbox.seen(10).add(6)  # our own SEND_ACK
    api.rows = [row(10, 7), row(11, 7), row(12, 3)]  # 12: a conversation joined later
    api.msgs = {
        10: [msg(4), msg(5), msg(6, sender=1), msg(7, sender=1, cmid="in-flight")],
        12: [msg(1), msg(2), msg(3)],
    }
    inbox.sending.add("in-flight")  # a send whose ack was lost: `send` will return it
    await inbox.catch_up()
    assert api.since_seen == [0, b"S1"]
    assert sorted(api.pulls) == [(10, 4), (10, 6), (12, 0), (12, 2)]
    delivered = [(e.conv_id, e.seq) for e in iter(inbox.poll, None) if isinstance(e, Push)]
    assert delivered == [(10, 4), (10, 5), (12, 1), (12, 2), (12, 3)]
    assert inbox.seen(10).floor == 7 and inbox.stats.dup_drops == 1
    inbox.deliver(Push(12, 3, 3, 2, 1, b"m3", 0, ""))  # its late PUSH is a duplicate
    assert inbox.poll() is None
    api.refuse_since = True  # a since from another deployment: start over from 0
    await inbox.catch_up()
    assert api.since_seen[-2:] == [b"S1", 0]


async def test_a_first_page_sent_ahead_is_used_only_from_its_since() -> None:
    """The SYNC a client sent with its LOGIN is the pass's first page when it was asked
    from where the pass starts; one asked from another `since` is left unused."""
    api = FakeRequests([row(10, 3)], {})
    inbox = Inbox(api, ClientStats())
    reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    ahead = FirstPage(inbox.next_since, 7, reply)
    await inbox.catch_up(ahead)  # the baseline, from 0
    assert api.firsts == [ahead] and inbox.next_since == b"S1"
    await inbox.catch_up(FirstPage(0, 8, reply))  # asked before the baseline moved on
    assert api.firsts[1:] == [None] and api.since_seen == [0, b"S1"]
    await inbox.catch_up()
    assert api.firsts[2:] == [None]


# --- against the gateway ---------------------------------------------------------------


async def test_connect_and_login(gateway: Gateway) -> None:
    uid = new_uid()
    async with make_client(gateway.addr, uid) as c:
        assert c.connected and c.login_ok is not None
        assert (c.login_ok.hb, c.login_ok.idle) == (2, 6)
        await c.ping()
        assert await c.presence([uid]) == {uid: ["d"]}
    assert not c.connected
    with pytest.raises(SessionEnded):
        await c.ping()


def _frames_of(chunk: bytes) -> list[Any]:
    return FrameDecoder(side=Side.SERVER).feed(chunk)


async def test_the_catch_up_sync_goes_in_the_login_write(gateway: Gateway) -> None:
    """docs/protocol.md: a client sends its first SYNC right behind its LOGIN. The bundled
    client does, on its first connection and on every reconnect (from the kept since), and
    the catch-up still finds what was missed."""
    proxy = TcpProxy("127.0.0.1", gateway.port)
    await proxy.start()
    u1, u2 = new_uid(), new_uid()
    try:
        async with (
            make_client(f"127.0.0.1:{proxy.port}", u1) as c,
            make_client(gateway.addr, u2) as peer,
        ):
            login, sync = _frames_of(proxy.first_chunks[0])
            assert isinstance(login, Login) and isinstance(sync, Sync) and sync.since == 0
            conv = await peer.open_p2p(u1)
            await peer.send(conv, b"before")
            assert (await next_push(c)).content == b"before"
            proxy.cut()  # the link drops; the client reconnects on its own
            await peer.send(conv, b"while away")
            await asyncio.sleep(0.3)
            proxy.restore()
            assert (await next_push(c)).content == b"while away"  # pulled by the catch-up
            assert len(proxy.first_chunks) >= 2
            login, sync = _frames_of(proxy.first_chunks[-1])
            assert isinstance(login, Login) and isinstance(sync, Sync)
            assert isinstance(sync.since, bytes)  # where the last pass ended: kept
            assert c.stats.reconnects >= 1
    finally:
        await proxy.close()


async def test_logout_takes_the_device_offline(gateway: Gateway) -> None:
    u1, u2 = new_uid(), new_uid()
    async with make_client(gateway.addr, u1) as watcher, make_client(gateway.addr, u2) as c:
        conv = await watcher.open_p2p(u2)  # presence answers about contacts only:
        ack = await watcher.send(conv, b"hi")
        await c.read(conv, ack.seq)  # those who have shown up in a shared conversation
        for _ in range(50):  # MySQL + Redis: read positions reach MySQL within a second
            if await watcher.presence([u2]) == {u2: ["d"]}:
                break
            await asyncio.sleep(0.1)
        assert await watcher.presence([u2]) == {u2: ["d"]}
        await c.logout()
        assert c.end_reason is not None and not c.connected
        assert await watcher.presence([u2]) == {u2: []}


async def test_auth_failure(gateway: Gateway) -> None:
    uid = new_uid()
    bad = Client(gateway.addr, uid, "d", token(uid, "d", secret="wrong"))
    with pytest.raises(ClientError) as info:
        await bad.connect()
    assert info.value.code == ErrorCode.AUTH_FAILED
    assert not bad.connected
    other = Client(gateway.addr, uid, "d", token(uid + 1, "d"))  # someone else's token
    with pytest.raises(ClientError) as info:
        await other.connect()
    assert info.value.code == ErrorCode.AUTH_FAILED


async def test_no_gateway_listening() -> None:
    c = Client(f"127.0.0.1:{free_port()}", 1, "d", token(1, "d"))
    with pytest.raises(ConnectionLost):
        await c.connect()


async def test_send_push_read_typing_recall(gateway: Gateway) -> None:
    u1, u2 = new_uid(), new_uid()
    async with make_client(gateway.addr, u1) as a, make_client(gateway.addr, u2) as b:
        conv = await a.open_p2p(u2)
        assert await b.open_p2p(u1) == conv
        ack = await a.send(conv, b"hello", client_msg_id="m-1")
        push = await next_push(b)
        assert (push.conv_id, push.seq, push.msg_id) == (conv, ack.seq, ack.msg_id)
        assert (push.sender_uid, push.content, push.client_msg_id) == (u1, b"hello", "m-1")
        await b.read(conv, push.seq)
        note = await next_of(a, ReadNotify)
        assert (note.conv_id, note.reader_uid, note.seq) == (conv, u2, ack.seq)
        await b.typing(conv)
        assert (await next_of(a, TypingNotify)).uid == u2
        recall_seq = await a.recall(conv, ack.seq)
        recall = await next_push(b)
        assert (recall.seq, recall.msg_type) == (recall_seq, MsgType.RECALL)
        history = await b.history(conv, limit=10)
        assert [m.seq for m in history.msgs] == [ack.seq, recall_seq]
        assert history.msgs[0].msg_type == MsgType.RECALL and history.msgs[0].content == b""
        with pytest.raises(ClientError) as info:
            await a.send(conv, b"x", msg_type=MsgType.SYSTEM)
        assert info.value.code == ErrorCode.BAD_MSG_TYPE
        assert a.statistics().pushes == 0 and b.statistics().pushes == 2


async def test_groups(gateway: Gateway) -> None:
    owner, m1, m2 = new_uid(), new_uid(), new_uid()
    async with make_client(gateway.addr, owner) as o, make_client(gateway.addr, m1) as a:
        conv = await o.group_create("team", [m1])
        created = await next_push(a)
        assert render(created).endswith(f'* {owner} created "team" with {owner}, {m1}')
        await o.group_members(conv, add=[m2])
        assert render(await next_push(a)).endswith(f"* {owner} added {m2}")
        info = await o.group_info(conv)
        assert (info.title, info.owner_uid, sorted(info.uids)) == ("team", owner, [owner, m1, m2])
        with pytest.raises(ClientError) as err:
            await a.group_members(conv, remove=[m2])
        assert err.value.code == ErrorCode.FORBIDDEN
        reply = await a.request(OpenP2P(0, owner))  # generic: the client assigns the rid
        assert isinstance(reply, ConvOk) and reply.rid != 0


async def test_request_returns_error_as_exception(gateway: Gateway) -> None:
    uid = new_uid()
    async with make_client(gateway.addr, uid) as c:
        with pytest.raises(ClientError) as err:
            await c.open_p2p(uid)
        assert err.value.code == ErrorCode.BAD_REQUEST
        with pytest.raises(ClientError) as err:
            await c.pull(2**40)
        assert err.value.code == ErrorCode.NO_SUCH_CONVERSATION
        await c.ping()  # the connection survives both


async def test_resend_returns_the_same_ack(gateway: Gateway) -> None:
    u1, u2 = new_uid(), new_uid()
    async with make_client(gateway.addr, u1) as a:
        conv = await a.open_p2p(u2)
        first = await a.send(conv, b"once", client_msg_id="same-id")
        again = await a.send(conv, b"once", client_msg_id="same-id")
        assert (again.seq, again.msg_id, again.server_ms) == (
            first.seq,
            first.msg_id,
            first.server_ms,
        )
        with pytest.raises(ClientError) as err:
            await a.send(conv, b"different", client_msg_id="same-id")
        assert err.value.code == ErrorCode.IDEMPOTENCY_CONFLICT
        assert [m.seq for m in await a.pull_all(conv)] == [first.seq]


async def test_send_retried_after_dropped_connection(gateway: Gateway) -> None:
    u1, u2 = new_uid(), new_uid()
    async with make_client(gateway.addr, u1) as a, make_client(gateway.addr, u2) as b:
        conv = await a.open_p2p(u2)
        sending = asyncio.create_task(a.send(conv, b"survives", client_msg_id="retry-me"))
        await asyncio.sleep(0)  # let it write the SEND
        a.drop_connection()
        ack = await asyncio.wait_for(sending, WAIT_S)
        assert a.stats.send_retries >= 1 and a.stats.reconnects == 1
        again = await a.send(conv, b"survives", client_msg_id="retry-me")
        assert (again.seq, again.msg_id) == (ack.seq, ack.msg_id)
        stored = [m for m in await b.pull_all(conv) if m.client_msg_id == "retry-me"]
        assert [m.seq for m in stored] == [ack.seq]
        assert (await next_push(b)).seq == ack.seq


async def test_pull_all_and_sync_all_page(gateway: Gateway) -> None:
    uid = new_uid()
    peers = [new_uid() for _ in range(5)]
    async with make_client(gateway.addr, uid) as c:
        convs = [await c.open_p2p(p) for p in peers]
        conv = convs[0]
        acks = await asyncio.gather(*(c.send(conv, f"m{i}".encode()) for i in range(65)))
        seqs = [a.seq for a in acks]
        assert seqs == sorted(seqs) and len(set(seqs)) == 65  # pipelined, in order
        page = await c.pull(conv, limit=20)
        assert page.has_more and [m.seq for m in page.msgs] == seqs[:20]
        msgs = await c.pull_all(conv)  # server pages of 50
        assert [m.content for m in msgs] == [f"m{i}".encode() for i in range(65)]
        assert [m.seq for m in await c.pull_all(conv, seqs[9], page=7)] == seqs[10:]
        first = await c.sync(limit=2)
        assert first.has_more and len(first.convs) == 2
        since, rows = await c.sync_all(page=2)
        assert {r.conv_id for r in rows} == set(convs)
        assert {r.conv_id: r.max_seq for r in rows}[conv] == seqs[-1]
        ack = await c.send(convs[3], b"later")
        _, changed = await c.sync_all(since, page=2)
        assert {r.conv_id: r.max_seq for r in changed}[convs[3]] == ack.seq


async def test_duplicate_login_ends_the_older_session(gateway: Gateway) -> None:
    uid = new_uid()
    async with (
        make_client(gateway.addr, uid, "phone") as old,
        make_client(gateway.addr, uid, "phone") as new,
    ):
        kick = await next_of(old, Kick)
        assert kick.reason == KickReason.DUPLICATE_LOGIN
        events = [e async for e in old.incoming()]  # ends: no reconnect
        assert events == []
        assert old.end_reason is not None and old.end_reason.kick == kick
        with pytest.raises(SessionEnded):
            await old.send(1, b"x")
        await new.ping()
        assert new.connected and not old.connected


async def test_heartbeat_keeps_an_idle_session(gateway: Gateway) -> None:
    async with make_client(gateway.addr, new_uid()) as c:
        await eventually(lambda: c.stats.heartbeats >= 2)  # hb is 2 s
        await c.ping()
        assert c.stats.connects == 1 and c.stats.reconnects == 0


def test_works_on_uvloop(gateway: Gateway) -> None:
    u1, u2 = new_uid(), new_uid()

    async def scenario() -> bytes:
        async with make_client(gateway.addr, u1) as a, make_client(gateway.addr, u2) as b:
            conv = await a.open_p2p(u2)
            await a.send(conv, b"on uvloop")
            return (await next_push(b)).content

    assert uvloop.run(scenario()) == b"on uvloop"


async def test_reconnect_after_gateway_restart(tmp_path: Path) -> None:
    gw = Gateway(tmp_path / "data")
    await asyncio.to_thread(gw.start)
    u1, u2 = new_uid(), new_uid()
    logins = 0
    allow_login = asyncio.Event()

    async def gated_token() -> str:  # holds u1 away until the test lets it back
        nonlocal logins
        logins += 1
        if logins > 1:
            await allow_login.wait()
        return token(u1, "a")

    away = Client(gw.addr, u1, "a", gated_token, backoff_base=0.05, backoff_cap=0.3)
    try:
        async with away, make_client(gw.addr, u2, "b") as peer:
            conv = await peer.open_p2p(u1)
            await peer.send(conv, b"before")
            assert (await next_push(away)).content == b"before"
            assert await asyncio.to_thread(gw.stop) == 0
            assert (await next_of(away, Kick)).reason == KickReason.DRAINING
            await asyncio.to_thread(gw.start)
            ack = await peer.send(conv, b"while away")  # waits for peer's own reconnect
            assert not away.connected
            allow_login.set()
            push = await next_push(away)
            assert (push.seq, push.content, push.sender_uid) == (ack.seq, b"while away", u2)
            assert away.stats.caught_up == 1 and away.stats.reconnects == 1
            after = await peer.send(conv, b"after")
            assert (await next_push(away)).seq == after.seq
            await away.ping()
            assert queued_pushes(away) == []  # nothing came twice
        assert await asyncio.to_thread(gw.stop) == 0, gw.log()
    finally:
        gw.kill()


# --- against a fake server -----------------------------------------------------------


Behaviour = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Login], Awaitable[None]]


@contextlib.asynccontextmanager
async def fake_server(behaviour: Behaviour) -> AsyncIterator[str]:
    """Answer LOGIN with LOGIN_OK, then run `behaviour`; yields the address."""
    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(side=Side.SERVER)
        frames: list[Any] = []
        try:
            while not frames:
                data = await reader.read(65536)
                if not data:
                    return
                frames = decoder.feed(data)
            login = frames[0]
            assert isinstance(login, Login)
            writer.write(encode(LoginOk(login.rid, "fake", 30, 75, 65536, 2048, 0)))
            await behaviour(reader, writer, login)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        await handle(reader, writer)

    server = await asyncio.start_server(track, "127.0.0.1", 0)
    async with server:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    if handlers:  # the clients closed, so every handler ends
        await asyncio.wait_for(asyncio.gather(*handlers), WAIT_S)


async def test_kick_draining_follows_the_reconnect_hint(gateway: Gateway) -> None:
    async def drain_to_real(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, login: Login
    ) -> None:
        writer.write(encode(Kick(KickReason.DRAINING, "node draining", gateway.addr)))
        await writer.drain()

    async with fake_server(drain_to_real) as fake:
        c = make_client(fake, new_uid(), backoff_base=0.01)
        async with c:
            kick = await next_of(c, Kick)
            assert (kick.reason, kick.reconnect_hint) == (KickReason.DRAINING, gateway.addr)
            async with asyncio.timeout(WAIT_S):
                ok = await c.wait_connected()
            assert ok.node != "fake" and c.stats.reconnects == 1
            await c.ping()


async def test_pending_requests_fail_when_the_connection_drops() -> None:
    got_request = asyncio.Event()

    async def hang_up_on_request(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, login: Login
    ) -> None:
        await reader.read(65536)  # the OPEN_P2P (or the baseline SYNC): never answered
        got_request.set()

    async with fake_server(hang_up_on_request) as fake:
        c = make_client(fake, 7, reconnect=False, catch_up=False)
        async with c:
            asking = asyncio.create_task(c.open_p2p(8))
            await asyncio.wait_for(got_request.wait(), WAIT_S)
            with pytest.raises(ConnectionLost):
                await asyncio.wait_for(asking, WAIT_S)
            with pytest.raises(SessionEnded):
                await c.send(1, b"too late")
            assert [e async for e in c.incoming()] == []


async def test_request_timeout() -> None:
    async def silent(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, login: Login
    ) -> None:
        while await reader.read(65536):
            pass

    async with (
        fake_server(silent) as fake,
        make_client(fake, 7, catch_up=False, request_timeout=0.2) as c,
    ):
        with pytest.raises(RequestTimeout):
            await c.open_p2p(8)
        with pytest.raises(TimeoutError):
            await c.next_event(0.01)


# --- imgw chat ---------------------------------------------------------------------------


async def read_until(stream: asyncio.StreamReader | None, text: str) -> str:
    assert stream is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(20):
            while line := (await stream.readline()).decode():
                seen.append(line)
                if text in line:
                    return line
    except TimeoutError:
        pass
    raise AssertionError(f"{text!r} not in output: {''.join(seen)!r}")


async def start_chat(gateway: Gateway, *args: str, key: str = KEY) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "chat", *args, "--addr", gateway.addr,
        "--key", key, cwd=ROOT, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


async def finish(*procs: asyncio.subprocess.Process) -> None:
    """Kill what a failed test left running, and collect every process."""
    for p in procs:
        if p.returncode is None:
            p.kill()
            await p.communicate()


async def type_line(proc: asyncio.subprocess.Process, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(f"{line}\n".encode())
    await proc.stdin.drain()


async def test_chat_between_two_processes(gateway: Gateway) -> None:
    u1, u2 = new_uid(), new_uid()
    p1 = await start_chat(gateway, "--uid", str(u1), "--peer", str(u2))
    p2 = await start_chat(gateway, "--uid", str(u2), "--peer", str(u1))
    try:
        await read_until(p1.stdout, "/quit to exit")
        await read_until(p2.stdout, "/quit to exit")
        await type_line(p1, "hello over pipes ✓")
        line = await read_until(p2.stdout, "hello over pipes")
        assert line.rstrip().endswith(f"{u1}: hello over pipes ✓")
        await type_line(p2, "and back")
        await read_until(p1.stdout, f"{u2}: and back")
        await read_until(p2.stdout, f'(read by {u1}: "and back")')  # p1 marked it read
        await type_line(p1, "/quit")
        _, err1 = await asyncio.wait_for(p1.communicate(), 30)
        assert p2.stdin is not None
        p2.stdin.close()  # end of input quits too
        _, err2 = await asyncio.wait_for(p2.communicate(), 30)
        assert (p1.returncode, p2.returncode) == (0, 0), (err1, err2)
    finally:
        await finish(p1, p2)


async def test_chat_creates_a_group(gateway: Gateway) -> None:
    owner, member = new_uid(), new_uid()
    async with make_client(gateway.addr, member) as m:
        proc = await start_chat(
            gateway, "--uid", str(owner), "--create-group", "crew", "--members", str(member)
        )
        try:
            header = await read_until(proc.stdout, "/quit to exit")
            created = await next_push(m)
            assert f"conversation {created.conv_id} " in header
            assert render(created).endswith(f'* {owner} created "crew" with {owner}, {member}')
            await type_line(proc, "hi crew")
            assert (await next_push(m)).content == b"hi crew"
            await m.send(created.conv_id, b"hello owner")
            await read_until(proc.stdout, f"{member}: hello owner")
            await type_line(proc, "/quit")
            _, err = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, err
        finally:
            await finish(proc)


async def test_chat_reports_a_bad_key(gateway: Gateway) -> None:
    proc = await start_chat(gateway, "--uid", "5", "--peer", "6", key="test:wrong")
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 1
        assert b"auth_failed" in err
    finally:
        await finish(proc)
