"""WebSocket clients (--ws-listen): what is particular to the WebSocket framing. The
protocol itself runs over WebSocket in the modules marked `websocket` (test_session,
test_messaging, test_conversations, test_abuse) and in tests/test_raw_protocol.py.

Frames are written here by hand with the `websockets` library's sans-I/O client, so a
test can send what a well-behaved client never would: text, fragments, a frame cut in
the middle, an oversized message."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from gateway.client import Client
from gateway.config import Config, ConfigError
from gateway.server import Server
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.frames import (
    ConvOk,
    Error,
    Kick,
    Login,
    LoginOk,
    OpenP2P,
    Ping,
    Pong,
    Push,
    Send,
    SendAck,
)
from protocol.frames import Frame as ImFrame
from protocol.ops import ErrorCode, KickReason
from tests.conftest import StartGateway
from tests.support.wire import Wire, token

pytestmark = pytest.mark.backends("embedded")


class RawWs:
    """One WebSocket client connection; frames out as given, events in as parsed."""

    opened: list[RawWs] = []  # closed after each test

    def __init__(
        self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.reader, self.writer = reader, writer
        self.ws = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/ws"), max_size=None)
        self.response: Response | None = None
        self.frames: list[Frame] = []

    @classmethod
    async def open(
        cls, port: int, path: str = "/ws", origin: str | None = None, rcvbuf: int = 0
    ) -> RawWs:
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        raw = cls(port, *await asyncio.open_connection(sock=sock))
        cls.opened.append(raw)
        request = raw.ws.connect()
        request.path = path
        if origin is not None:
            request.headers["Origin"] = origin
        raw.ws.send_request(request)
        raw.flush()
        while raw.response is None:
            if not await raw.fill():
                raise ConnectionResetError("closed before the handshake's answer")
        return raw

    def flush(self) -> None:
        for chunk in self.ws.data_to_send():
            if chunk:
                self.writer.write(chunk)

    async def fill(self, timeout: float = 5.0) -> bool:
        data = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
        if not data:
            self.ws.receive_eof()
        else:
            self.ws.receive_data(data)
        for event in self.ws.events_received():
            if isinstance(event, Response):
                self.response = event
            else:
                self.frames.append(event)
        self.flush()
        return bool(data)

    def send(self, frame: Frame) -> None:
        self.writer.write(frame.serialize(mask=True, extensions=[]))

    def send_frame(self, f: ImFrame) -> None:
        self.send(Frame(Opcode.BINARY, encode(f)[4:]))

    async def until_closed(self, timeout: float = 5.0) -> tuple[list[ImFrame], Close | None]:
        """The protocol frames received until the socket closes, and the close frame."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.fill(max(0.01, deadline - loop.time())):
            pass
        decoder = FrameDecoder(side=Side.CLIENT)
        out: list[ImFrame] = []
        close = None
        for f in self.frames:
            if f.opcode is Opcode.BINARY:
                out.extend(decoder.feed(encode_len(f.data)))  # type: ignore[arg-type]
            elif f.opcode is Opcode.CLOSE:
                close = Close.parse(f.data)
        return out, close

    async def login(self, uid: int, device: str = "d") -> LoginOk:
        self.send_frame(Login(1, 1, uid, device, token(uid, device)))
        while not any(f.opcode is Opcode.BINARY for f in self.frames):
            await self.fill()
        first = FrameDecoder(side=Side.CLIENT).feed(encode_len(self.frames.pop(0).data))[0]
        assert isinstance(first, LoginOk), first
        return first


@pytest.fixture(autouse=True)
async def _close_raw() -> AsyncIterator[None]:
    yield
    while RawWs.opened:
        writer = RawWs.opened.pop().writer
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def encode_len(body: bytes | bytearray) -> bytes:
    return len(body).to_bytes(4, "big") + bytes(body)


