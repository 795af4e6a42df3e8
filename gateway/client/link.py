"""Gateway endpoints and one logged-in connection (`Link`): TCP to a (host, port)
address, or WebSocket to a ``ws://`` or ``wss://`` URL (gateway/client/wsstream.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from typing import Final, Protocol

from gateway.client.errors import ClientError, ConnectionLost
from gateway.client.wsstream import WsStream, check_ws_url, is_ws_url
from gateway.hostport import Address as Address
from gateway.hostport import split_host_port
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.errors import FrameError
from protocol.frames import Error, Frame, Invalid, Kick, Login, LoginOk

READ_CHUNK: Final = 65_536
MAX_INBOUND_FRAME: Final = 64 << 20
"""The client's limit on a server frame: PULL pages may exceed the server's max_frame."""


Endpoint = Address | str
"""A TCP (host, port), or a WebSocket URL (``ws://host:port/ws``, ``wss://...``)."""


class StreamIn(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class StreamOut(Protocol):
    @property
    def transport(self) -> asyncio.WriteTransport: ...
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    async def wait_closed(self) -> None: ...


def parse_addresses(spec: str | Sequence[Endpoint]) -> list[Endpoint]:
    """``"host:port"``, ``"h1:p1,h2:p2"`` (``[v6]:port`` too), ``ws://host:port/ws``
    or ``wss://`` URLs (mixed as one likes), or (host, port) pairs."""
    out: list[Endpoint] = []
    parts = list(filter(None, map(str.strip, spec.split(",")))) if isinstance(spec, str) else spec
    for part in parts:
        if isinstance(part, str):
            if is_ws_url(part):
                check_ws_url(part)
                out.append(part)
            else:
                out.append(split_host_port(part))
        else:
            host, port = part
            out.append((str(host), int(port)))
    if not out:
        raise ValueError("no gateway address given")
    return out


def describe(endpoint: Endpoint) -> str:
    return endpoint if isinstance(endpoint, str) else f"{endpoint[0]}:{endpoint[1]}"


class Link:
    """One connection after its LOGIN_OK."""

    __slots__ = (
        "addr", "backlog", "dead", "decoder", "kick", "last_rx", "login_ok", "reader", "writer",
    )  # fmt: skip

    def __init__(
        self,
        addr: Endpoint,
        reader: StreamIn,
        writer: StreamOut,
        decoder: FrameDecoder,
        login_ok: LoginOk,
        backlog: list[Frame | Invalid],
    ) -> None:
        self.addr = addr
        self.reader = reader
        self.writer = writer
        self.decoder = decoder
        self.login_ok = login_ok
        self.backlog = backlog  # frames that came in the same read as LOGIN_OK
        self.kick: Kick | None = None  # the KICK that preceded the close, if any
        self.last_rx = 0.0
        self.dead = False

    def abort(self) -> None:
        self.writer.transport.abort()

    async def wait_closed(self) -> None:
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


async def open_link(
    addr: Endpoint, login: Login, tls: ssl.SSLContext | None = None, *, then: bytes = b""
) -> Link:
    """Connect and LOGIN (bound it with asyncio.timeout). `then`: encoded requests sent
    in the LOGIN's write, right behind it (docs/protocol.md allows it: the server handles
    them once the LOGIN succeeded and answers the first in LOGIN_OK's write); their
    answers come after LOGIN_OK, in the link's `backlog` or later.

    Raises ClientError with the server's ERROR (auth_failed...), ConnectionLost if the
    server closes first, OSError if it cannot be reached.
    """
    reader: StreamIn
    writer: StreamOut
    if isinstance(addr, str):
        reader = writer = await WsStream.open(addr, tls=tls, max_size=MAX_INBOUND_FRAME)
    else:
        reader, writer = await asyncio.open_connection(*addr, ssl=tls)
    try:
        decoder = FrameDecoder(max_frame=MAX_INBOUND_FRAME, side=Side.CLIENT)
        writer.write(encode(login) + then)
        frames: list[Frame | Invalid] = []
        while not frames:
            data = await reader.read(READ_CHUNK)
            if not data:
                raise ConnectionLost(f"{describe(addr)} closed the connection at login")
            try:
                frames = decoder.feed(data)
            except FrameError as e:
                raise ClientError(0, f"bad frame from the server: {e}") from None
        first = frames[0]
        if isinstance(first, Error):
            raise ClientError(first.code, first.text)
        if not isinstance(first, LoginOk):
            raise ClientError(0, f"expected LOGIN_OK, got {type(first).__name__}")
    except BaseException:
        writer.transport.abort()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        raise
    return Link(addr, reader, writer, decoder, first, frames[1:])
