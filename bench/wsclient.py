"""The client side of the gateway's WebSocket listener, for the load generators: light
enough for 15,000 connections a process.

Each binary WebSocket message carries one protocol frame body (the msgpack array) with
no LEN prefix, one frame per message both ways (docs/protocol.md). The opening handshake
is the `websockets` library's sans-I/O `ClientProtocol` (`Handshake`): it writes the
request and checks the server's 101 (Sec-WebSocket-Accept, no extension or subprotocol
it did not ask for). Once the connection is open that object is dropped, and frames are
written (`ClientFramer`) and read (`read_frames`) here.

Why not the library for the frames too: a `ClientProtocol` kept open costs 3,578 bytes
per connection (tracemalloc) and a PING round through it (send_binary, data_to_send,
receive_data of the PONG, events_received) 5.9 µs of CPU, against none and 0.05 µs here
(`python -m bench.ws_probe --client-cost`; docs/decisions.md, "WebSocket on the
`websockets` library's sans-I/O core"). At 15,000 connections that is 54 MB more per
generator, and on the bench's 2-core machine every µs a generator spends is taken from
the gateway under test. What a generator writes after the handshake is four kinds of
frame (LOGIN, PING, SYNC, SEND) and what it reads is unmasked binary frames and the rare
close: both are a few lines.

Masking: every frame a process writes uses that process's one masking key (random), so
a PING is one constant byte string. RFC 6455 wants a fresh unpredictable key per frame
so that a script in a browser cannot steer the bytes a proxy sees; the bench has no
browser and no proxy, and a server unmasks every frame the same whatever its key.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Final
from urllib.parse import urlsplit

import msgpack

from protocol.codec import encode_body
from protocol.frames import Ping, Pong

WS_PATH: Final = "/ws"  # the gateway's WebSocket path
OP_CONT: Final = 0x0
OP_TEXT: Final = 0x1
OP_BINARY: Final = 0x2
OP_CLOSE: Final = 0x8
OP_PING: Final = 0x9
OP_PONG: Final = 0xA
_FIN: Final = 0x80
_MASKED: Final = 0x80
_U16: Final = struct.Struct(">H")
_U64: Final = struct.Struct(">Q")
MAX_FRAME: Final = 1 << 20  # a server frame longer than this is refused (the gateway's
# largest is max_frame, 64 KiB by default)

PING_BODY: Final = encode_body(Ping())
PONG_BODY: Final = encode_body(Pong())


class WsError(Exception):
    """The server broke the WebSocket framing (or refused the handshake): the connection
    is aborted."""


def parse_ws_addr(addr: str) -> tuple[str, int, str]:
    """(host, port, path) of `ws://HOST:PORT/PATH` or of `HOST:PORT` (path /ws)."""
    from gateway.net.hostport import split_host_port

    if "://" not in addr:
        host, port = split_host_port(addr, default_host="127.0.0.1")
        return host, port, WS_PATH
    parts = urlsplit(addr)
    if parts.scheme != "ws":
        raise ValueError(f"{addr!r}: only ws:// (the bench speaks no TLS over WebSocket)")
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"{addr!r}: give ws://HOST:PORT/PATH")
    return parts.hostname, parts.port, parts.path or WS_PATH


class Handshake:
    """The opening handshake of one connection, on the library's `ClientProtocol`:
    `request()` is what to write first; `receive(data)` takes what the server sends until
    the connection is open."""

    __slots__ = ("_proto",)

    def __init__(self, host: str, port: int, path: str = WS_PATH) -> None:
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        self._proto = ClientProtocol(parse_uri(f"ws://{host}:{port}{path}"))
        self._proto.send_request(self._proto.connect())

    def request(self) -> bytes:
        return b"".join(self._proto.data_to_send())

    def receive(self, data: bytes) -> list[tuple[int, bytes]] | None:
        """Feed the server's bytes. None while its answer is incomplete; once the
        connection is open, the frames that came right behind the 101 as (opcode,
        payload) (none from the gateway: it says nothing before LOGIN, so no frame can
        be left half-read inside the library). Raises WsError if the server refused."""
        from websockets.frames import Frame
        from websockets.protocol import OPEN

        proto = self._proto
        proto.receive_data(data)
        events = proto.events_received()
        if proto.handshake_exc is not None:
            raise WsError(f"handshake refused: {proto.handshake_exc}")
        if proto.state is not OPEN:
            return None
        return [(int(e.opcode), bytes(e.data)) for e in events if isinstance(e, Frame)]


def _mask(data: bytes, key: bytes) -> bytes:
    n = len(data)
    if n == 0:
        return data
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(keys, "little")).to_bytes(n, "little")


class ClientFramer:
    """Masked client frames, all with one key (see the module's docstring)."""

    __slots__ = ("key", "ping")

    def __init__(self, key: bytes | None = None) -> None:
        key = key or os.urandom(4)
        self.key = key if key != b"\0\0\0\0" else b"\1\2\3\4"
        self.ping = self.frame(PING_BODY)

    def frame(self, payload: bytes, opcode: int = OP_BINARY) -> bytes:
        """One whole masked frame (FIN set) of `payload`."""
        n = len(payload)
        if n < 126:
            head = bytes((_FIN | opcode, _MASKED | n))
        elif n < 1 << 16:
            head = bytes((_FIN | opcode, _MASKED | 126)) + _U16.pack(n)
        else:
            head = bytes((_FIN | opcode, _MASKED | 127)) + _U64.pack(n)
        return head + self.key + _mask(payload, self.key)

    def of_framed(self, framed: bytes) -> bytes:
        """The WebSocket message of a LEN-prefixed protocol frame (`protocol.codec.
        encode`'s output): its body, without the LEN."""
        return self.frame(framed[4:])

    def close(self, payload: bytes = b"") -> bytes:
        """A close frame answering the server's (its status code echoed)."""
        return self.frame(payload[:2], OP_CLOSE)


def read_frames(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The complete server frames at the start of `buf` as (opcode, payload), and the
    bytes left over. Raises WsError on what a server must not send: a masked frame,
    RSV bits (no extension was agreed), a fragmented message (the gateway sends one frame
    per message), text, or a frame over MAX_FRAME."""
    out: list[tuple[int, bytes]] = []
    at, end = 0, len(buf)
    while end - at >= 2:
        b0, b1 = buf[at], buf[at + 1]
        if b0 & 0x70 or b1 & _MASKED:
            raise WsError(f"bad server frame header {b0:#04x} {b1:#04x}")
        opcode = b0 & 0x0F
        if not b0 & _FIN or opcode in (OP_CONT, OP_TEXT):
            raise WsError(f"unexpected server frame: opcode {opcode}, fin {bool(b0 & _FIN)}")
        n, head = b1 & 0x7F, 2
        if n == 126:
            if end - at < 4:
                break
            n, head = _U16.unpack_from(buf, at + 2)[0], 4
        elif n == 127:
            if end - at < 10:
                break
            n, head = _U64.unpack_from(buf, at + 2)[0], 10
        if n > MAX_FRAME:
            raise WsError(f"server frame of {n} bytes")
        if end - at < head + n:
            break
        out.append((opcode, buf[at + head : at + head + n]))
        at += head + n
    return out, buf[at:] if at else buf


class WsWire:
    """What a generator process writes and reads over WebSocket, for `bench.holders`:
    `wrap` turns a LEN-prefixed frame into its message; `split` parses the bytes read
    into protocol frames (each its msgpack array), the bytes left over, and what to
    write back (the answer to a close or a ping)."""

    __slots__ = ("framer", "ping", "pong")

    def __init__(self) -> None:
        import websockets.client  # noqa: F401  # now: not in the RSS of the connections

        self.framer = ClientFramer()
        self.ping = self.framer.ping
        self.pong = bytes((_FIN | OP_BINARY, len(PONG_BODY))) + PONG_BODY  # as it arrives

    def wrap(self, framed: bytes) -> bytes:
        return self.framer.of_framed(framed)

    def split(self, buf: bytes) -> tuple[list[list[Any]], bytes, bytes]:
        ws, rest = read_frames(buf)
        frames, reply = self.messages(ws)
        return frames, rest, reply

    def messages(self, ws: list[tuple[int, bytes]]) -> tuple[list[list[Any]], bytes]:
        """The protocol frames among WebSocket frames `ws`, and what to write back."""
        frames: list[list[Any]] = []
        reply = b""
        for opcode, payload in ws:
            if opcode == OP_BINARY:
                frames.append(msgpack.unpackb(payload))
            else:
                reply += control_reply(self.framer, opcode, payload)
        return frames, reply


def control_reply(framer: ClientFramer, opcode: int, payload: bytes) -> bytes:
    """What a client writes back to a control frame: a close is answered with a close
    (the server then closes the socket), a ping with a pong; nothing to the rest."""
    if opcode == OP_CLOSE:
        return framer.close(payload)
    if opcode == OP_PING:
        return framer.frame(payload, OP_PONG)
    return b""
