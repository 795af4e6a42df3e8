"""Gateway addresses and one logged-in TCP connection (`Link`)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Sequence
from typing import Final

from gateway.client.errors import ClientError, ConnectionLost
from gateway.hostport import Address as Address
from gateway.hostport import split_host_port
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.errors import FrameError
from protocol.frames import Error, Frame, Invalid, Kick, Login, LoginOk

READ_CHUNK: Final = 65_536
MAX_INBOUND_FRAME: Final = 64 << 20
"""The client's limit on a server frame: PULL pages may exceed the server's max_frame."""


def parse_addresses(spec: str | Sequence[Address]) -> list[Address]:
    """``"host:port"``, ``"h1:p1,h2:p2"`` (``[v6]:port`` too) or (host, port) pairs."""
    out: list[Address] = []
    if isinstance(spec, str):
        out = [split_host_port(part) for part in filter(None, map(str.strip, spec.split(",")))]
    else:
        out = [(str(host), int(port)) for host, port in spec]
    if not out:
        raise ValueError("no gateway address given")
    return out


class Link:
    """One TCP connection after its LOGIN_OK."""

    __slots__ = (
        "addr", "backlog", "dead", "decoder", "kick", "last_rx", "login_ok", "reader", "writer",
    )  # fmt: skip

    def __init__(
        self,
        addr: Address,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
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
    addr: Address, login: Login, tls: ssl.SSLContext | None = None, *, then: bytes = b""
) -> Link:
    """Connect and LOGIN (bound it with asyncio.timeout). `then`: encoded requests sent
    in the LOGIN's write, right behind it (docs/protocol.md allows it: the server handles
    them once the LOGIN succeeded and answers the first in LOGIN_OK's write); their
    answers come after LOGIN_OK, in the link's `backlog` or later.

    Raises ClientError with the server's ERROR (auth_failed...), ConnectionLost if the
    server closes first, OSError if it cannot be reached.
    """
    reader, writer = await asyncio.open_connection(*addr, ssl=tls)
    try:
        decoder = FrameDecoder(max_frame=MAX_INBOUND_FRAME, side=Side.CLIENT)
        writer.write(encode(login) + then)
        frames: list[Frame | Invalid] = []
        while not frames:
            data = await reader.read(READ_CHUNK)
            if not data:
                raise ConnectionLost(f"{addr[0]}:{addr[1]} closed the connection at login")
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
