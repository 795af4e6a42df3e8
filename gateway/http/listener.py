"""An HTTP/1.1 listener on aiohttp's server (keep-alive, pipelining, chunked request
bodies), with the limits a port that anyone may reach needs:

- at most `max_connections` open at once (a connection past it is answered 503 and
  closed), and at most `per_address` from one client address (429; 0: no cap);
- a request's head (its line and headers) must arrive within `head_timeout_s` of its
  first byte, else the connection is closed (a peer that trickles headers holds no slot
  for long); an idle keep-alive connection is closed after `idle_timeout_s`;
- lines and header fields of at most `max_field` bytes, at most `max_headers` headers;
- bodies: `read_body` takes one up to a byte limit and a deadline (413, 408);
- a connection closed while its peer reads nothing (its write buffer not empty) is
  aborted, so that it gives its slot back at once.

aiohttp answers an HTTP/1.1 request without a `Host` header 400, as RFC 9112 asks.

Every error the listener answers itself (a malformed request, the caps above) is written
by the listener's `error_page`, so that a port whose answers are JSON answers JSON
everywhere. Malformed requests are logged at most once a second (they may come from
anyone who reaches the port, before any token is checked), without a traceback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog
from aiohttp import web

from gateway.logs import Throttle

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
ErrorPage = Callable[[int, str], web.Response]

CHUNK: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = 1024
    per_address: int = 0  # 0: no cap per client address
    head_timeout_s: float = 10.0
    idle_timeout_s: float = 15.0
    max_field: int = 16 * 1024  # the request line, and each header line
    max_headers: int = 64


class HttpError(Exception):
    """Answer the request with this status and text (through the listener's error_page);
    the connection stays open unless `close`."""

    def __init__(
        self, status: int, text: str, *, headers: dict[str, str] | None = None, close: bool = False
    ) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.headers = headers or {}
        self.close = close


def text_page(status: int, text: str) -> web.Response:
    """An error as text/plain, one line."""
    return web.Response(status=status, text=f"{text}\n", content_type="text/plain")


async def read_body(request: web.BaseRequest, limit: int, deadline_s: float) -> bytes:
    """The request's whole body (Content-Length or chunked), at most `limit` bytes, all
    within `deadline_s`; else HttpError 413 or 408, answered with `Connection: close`
    (aiohttp discards what is left of the body for at most its lingering time, 2 s)."""
    length = request.content_length
    if length is not None and length > limit:
        raise HttpError(413, f"the body is over {limit} bytes", close=True)
    chunks: list[bytes] = []
    got = 0
    try:
        async with asyncio.timeout(deadline_s):
            while chunk := await request.content.read(CHUNK):
                got += len(chunk)
                if got > limit:
                    raise HttpError(413, f"the body is over {limit} bytes", close=True)
                chunks.append(chunk)
    except TimeoutError:
        late = f"the body did not arrive within {deadline_s:g} s"
        raise HttpError(408, late, close=True) from None
    return b"".join(chunks)


class _Connection(web.RequestHandler):
    """One client connection: aiohttp's request handler, counted against the caps and
    watched for a head that takes too long."""

    def __init__(self, manager: web.Server, listener: HttpListener, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._listener = listener
        self._address = ""
        self._counted = False
        self._busy = False  # a request of this connection is being handled
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self._address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        status = self._listener.admit(self._address)
        if status:
            assert isinstance(transport, asyncio.Transport)
            text = "too many connections; retry later"
            self._write_refusal(transport, self._listener.error_page(status, text))
            return
        self._counted = True

    def _write_refusal(self, transport: asyncio.Transport, page: web.Response) -> None:
        body = page.body if isinstance(page.body, bytes) else b""
        head = [f"HTTP/1.1 {page.status} {page.reason}"]
        head += [f"{k}: {v}" for k, v in page.headers.items() if k != "Content-Length"]
        head += [f"Content-Length: {len(body)}", "Retry-After: 1", "Connection: close"]
        transport.write("\r\n".join(head).encode() + b"\r\n\r\n" + body)
        self.force_close()
        transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._counted = False
            self._listener.release(self._address)
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data and not self._busy and self._head_timer is None:
            self._head_timer = self._loop.call_later(
                self._listener.limits.head_timeout_s, self._head_late
            )
        super().data_received(data)

    def force_close(self) -> None:
        """Close now; a peer that reads nothing would hold a graceful close (and its
        slot) until its write buffer drained, so such a connection is aborted."""
        super().force_close()
        transport = self.transport
        if transport is not None and transport.get_write_buffer_size():
            transport.abort()

    def request_began(self) -> None:
        self._busy = True
        self._cancel_head_timer()

    def request_ended(self) -> None:
        self._busy = False

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._busy:
            return
        self._listener.refused(self._address, "request head too slow")
        self.force_close()
        if self.transport is not None:
            self.transport.abort()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (or a bug past every handler's own
        catching): the listener's page, never a traceback."""
        if status >= 500:
            self._listener.failed(exc)
            text = "internal error"
        else:
            text = message or "bad request"
            self._listener.refused(self._address, text)
        if request.writer.output_size > 0:
            raise ConnectionError("the response has begun; no error page can follow")
        page = self._listener.error_page(status, text)
        page.force_close()
        return page

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's own error log: handled by handle_error (throttled, no traceback)."""


class HttpListener:
    """One listening socket serving `handler` with `limits`."""

    def __init__(
        self,
        handler: Handler,
        host: str,
        port: int,
        *,
        name: str,
        limits: Limits = Limits(),
        error_page: ErrorPage = text_page,
        reuse_port: bool = False,
        log: Any = None,
        throttle: Throttle | None = None,
    ) -> None:
        self._handler = handler
        self._host = host
        self._port = port
        self.name = name
        self.limits = limits
        self.error_page = error_page
        self._reuse_port = reuse_port
        self._server: web.Server | None = None
        self._sockets: asyncio.Server | None = None
        self.open = 0  # connections open
        self._open_from: dict[str, int] = {}
        self.log = log if log is not None else structlog.get_logger(f"imgw.{name}")
        self._throttle = throttle or Throttle(time.monotonic)

    @property
    def port(self) -> int:
        assert self._sockets is not None
        return int(self._sockets.sockets[0].getsockname()[1])

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        server = self._server = web.Server(self._dispatch, loop=loop)
        lim = self.limits
        kwargs: dict[str, Any] = {
            "loop": loop,
            "access_log": None,
            "keepalive_timeout": lim.idle_timeout_s,
            "max_line_size": lim.max_field,
            "max_field_size": lim.max_field,
            "max_headers": lim.max_headers,
            "lingering_time": 2.0,
        }
        self._sockets = await loop.create_server(
            lambda: _Connection(server, self, **kwargs),
            self._host,
            self._port,
            reuse_port=self._reuse_port or None,
        )

    async def close(self, grace_s: float = 1.0) -> None:
        """Stop listening; requests under way get `grace_s` to finish, then are
        cancelled, and every connection is closed."""
        if self._sockets is not None:
            self._sockets.close()
        if self._server is not None:
            await self._server.shutdown(grace_s)
        if self._sockets is not None:
            await self._sockets.wait_closed()
            self._sockets = None

    # -- the caps ---------------------------------------------------------------------------

    def admit(self, address: str) -> int:
        """0 to take a new connection from `address`, else the status refusing it."""
        lim = self.limits
        if self.open >= lim.max_connections:
            return 503
        taken = self._open_from.get(address, 0)
        if lim.per_address and taken >= lim.per_address:
            return 429
        self.open += 1
        self._open_from[address] = taken + 1
        return 0

    def release(self, address: str) -> None:
        self.open -= 1
        left = self._open_from.pop(address, 1) - 1
        if left > 0:
            self._open_from[address] = left

    # -- requests ---------------------------------------------------------------------------

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        conn = request.protocol
        if isinstance(conn, _Connection):
            conn.request_began()
        try:
            return await self._handler(request)
        except ConnectionError:  # the peer went away mid-request: nobody to answer
            if request.transport is not None:
                request.transport.abort()
            gone = web.Response(status=400)
            gone.force_close()
            return gone
        except HttpError as e:
            page = self.error_page(e.status, e.text)
            page.headers.update(e.headers)
            if e.close:
                page.force_close()
            return page
        finally:
            if isinstance(conn, _Connection):
                conn.request_ended()

    def refused(self, address: str, reason: str) -> None:
        if (held := self._throttle.allow(f"{self.name} refused")) is not None:
            self.log.info(
                "request refused", listener=self.name, reason=reason, similar_held_back=held
            )

    def failed(self, exc: BaseException | None) -> None:
        if (held := self._throttle.allow(f"{self.name} failed")) is not None:
            self.log.error(
                "request failed", listener=self.name, error=repr(exc), similar_held_back=held
            )
