"""WebSocket clients (`--ws-listen`): browsers, and apps that can only open a WebSocket.

A WebSocket connection is a `Connection` like any other: the same session state
machine, handlers, limits, budgets, heartbeats and kicks. This module only translates
between the two framings (docs/protocol.md, "WebSocket"): one binary WebSocket message
carries one frame body, without the 4-byte LEN that frames it on TCP.

`WsTransport` sits between the socket's transport (a bare-fd `FdTransport`, or uvloop's
for TLS) and its `Connection`: it is the socket's protocol, and the connection's
transport. The handshake and the WebSocket framing are the sans-I/O core of the
`websockets` library (`ServerProtocol`: `receive_data`, `events_received`,
`data_to_send`); the connection exists from the accept, so its LOGIN deadline covers the
handshake too.

The same listener serves the browser chat page (`gateway/web/`) at `/`: a GET of a page
is answered and the socket closed, as for any other non-WebSocket request.

Close codes: 1000 after a closing ERROR or KICK frame (the frame says why), 1001 when
the node drains or stops, 1003 for a text message, 1009 for a message over max_frame
(after an ERROR frame_too_large), 1002 for a WebSocket protocol error.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import mimetypes
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.exceptions import PayloadTooBig
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State as WsState
from websockets.server import ServerProtocol

from protocol.codec import encode, frame_bytes
from protocol.frames import Error, Ping, Pong
from protocol.ops import ErrorCode

if TYPE_CHECKING:
    from gateway.connection import Connection

WS_PATH: Final = "/ws"
FEED_SIZE: Final = 16 * 1024  # bytes given to the library at a time (WsTransport._feed)
_LEN: Final = 4
_PING: Final = encode(Ping())
_PONG: Final = encode(Pong())
_PING_BODY: Final = _PING[_LEN:]
_PING_HEAD: Final = bytes((0x80 | Opcode.BINARY, 0x80 | len(_PING_BODY)))  # FIN, masked
_PING_WIRE: Final = 2 + 4 + len(_PING_BODY)
_PONG_MESSAGE: Final = Frame(Opcode.BINARY, _PONG[_LEN:]).serialize(mask=False, extensions=[])
# The library logs every connection opened and closed at INFO: not worth a line each.
_LOG: Final = logging.getLogger("imgw.websocket")
_LOG.setLevel(logging.WARNING)
_TEXT_REFUSED: Final = "text messages are not part of the protocol: send each frame as binary"
_PAGE_TYPES: Final = {".js": "text/javascript; charset=utf-8", ".html": "text/html; charset=utf-8"}
# The chat page runs only what it was served with, and talks only to its own listener.
_PAGE_POLICY: Final = (
    "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
    "style-src 'self'; script-src 'self'; base-uri 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True, slots=True)
class WsPolicy:
    """What every connection of one listener shares.

    `origins`: the browser origins that may open a WebSocket (``scheme://host[:port]``),
    `None` for any. A request without an Origin header (not a browser) is always let in,
    and so is a page of this listener itself (its Origin names the Host it asked).
    """

    max_frame: int
    origins: frozenset[str] | None
    pages: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # path: (type, body)

    def origin_allowed(self, request: Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None or self.origins is None or origin in self.origins:
            return True
        host = request.headers.get("Host")
        return host is not None and urlsplit(origin).netloc == host


def load_pages() -> dict[str, tuple[str, bytes]]:
    """The chat page's files (`gateway/web/`), by URL path; empty where none ship."""
    pages: dict[str, tuple[str, bytes]] = {}
    root = resources.files("gateway") / "web"
    if not root.is_dir():
        return pages
    for item in root.iterdir():
        if not item.is_file() or item.name.startswith("."):
            continue
        suffix = "." + item.name.rsplit(".", 1)[-1] if "." in item.name else ""
        kind = _PAGE_TYPES.get(suffix) or mimetypes.guess_type(item.name)[0]
        pages["/" + item.name] = (kind or "application/octet-stream", item.read_bytes())
    if "/index.html" in pages:
        pages["/"] = pages["/index.html"]
    return pages


class WsTransport(asyncio.Protocol):
    """One WebSocket client: the protocol of its socket, the transport of its
    `Connection`. An open connection holds a fresh `ServerProtocol` (the handshake's
    one keeps the request and its headers alive, ~1.7 kB each); `_parts` holds the
    fragments of a message only while one arrives in pieces."""

    __slots__ = ("_close_code", "_conn", "_held", "_parts", "_policy", "_raw", "_unfed", "_ws")

    def __init__(self, conn: Connection, policy: WsPolicy) -> None:
        self._conn = conn
        self._policy = policy
        self._raw: asyncio.Transport | None = None
        self._ws = ServerProtocol(max_size=policy.max_frame, logger=_LOG)
        self._parts: list[bytes] | None = None
        self._close_code = CloseCode.NORMAL_CLOSURE
        self._held = 0  # bytes of an unfinished message (see `unfinished`)
        self._unfed: bytes | None = None  # read while the connection stopped reading

    @property
    def unfinished(self) -> int:
        """Bytes received of a message not yet complete: in the library's buffer, or
        fragments in `_parts`. Counted from the outside, as the bytes read less the
        wire size of each frame the library returned (minimal length encoding, as
        RFC 6455 requires; a client that pads lengths only hurts its own frame_timeout)."""
        return self._held

    # -- the socket's protocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = cast(asyncio.Transport, transport)
        self._conn.connection_made(cast(asyncio.Transport, self))

    def data_received(self, data: bytes) -> None:
        if (
            len(data) == _PING_WIRE
            and data[:2] == _PING_HEAD
            and not self._held
            and self._unfed is None
            and self._ws.state is WsState.OPEN
            and data[6] ^ data[2] == _PING_BODY[0]
            and data[7] ^ data[3] == _PING_BODY[1]
        ):
            # A heartbeat alone in its read, the common case: one masked 2-byte binary
            # message, unmasked here instead of by the library (whose buffer is empty:
            # nothing is held), and handed over as the TCP path's PING.
            self._conn.data_received(_PING)
            return
        if self._unfed is not None:
            self._unfed += data  # behind what waits already
        elif len(data) <= FEED_SIZE:
            self._receive(data)
        else:
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        """Give the library `data` FEED_SIZE bytes at a time. A connection that stops
        reading meanwhile (over its op budget, or held by send backpressure) keeps the
        rest until it reads again: a read of 256 KiB of small frames costs the node at
        most a slice of work past the budget, as the TCP path's decoder does a read."""
        end = len(data)
        at = 0
        while at < end:
            self._receive(data[at : at + FEED_SIZE])
            at += FEED_SIZE
            raw = self._raw
            if raw is None or raw.is_closing() or self._ws.state is not WsState.OPEN:
                return
            if at < end and not raw.is_reading():
                self._unfed = data[at:]
                return

    def _feed_unfed(self) -> None:
        data, self._unfed = self._unfed, None
        raw = self._raw
        if data is None or raw is None or raw.is_closing():
            return
        if not raw.is_reading():
            self._unfed = data  # held again before its turn came
            return
        self._feed(data)

    def _receive(self, data: bytes) -> None:
        ws = self._ws
        opened = ws.state is WsState.OPEN  # else these bytes are (part of) the request
        ws.receive_data(data)
        consumed = 0
        completed = False
        batch: list[bytes] = []  # the frames of this read, handed over as one read
        for event in ws.events_received():
            if isinstance(event, Frame):
                consumed += _wire_size(event)
                completed = completed or event.fin
                self._on_frame(event, batch)
            elif isinstance(event, Request):
                self._deliver(batch)
                self._on_request(event)
        self._deliver(batch)
        ws = self._ws  # a fresh one once the handshake is done
        if ws.parser_exc is not None:
            self._on_failure(ws.parser_exc)
            return
        self._flush()
        if opened and ws.state is WsState.OPEN:
            self._account(self._held + len(data) - consumed, completed)

    def _account(self, held: int, completed: bool) -> None:
        """The node's rules for unfinished frames, as for TCP (Connection)."""
        held = max(0, held)
        before = self._held
        if held == before and not (held and completed):
            return
        self._held = held
        conn = self._conn
        if held:
            conn.last_rx = conn.node.loop.time()
            conn.unfinished_frame(held - before, completed or not before)
        else:
            conn.frame_finished(before)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._unfed = None
        if self._held:
            self._conn.node.partial_bytes -= self._held
            self._held = 0
        self._parts = None
        self._conn.connection_lost(exc)

    def pause_writing(self) -> None:
        self._conn.pause_writing()

    def resume_writing(self) -> None:
        self._conn.resume_writing()

    # -- inbound ------------------------------------------------------------------------

    def _on_request(self, request: Request) -> None:
        ws = self._ws
        path = request.path.split("?", 1)[0]
        if path != WS_PATH:
            ws.send_response(self._page(path))
            self._flush()  # and close: one request per connection
            return
        if not self._policy.origin_allowed(request):
            response = ws.reject(403, "Origin not allowed: see --ws-origins\n")
        else:
            response = ws.accept(request)
        ws.send_response(response)
        if response.status_code != 101:
            self._flush()  # and close
            return
        pipelined = [e for e in ws.events_received() if isinstance(e, Frame)]
        self._flush()
        self._ws = ServerProtocol(state=WsState.OPEN, max_size=self._policy.max_frame, logger=_LOG)
        batch: list[bytes] = []
        for frame in pipelined:  # sent before our answer: a client that did not wait
            self._on_frame(frame, batch)
        self._deliver(batch)

    def _page(self, path: str) -> Response:
        page = self._policy.pages.get(path)
        if page is None:
            return self._ws.reject(404, f"Not found. WebSocket clients connect to {WS_PATH}\n")
        kind, body = page
        headers = Headers(
            [
                ("Date", email.utils.formatdate(usegmt=True)),
                ("Connection", "close"),
                ("Content-Length", str(len(body))),
                ("Content-Type", kind),
                ("Cache-Control", "no-cache"),
                ("X-Content-Type-Options", "nosniff"),
                ("Content-Security-Policy", _PAGE_POLICY),
            ]
        )
        return Response(200, "OK", headers, body)

    def _deliver(self, batch: list[bytes]) -> None:
        """Hand the frames of one read to the connection in one call, as TCP's read would
        carry them: the connection's rules for several frames in a read (PINGs that
        draw on the budget, decoding a batch at a time) apply as they do there."""
        if batch:
            data = batch[0] if len(batch) == 1 else b"".join(batch)
            batch.clear()
            self._conn.data_received(data)

    def _on_frame(self, frame: Frame, batch: list[bytes]) -> None:
        opcode = frame.opcode
        if opcode is Opcode.BINARY or opcode is Opcode.CONT:
            if not frame.fin:
                parts = self._parts
                if parts is None:
                    parts = self._parts = []
                parts.append(bytes(frame.data))
                return
            body = frame.data
            if self._parts is not None:
                self._parts.append(bytes(body))
                body = b"".join(self._parts)
                self._parts = None
            if body:
                batch.append(frame_bytes(bytes(body)))
            else:
                self._deliver(batch)
                self._fail_frame(ErrorCode.BAD_FRAME, "empty message: a frame body is required")
        elif opcode is Opcode.TEXT:
            self._deliver(batch)
            self._close_code = CloseCode.UNSUPPORTED_DATA
            self._fail_frame(ErrorCode.BAD_FRAME, _TEXT_REFUSED)
        # PING is answered by the library, PONG needs nothing, CLOSE is answered by the
        # library and ends the connection in data_received.

    def _fail_frame(self, code: ErrorCode, text: str) -> None:
        self._conn.fail(code, text)

    def _on_failure(self, exc: Exception) -> None:
        """The library failed the connection (a close frame is queued): a message over
        max_frame is told with the protocol's own ERROR first."""
        if isinstance(exc, PayloadTooBig):
            error = encode(Error(0, int(ErrorCode.FRAME_TOO_LARGE), str(exc)))
            message = Frame(Opcode.BINARY, error[_LEN:]).serialize(mask=False, extensions=[])
            raw = self._raw
            if raw is not None and not raw.is_closing():
                raw.write(message)
        self._flush()
        self._raw_close()
        self._conn.close()

    # -- the connection's transport -----------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """`data` is one or more whole frames (LEN + body): one message each."""
        ws = self._ws
        if ws.state is not WsState.OPEN:
            return  # before the handshake's answer, or closing: nothing more goes
        if data == _PONG and self._raw is not None:
            self._raw.write(_PONG_MESSAGE)  # the answer to a heartbeat, made once
            return
        view = memoryview(data)
        end = len(view)
        at = 0
        while at < end:
            size = int.from_bytes(view[at : at + _LEN], "big")
            at += _LEN
            ws.send_binary(view[at : at + size])
            at += size
        self._flush()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def close(self) -> None:
        """A close frame after what was written (1001 while the node drains), then the
        socket: the frame before it (ERROR or KICK) says why."""
        ws = self._ws
        if ws.state is WsState.OPEN:
            code = self._close_code
            if code == CloseCode.NORMAL_CLOSURE and not self._conn.node.accepting:
                code = CloseCode.GOING_AWAY
            ws.send_close(code)
            self._flush()
        self._raw_close()

    def abort(self) -> None:
        if self._raw is not None:
            self._raw.abort()

    def can_write_eof(self) -> bool:
        return False  # the close frame ends it; a bare fd's transport then lingers

    def drop_unsent(self) -> None:
        """As the socket's transport can (each of its writes is whole messages)."""
        drop = getattr(self._raw, "drop_unsent", None)
        if drop is not None:
            drop()

    def get_write_buffer_size(self) -> int:
        return 0 if self._raw is None else self._raw.get_write_buffer_size()

    def is_closing(self) -> bool:
        return self._raw is None or self._raw.is_closing()

    def is_reading(self) -> bool:
        return self._raw is not None and self._raw.is_reading()

    def pause_reading(self) -> None:
        if self._raw is not None:
            self._raw.pause_reading()

    def resume_reading(self) -> None:
        if self._raw is not None:
            self._raw.resume_reading()
            if self._unfed is not None:
                self._conn.node.loop.call_soon(self._feed_unfed)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default if self._raw is None else self._raw.get_extra_info(name, default)

    # -- helpers ------------------------------------------------------------------------

    def _flush(self) -> None:
        """Write what the library has to send; b"" among it is its "close the socket
        now" (after an HTTP answer, a close handshake, or a request it cannot parse)."""
        chunks = self._ws.data_to_send()
        raw = self._raw
        if not chunks or raw is None or raw.is_closing():
            return
        if chunks[-1]:
            raw.writelines(chunks)
            return
        if data := [c for c in chunks if c]:
            raw.writelines(data)
        raw.close()  # after what was written
        self._conn.close()

    def _raw_close(self) -> None:
        raw = self._raw
        if raw is not None and not raw.is_closing():
            raw.close()


def _wire_size(frame: Frame) -> int:
    """The bytes a client's (masked) frame took on the wire."""
    n = len(frame.data)
    return 6 + n + (0 if n < 126 else 2 if n < 65536 else 8)
