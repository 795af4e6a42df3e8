"""Gateway endpoints and one logged-in connection (`Link`): TCP to a (host, port)
address, or WebSocket to a ``ws://`` or ``wss://`` URL (gateway/client/wsstream.py).

When TLS and the server disagree, `open_link` says how (`TlsMismatch`) instead of
passing on the TLS library's words: a certificate that names other hosts ("the
certificate does not name 127.0.0.1 (it names localhost)": it reads the names from a
second, unverified handshake), a TLS client on a plain port, a plain client on a TLS
port (a plain LOGIN closed without an answer: a TLS handshake with the port tells).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Sequence
from typing import Final, Protocol
from urllib.parse import urlsplit

from gateway.client.errors import ClientError, ConnectionLost
from gateway.client.wsstream import WsStream, check_ws_url, is_ws_url
from gateway.net.certinfo import describe as describe_names
from gateway.net.certinfo import parse_der
from gateway.net.hostport import Address as Address
from gateway.net.hostport import split_host_port
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.errors import FrameError
from protocol.frames import Error, Frame, Invalid, Kick, Login, LoginOk

READ_CHUNK: Final = 65_536
MAX_INBOUND_FRAME: Final = 64 << 20
"""The client's limit on a server frame: PULL pages may exceed the server's max_frame."""
PROBE_TIMEOUT_S: Final = 2.0  # the second handshake that finds out what a TLS port serves
# A plain port that closes at login (a node at its connection cap) is asked whether it
# speaks TLS at most this often, so reconnecting clients do not double its load.
PROBE_EVERY_S: Final = 60.0
_probed: dict[Address, float] = {}
# OpenSSL's verify codes for a certificate that does not name the host connected to
_NAME_MISMATCH: Final = frozenset({62, 64})  # X509_V_ERR_HOSTNAME_MISMATCH, IP_ADDRESS_
# ... and for one whose issuer is not trusted (self-signed, unknown CA)
_UNTRUSTED: Final = frozenset({18, 19, 20, 21})


class TlsMismatch(ConnectionLost):
    """TLS and the server disagree (the text says how); connecting again will not help."""


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
    try:
        if isinstance(addr, str):
            reader = writer = await WsStream.open(addr, tls=tls, max_size=MAX_INBOUND_FRAME)
        else:
            reader, writer = await asyncio.open_connection(*addr, ssl=tls)
    except ssl.SSLError as e:
        problem = await _tls_problem(addr, e)
        if problem is None:
            raise
        raise problem from e
    try:
        decoder = FrameDecoder(max_frame=MAX_INBOUND_FRAME, side=Side.CLIENT)
        writer.write(encode(login) + then)
        frames: list[Frame | Invalid] = []
        while not frames:
            data = await reader.read(READ_CHUNK)
            if not data:
                if tls is None and await speaks_tls(addr):
                    raise TlsMismatch(
                        f"{describe(addr)} closed the connection at login: this port "
                        "speaks TLS: add --tls"
                    )
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


def _host_port(addr: Endpoint) -> tuple[str, int]:
    if isinstance(addr, str):
        url = urlsplit(addr)
        return url.hostname or "", url.port or (443 if url.scheme == "wss" else 80)
    return addr


async def _tls_problem(addr: Endpoint, error: ssl.SSLError) -> TlsMismatch | None:
    """What a TLS error at connect means, in words; None: the error says it best."""
    host, _ = _host_port(addr)
    if isinstance(error, ssl.SSLCertVerificationError):
        if error.verify_code in _NAME_MISMATCH:
            names = await served_names(addr)
            seen = f" (it names {names})" if names else ""
            return TlsMismatch(f"the certificate does not name {host}{seen}")
        if error.verify_code in _UNTRUSTED:
            return TlsMismatch(
                f"the certificate is not trusted ({error.verify_message}; "
                "CERTIFICATE_VERIFY_FAILED): trust it, or the CA that signed it, with --ca PEM"
            )
    if getattr(error, "reason", None) == "WRONG_VERSION_NUMBER":
        return TlsMismatch(
            f"{describe(addr)} answered in plain text: this port does not speak TLS; drop --tls"
        )
    return None


def _unverified() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def served_names(addr: Endpoint) -> str:
    """The names in the certificate `addr` serves ("localhost, 127.0.0.1"), from a
    handshake that verifies nothing (only to say so in an error); "" when that fails."""
    host, port = _host_port(addr)
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            _, writer = await asyncio.open_connection(
                host, port, ssl=_unverified(), server_hostname=host
            )
    except (OSError, TimeoutError):
        return ""
    try:
        sslobj = writer.get_extra_info("ssl_object")
        der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
        return describe_names(parse_der(der)) if der else ""
    except ValueError:
        return ""
    finally:
        writer.transport.abort()


async def speaks_tls(addr: Endpoint) -> bool:
    """Whether `addr` completes a TLS handshake (a plain client was shut out of a TLS
    port); asked after a LOGIN closed without an answer, at most every PROBE_EVERY_S
    per address (False meanwhile)."""
    if isinstance(addr, str):
        return False
    now = time.monotonic()
    if now - _probed.get(addr, -PROBE_EVERY_S) < PROBE_EVERY_S:
        return False
    _probed[addr] = now
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            _, writer = await asyncio.open_connection(*addr, ssl=_unverified())
    except (OSError, TimeoutError):
        return False
    writer.transport.abort()
    return True
