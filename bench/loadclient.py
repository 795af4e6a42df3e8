"""A lean client connection for load generation, over the sans-I/O codec.

`LoadConnection` is one asyncio `Protocol` per socket: it logs in, opens p2p
conversations, writes SEND frames without waiting for anything, matches each SEND_ACK
(or ERROR) to its send by rid, and hands every PUSH to a `LoadSink`. It owns no task and
no timer; the generator that drives it decides when to send (one pacing timer for all
connections of a process), so thousands of connections cost one dict each.

Times are `time.monotonic_ns()` values, which all processes of one host share. The
intended send time of each message travels in the first 8 bytes of its content, so the
receiver measures the PUSH latency without any shared state with the sender.

`WsLoadConnection` is the same over WebSocket (the gateway's `--ws-listen`): the opening
handshake first (bench.wsclient), then one frame body per binary message.

This is deliberately not `gateway.client`: no reconnects, no sync, no inbox — just
enough protocol to measure the send path. The framing and login helpers below serve the
leaner generators too (bench.holders, bench.probes.idle_rss), which keep one slotted object per
connection and decode only the few frames they wait for.
"""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any, Final, Protocol

import msgpack

from bench.wsclient import OP_BINARY, ClientFramer, Handshake, WsError, control_reply, read_frames
from protocol.codec import encode, encode_body
from protocol.decoder import Decoded, FrameDecoder, Side, decode_body
from protocol.errors import FrameError
from protocol.frames import (
    ConvOk,
    Error,
    GroupCreate,
    Kick,
    Login,
    LoginOk,
    OpenP2P,
    Ping,
    Push,
    Send,
    SendAck,
)
from protocol.ops import ErrorCode, KickReason
from protocol.token import sign_token

STAMP: Final = struct.Struct(">Q")
"""Content prefix: the intended send time (monotonic ns) of the message."""

PING: Final = encode(Ping())
_MSG_TEXT: Final = 1
_LEN: Final = struct.Struct(">I")


def login_frame(kid: str, secret: str, uid: int, device: str, exp: int, rid: int = 1) -> bytes:
    """A LOGIN frame for (`uid`, `device`) with a token signed by `kid:secret`."""
    return encode(Login(rid, 1, uid, device, sign_token(kid, secret, uid, device, exp)))


def raw_frames(buf: bytes) -> tuple[list[list[Any]], bytes]:
    """The complete frames at the start of `buf`, each as its msgpack array (op first),
    and the bytes left over: for clients that look at a frame's op and a field or two
    and want no frame objects."""
    frames: list[list[Any]] = []
    while len(buf) >= 4:
        (n,) = _LEN.unpack_from(buf)
        if len(buf) < 4 + n:
            break
        frames.append(msgpack.unpackb(buf[4 : 4 + n]))
        buf = buf[4 + n :]
    return frames, buf


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name.lower()
    except ValueError:
        return f"code_{code}"


def kick_name(reason: int) -> str:
    try:
        return KickReason(reason).name.lower()
    except ValueError:
        return f"reason_{reason}"


def stamped_content(intended_ns: int, padding: bytes) -> bytes:
    """Message content: the intended send time, then `padding`."""
    return STAMP.pack(intended_ns) + padding


def stamp_of(content: bytes) -> int | None:
    """The intended send time carried in `content`, or None if it carries none."""
    if len(content) < STAMP.size:
        return None
    value: int = STAMP.unpack_from(content)[0]
    return value


class RequestFailed(Exception):
    """A setup request (LOGIN, OPEN_P2P) was answered with ERROR or KICK, or the
    connection closed first."""


class LoadSink(Protocol):
    """Where a `LoadConnection` reports what happens to its sends."""

    def on_ack(self, intended_ns: int, now_ns: int) -> None: ...

    def on_error(self, intended_ns: int, reason: str) -> None: ...

    def on_push(self, push: Push, now_ns: int) -> None: ...

    def on_kick(self, reason: str) -> None: ...