async def ws_gateway(start_gateway: StartGateway, **overrides: object) -> tuple[Server, int]:
    gw = await start_gateway(ws_listen="127.0.0.1:0", **overrides)
    return gw, gw.ws_port


async def test_a_text_message_is_refused_with_1003(start_gateway: StartGateway) -> None:
    _, port = await ws_gateway(start_gateway)
    c = await RawWs.open(port)
    await c.login(1)
    c.send(Frame(Opcode.TEXT, b"[3]"))
    frames, close = await c.until_closed()
    assert [(type(f), getattr(f, "code", None)) for f in frames] == [(Error, ErrorCode.BAD_FRAME)]
    assert close is not None and close.code == 1003


async def test_a_message_over_max_frame_is_refused_with_1009(start_gateway: StartGateway) -> None:
    _, port = await ws_gateway(start_gateway, max_frame=4096, max_content=1024)
    c = await RawWs.open(port)
    await c.login(1)
    c.send(Frame(Opcode.BINARY, b"\x91" + b"x" * 5000))
    frames, close = await c.until_closed()
    assert [getattr(f, "code", None) for f in frames] == [ErrorCode.FRAME_TOO_LARGE]
    assert close is not None and close.code == 1009


async def test_a_fragmented_message_is_one_frame(start_gateway: StartGateway) -> None:
    _, port = await ws_gateway(start_gateway)
    c = await RawWs.open(port)
    body = encode(Login(1, 1, 7, "d", token(7, "d")))[4:]
    c.send(Frame(Opcode.BINARY, body[:10], fin=False))
    c.send(Frame(Opcode.CONT, body[10:20], fin=False))
    c.send(Frame(Opcode.CONT, body[20:]))
    c.send(Frame(Opcode.PING, b"are you there"))  # a control frame: the library answers
    c.send_frame(Ping())
    while sum(f.opcode is Opcode.BINARY for f in c.frames) < 2:
        await c.fill()
    decoder = FrameDecoder(side=Side.CLIENT)
    got = [decoder.feed(encode_len(f.data))[0] for f in c.frames if f.opcode is Opcode.BINARY]
    assert [type(f) for f in got] == [LoginOk, Pong]
    assert any(f.opcode is Opcode.PONG and f.data == b"are you there" for f in c.frames)


async def test_heartbeats_alone_and_among_other_messages(start_gateway: StartGateway) -> None:
    """A PING alone in its read is answered without the library's parser (the common
    case), and so is one in a read with other messages, or behind part of one."""
    _, port = await ws_gateway(start_gateway)
    c = await RawWs.open(port)
    await c.login(1)

    async def pongs(n: int) -> None:
        while sum(f.opcode is Opcode.BINARY for f in c.frames) < n:
            await c.fill()
        decoder = FrameDecoder(side=Side.CLIENT)
        got = [decoder.feed(encode_len(f.data))[0] for f in c.frames]
        assert got == [Pong()] * n, got
        c.frames.clear()

    for _ in range(3):  # each with its own random mask
        c.send_frame(Ping())
        await c.writer.drain()
        await pongs(1)
    c.send_frame(Ping())
    c.send_frame(Ping())  # two in one write
    await pongs(2)
    ping = Frame(Opcode.BINARY, encode(Ping())[4:]).serialize(mask=True, extensions=[])
    other = Frame(Opcode.BINARY, encode(Ping())[4:]).serialize(mask=True, extensions=[])
    c.writer.write(other[:5])  # part of a message, then the rest with a whole PING
    await c.writer.drain()
    await asyncio.sleep(0.05)
    c.writer.write(other[5:] + ping)
    await pongs(2)


