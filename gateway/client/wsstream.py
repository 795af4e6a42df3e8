"""A WebSocket connection to a gateway (`ws://host:port/ws`, `wss://`) that reads and
writes the TCP framing, so that a client speaks one framing whatever carries it.

docs/protocol.md, "WebSocket": each binary message is one frame body. `read` returns the
messages received so far, each with its LEN prepended (several in one read, as TCP
would); `write` takes whole frames (LEN + body, one or several) and sends each body as
one message, at once and in order. The handshake and the framing are the sans-I/O
core of the `websockets` library (`ClientProtocol`) on an asyncio transport; there is
no compression and no WebSocket-level keepalive (the protocol's PING is the heartbeat).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from typing import Final

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidURI
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

from protocol.codec import frame_bytes

WS_SCHEMES: Final = ("ws://", "wss://")
_LEN: Final = 4
_LOG: Final = logging.getLogger("imgw.client.websocket")
_LOG.setLevel(logging.WARNING)


def is_ws_url(spec: str) -> bool:
    return spec.startswith(WS_SCHEMES)


def check_ws_url(url: str) -> None:
    """Raise ValueError unless `url` is a usable ws:// or wss:// URL."""
    try:
        parse_uri(url)
    except InvalidURI as e:
        raise ValueError(str(e)) from None


class WsStream(asyncio.Protocol):
    """Both halves of a stream over one WebSocket: `read`; `write`, `drain`, `close`,
    `wait_closed` and `transport` (whose `abort` drops the connection)."""

    def __init__(self, url: str, max_size: int) -> None:
        self._ws = ClientProtocol(parse_uri(url), max_size=max_size, logger=_LOG)
        self._transport: asyncio.Transport | None = None
        self._messages: deque[bytes] = deque()
        self._parts: list[bytes] = []
        self._loop = asyncio.get_running_loop()
        self._opened: asyncio.Future[None] = self._loop.create_future()
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self._readable: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None  # while the transport is full

    @classmethod
    async def open(cls, url: str, *, tls: ssl.SSLContext | None, max_size: int) -> WsStream:
        """Connect and complete the handshake (bound it with asyncio.timeout). Raises
        OSError when the gateway cannot be reached or refuses the handshake."""
        uri = parse_uri(url)
        if uri.secure and tls is None:
            tls = ssl.create_default_context()
        stream = cls(url, max_size)
        loop = asyncio.get_running_loop()
        await loop.create_connection(
            lambda: stream, uri.host, uri.port, ssl=tls if uri.secure else None
        )
        ws = stream._ws
        ws.send_request(ws.connect())
        stream._flush()
        try:
            await stream._opened
        except BaseException:
            stream.abort()
            raise
        return stream

    # -- asyncio.Protocol ---------------------------------------------------------------

    @property
    def transport(self) -> asyncio.Transport:
        assert self._transport is not None, "not connected"
        return self._transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        ws = self._ws
        ws.receive_data(data)
        for event in ws.events_received():
            if isinstance(event, Frame):
                self._on_frame(event)
            elif isinstance(event, Response) and not self._opened.done():
                if ws.handshake_exc is None:
                    self._opened.set_result(None)
                else:
                    self._opened.set_exception(
                        ConnectionRefusedError(f"WebSocket handshake failed: {ws.handshake_exc}")
                    )
        self._flush()
        if self._messages:
            self._wake_reader()

    def eof_received(self) -> bool | None:
        self._ws.receive_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._opened.done():
            self._opened.set_exception(ConnectionResetError("closed during the handshake"))
        if not self._lost.done():
            self._lost.set_result(None)
        self._wake_reader()
        self.resume_writing()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        waiter, self._writable = self._writable, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the stream ---------------------------------------------------------------------

    async def read(self, n: int = -1) -> bytes:
        """The messages received so far as frames (LEN + body each), waiting for one;
        b"" once the connection is closed."""
        while not self._messages:
            if self._lost.done():
                return b""
            self._readable = self._loop.create_future()
            try:
                await self._readable
            finally:
                self._readable = None
        out = b"".join(self._messages)
        self._messages.clear()
        return out

    def write(self, data: bytes) -> None:
        ws = self._ws
        if ws.state is not State.OPEN:
            return
        view = memoryview(data)
        at = 0
        while at < len(view):
            size = int.from_bytes(view[at : at + _LEN], "big")
            ws.send_binary(view[at + _LEN : at + _LEN + size])
            at += _LEN + size
        self._flush()

    async def drain(self) -> None:
        if self._lost.done():
            raise ConnectionResetError("the WebSocket connection is closed")
        if self._writable is not None:
            await self._writable

    def close(self) -> None:
        ws = self._ws
        if ws.state is State.OPEN:
            ws.send_close(CloseCode.NORMAL_CLOSURE)
            self._flush()
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    async def wait_closed(self) -> None:
        await self._lost

    # -- helpers --------------------------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        if frame.opcode not in (Opcode.BINARY, Opcode.CONT, Opcode.TEXT):
            return  # control frames: the library answers them
        self._parts.append(bytes(frame.data))
        if frame.fin:
            self._messages.append(frame_bytes(b"".join(self._parts)))
            self._parts.clear()

    def _flush(self) -> None:
        transport = self._transport
        chunks = self._ws.data_to_send()
        if transport is None or transport.is_closing() or not chunks:
            return
        if data := [c for c in chunks if c]:
            transport.writelines(data)
        if not chunks[-1]:  # b"": the library's "close the socket now"
            transport.close()

    def _wake_reader(self) -> None:
        waiter = self._readable
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