class LoadConnection(asyncio.Protocol):
    """One logged-in device. `send` is fire-and-forget; results go to the sink."""

    __slots__ = (
        "_calls",
        "_decoder",
        "_next_rid",
        "closed",
        "pending",
        "sink",
        "transport",
        "uid",
    )

    def __init__(self, uid: int, sink: LoadSink) -> None:
        self.uid = uid
        self.sink = sink
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.pending: dict[int, int] = {}  # rid -> intended send time (ns) of a SEND
        self._calls: dict[int, asyncio.Future[object]] = {}  # rid -> setup request
        self._decoder = FrameDecoder(side=Side.CLIENT)
        self._next_rid = 0

    # -- requests ------------------------------------------------------------------------

    def _rid(self) -> int:
        self._next_rid += 1
        return self._next_rid

    async def request(self, frame_of_rid: type, *args: object, timeout: float) -> object:
        """Any request: `frame_of_rid(rid, *args)`; its reply (ERROR raises)."""
        return await self._call(frame_of_rid, *args, timeout=timeout)

    async def _call(self, frame_of_rid: type, *args: object, timeout: float) -> object:
        if self.closed or self.transport is None:
            raise RequestFailed(f"uid {self.uid}: connection closed")
        rid = self._rid()
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._calls[rid] = fut
        self.transport.write(self._wire(frame_of_rid(rid, *args)))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._calls.pop(rid, None)

    async def login(self, token: str, device: str, *, timeout: float) -> LoginOk:
        reply = await self._call(Login, 1, self.uid, device, token, timeout=timeout)
        assert isinstance(reply, LoginOk)
        return reply

    async def open_p2p(self, peer_uid: int, *, timeout: float) -> int:
        reply = await self._call(OpenP2P, peer_uid, timeout=timeout)
        assert isinstance(reply, ConvOk)
        return reply.conv_id

    async def group_create(self, title: str, uids: list[int], *, timeout: float) -> int:
        reply = await self._call(GroupCreate, title, tuple(uids), timeout=timeout)
        assert isinstance(reply, ConvOk)
        return reply.conv_id

    def send(self, conv_id: int, client_msg_id: str, content: bytes, intended_ns: int) -> None:
        """Write one SEND now; its SEND_ACK or ERROR reaches the sink."""
        transport = self.transport
        if self.closed or transport is None:
            self.sink.on_error(intended_ns, "not_connected")
            return
        rid = self._next_rid = self._next_rid + 1
        self.pending[rid] = intended_ns
        transport.write(self._wire(Send(rid, conv_id, client_msg_id, _MSG_TEXT, content)))

    def _wire(self, frame: Any) -> bytes:
        """`frame` as written on this connection."""
        return encode(frame)

    def ping(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(PING)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()  # one clock read per chunk: the time it reached us
        try:
            frames = self._decoder.feed(data)
        except FrameError as e:
            frames = e.frames
            if self.transport is not None:
                self.transport.abort()
        self._dispatch(frames, now)

    def _dispatch(self, frames: list[Decoded], now: int) -> None:
        sink = self.sink
        for f in frames:
            kind = type(f)
            if kind is SendAck:
                intended = self.pending.pop(f.rid, None)  # type: ignore[union-attr]
                if intended is not None:
                    sink.on_ack(intended, now)
            elif kind is Push:
                sink.on_push(f, now)  # type: ignore[arg-type]
            elif kind is Error:
                self._on_error(f)  # type: ignore[arg-type]
            elif kind is Kick:
                reason = kick_name(f.reason)  # type: ignore[union-attr]
                sink.on_kick(reason)
                self._fail_calls(f"kicked: {reason}")
            else:
                call = self._calls.get(getattr(f, "rid", 0))
                if call is not None and not call.done():
                    call.set_result(f)

    def _on_error(self, f: Error) -> None:
        intended = self.pending.pop(f.rid, None)
        if intended is not None:
            self.sink.on_error(intended, error_name(f.code))
            return
        call = self._calls.get(f.rid)
        if call is not None and not call.done():
            call.set_exception(RequestFailed(f"uid {self.uid}: {error_name(f.code)}: {f.text}"))

    def _fail_calls(self, why: str) -> None:
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(RequestFailed(f"uid {self.uid}: {why}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail_calls(f"connection lost ({exc})")
        pending, self.pending = self.pending, {}
        for intended in pending.values():
            self.sink.on_error(intended, "connection_lost")


class WsLoadConnection(LoadConnection):
    """A `LoadConnection` over WebSocket: `opened` is done once the handshake is."""

    __slots__ = ("_buf", "_framer", "_handshake", "opened")

    def __init__(self, uid: int, sink: LoadSink, handshake: Handshake) -> None:
        super().__init__(uid, sink)
        self._handshake: Handshake | None = handshake
        self._framer = ClientFramer()
        self._buf = b""
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _wire(self, frame: Any) -> bytes:
        return self._framer.frame(encode_body(frame))

    def ping(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(self._framer.ping)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self._handshake is not None
        transport.write(self._handshake.request())  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        transport = self.transport
        try:
            if self._handshake is not None:
                ws = self._handshake.receive(data)
                if ws is None:
                    return  # more of the 101 to come
                self._handshake = None
                if not self.opened.done():
                    self.opened.set_result(None)
            else:
                ws, self._buf = read_frames(self._buf + data if self._buf else data)
        except WsError as e:
            self._broken(str(e))
            return
        frames: list[Decoded] = []
        for opcode, payload in ws:
            if opcode == OP_BINARY:
                try:
                    frames.append(decode_body(payload, Side.CLIENT))
                except FrameError as e:
                    self._broken(f"bad frame: {e}")
                    break
            elif (reply := control_reply(self._framer, opcode, payload)) and transport:
                transport.write(reply)
        self._dispatch(frames, now)

    def _broken(self, why: str) -> None:
        if not self.opened.done():
            self.opened.set_exception(RequestFailed(f"uid {self.uid}: {why}"))
        self._fail_calls(why)
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(RequestFailed(f"uid {self.uid}: closed in the handshake"))
        super().connection_lost(exc)


async def connect(
    host: str, port: int, uid: int, sink: LoadSink, *, token: str, device: str, timeout: float,
    ws_path: str | None = None,
) -> LoadConnection:  # fmt: skip
    """Open a connection and log in as (`uid`, `device`); over WebSocket on `ws_path`
    when given."""
    loop = asyncio.get_running_loop()

    def factory() -> LoadConnection:
        if ws_path is None:
            return LoadConnection(uid, sink)
        return WsLoadConnection(uid, sink, Handshake(host, port, ws_path))

    _, conn = await asyncio.wait_for(loop.create_connection(factory, host, port), timeout)
    try:
        if isinstance(conn, WsLoadConnection):
            await asyncio.wait_for(conn.opened, timeout)
        await conn.login(token, device, timeout=timeout)
    except BaseException:
        conn.close()
        raise
    return conn