async def test_an_unfinished_message_is_closed_after_frame_timeout(
    start_gateway: StartGateway,
) -> None:
    """A message whose frame is cut in the middle and topped up a byte at a time is
    closed once unfinished for frame_timeout, as a TCP frame is; the node's count of
    unfinished bytes comes back to zero."""
    gw, port = await ws_gateway(start_gateway, frame_timeout=1.0)
    node = gw.node
    assert node is not None
    c = await RawWs.open(port)
    await c.login(1)
    wire = Frame(Opcode.BINARY, b"\x91" + b"x" * 30_000).serialize(mask=True, extensions=[])
    c.writer.write(wire[:20_000])
    await asyncio.sleep(0.2)
    assert node.partial_bytes >= 19_000
    closed = asyncio.create_task(c.until_closed(timeout=5))
    loop = asyncio.get_running_loop()
    started = loop.time()
    for i in range(20_000, 20_030):  # progress, one byte at a time
        if closed.done():
            break
        with contextlib.suppress(ConnectionError):
            c.writer.write(wire[i : i + 1])
        await asyncio.sleep(0.1)
    frames, close = await closed
    assert loop.time() - started < 2.5
    assert [getattr(f, "code", None) for f in frames] == [ErrorCode.BAD_FRAME]
    assert close is not None and close.code == 1000
    await asyncio.sleep(0.05)
    assert node.partial_bytes == 0


async def test_unfinished_messages_are_bounded_across_the_node(
    start_gateway: StartGateway,
) -> None:
    gw, port = await ws_gateway(start_gateway, max_partial_bytes=100_000)
    node = gw.node
    assert node is not None
    first, second = await RawWs.open(port), await RawWs.open(port)
    await first.login(1)
    await second.login(2)
    wire = Frame(Opcode.BINARY, b"\x91" + b"x" * 60_000).serialize(mask=True, extensions=[])
    first.writer.write(wire[:59_000])
    await asyncio.sleep(0.2)
    assert node.partial_bytes > 50_000
    second.writer.write(wire[:59_000])
    frames, _ = await second.until_closed()  # it would take the node past the bound
    assert [getattr(f, "code", None) for f in frames] == [ErrorCode.BAD_FRAME]
    first.writer.write(wire[59_000:])  # the first one completes its message (a bad frame)
    await first.until_closed()
    await asyncio.sleep(0.05)
    assert node.partial_bytes == 0


async def test_a_slow_consumer_is_kicked_between_whole_messages(
    start_gateway: StartGateway,
) -> None:
    """A WebSocket client that stops reading is kicked slow_consumer like a TCP one; once
    it reads again it gets whole messages, the KICK, and the close."""
    gw, port = await ws_gateway(
        start_gateway, max_write_buffer=64 * 1024, rate_burst=100_000, rate_per_s=100_000
    )
    node = gw.node
    assert node is not None
    sender = await Wire.login(gw.port, 1)
    slow = await RawWs.open(port, rcvbuf=4096)
    await slow.login(2, "slow")
    slow.writer.transport.pause_reading()  # stop reading for real: the kernel buffers fill
    conv = await sender.request(OpenP2P(0, 2))
    assert isinstance(conv, ConvOk)
    for i in range(3000):
        await sender.send(Send(10_000 + i, conv.conv_id, f"flood-{i}", 1, b"z" * 2000))
        if i % 100 == 99:
            await sender.wait_for(SendAck, rid=10_000 + i, timeout=10)
            if (2, "slow") not in node.by_device:
                break
    assert (2, "slow") not in node.by_device
    slow.writer.transport.resume_reading()
    frames, close = await slow.until_closed(timeout=10)
    assert frames and all(isinstance(f, Push) for f in frames[:-1]), frames[-3:]
    last = frames[-1]
    assert isinstance(last, Kick) and last.reason == KickReason.SLOW_CONSUMER, last
    assert close is not None and close.code == 1000


async def test_the_login_deadline_covers_the_handshake(start_gateway: StartGateway) -> None:
    _, port = await ws_gateway(start_gateway, login_timeout=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ws HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    assert await asyncio.wait_for(reader.read(), 3) == b""
    writer.close()
    await writer.wait_closed()


async def test_a_second_login_kicks_the_first_with_a_kick_frame_then_1000(
    start_gateway: StartGateway,
) -> None:
    _, port = await ws_gateway(start_gateway)
    first, second = await RawWs.open(port), await RawWs.open(port)
    await first.login(5, "phone")
    await second.login(5, "phone")
    frames, close = await first.until_closed()
    assert [type(f) for f in frames] == [Kick]
    assert frames[0].reason == KickReason.DUPLICATE_LOGIN  # type: ignore[attr-defined]
    assert close is not None and close.code == 1000


async def test_a_draining_gateway_closes_with_1001(start_gateway: StartGateway) -> None:
    gw, port = await ws_gateway(start_gateway)
    c = await RawWs.open(port)
    await c.login(3)
    await gw.shutdown(rate=0)
    frames, close = await c.until_closed()
    assert [type(f) for f in frames] == [Kick]
    assert close is not None and close.code == 1001


async def test_http_answers(start_gateway: StartGateway) -> None:
    """The WebSocket path without an upgrade is told what it needs; an unknown path is
    404; the chat page, where it ships, is served with a policy that keeps it to its
    own listener."""
    _, port = await ws_gateway(start_gateway)

    async def get(path: str) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 5)  # the server closes after it
        writer.close()
        await writer.wait_closed()
        return data

    assert (await get("/ws")).startswith(b"HTTP/1.1 426 ")
    assert (await get("/nothing-here")).startswith(b"HTTP/1.1 404 ")
    page = Path(__file__).parents[2] / "gateway" / "web" / "index.html"
    if page.exists():
        answer = await get("/")
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b"Content-Security-Policy: default-src 'self'" in answer
        assert answer.endswith(page.read_bytes())


@pytest.mark.parametrize(
    ("allowed", "origin", "opens"),
    [
        ("", "https://evil.example", True),  # loopback listener: any origin
        ("https://app.example", "https://app.example", True),
        ("https://app.example", "https://evil.example", False),
        ("https://app.example", None, True),  # not a browser
        ("https://app.example", "http://127.0.0.1:{port}", True),  # its own page
        ("*", "https://evil.example", True),
    ],
)
async def test_browser_origins(
    start_gateway: StartGateway, allowed: str, origin: str | None, opens: bool
) -> None:
    _, port = await ws_gateway(start_gateway, ws_origins=allowed)
    c = await RawWs.open(port, origin=None if origin is None else origin.format(port=port))
    assert c.response is not None
    assert c.response.status_code == (101 if opens else 403)


def test_origins_default_to_none_off_loopback() -> None:
    assert Config(ws_listen="127.0.0.1:7071").ws_origin_set() is None
    assert Config(ws_listen="0.0.0.0:7071").ws_origin_set() == frozenset()
    assert Config(ws_listen="0.0.0.0:7071", ws_origins="*").ws_origin_set() is None
    with pytest.raises(ConfigError, match="ws_origins"):
        Config(token_keys=("k:s",), ws_origins="app.example").validate()
    with pytest.raises(ConfigError, match="ws_listen"):
        Config(token_keys=("k:s",), ws_listen="nowhere").validate()


async def test_wss_with_the_client_ports_certificate(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain, key = tmp_path / "chain.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    _, port = await ws_gateway(start_gateway, tls_cert=str(chain), tls_key=str(key))
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    url = f"wss://127.0.0.1:{port}/ws"
    async with (
        Client(url, 1, "a", token(1, "a"), tls=ctx) as a,
        Client(url, 2, "b", token(2, "b"), tls=ctx) as b,
    ):
        conv = await a.open_p2p(2)
        await a.send(conv, b"over wss")
        push = await b.next_event(5)
        assert getattr(push, "content", None) == b"over wss"
    with pytest.raises((OSError, TimeoutError)):  # plain ws:// to the TLS listener
        await asyncio.wait_for(RawWs.open(port), 2)
