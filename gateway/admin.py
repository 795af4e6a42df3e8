"""The admin HTTP listener: GET /healthz (alive), GET /readyz (accepting), GET /metrics
(Prometheus), POST /drain[?rate=PER_S&hint=HOST:PORT] (drain this node and exit; what
`imgw drain --admin` calls), POST /revoke?uid=N[&device=D] (revoke tokens, kick the
sessions on every node; what `imgw revoke` calls), and the server API under /api/v1/
(gateway/api.py, docs/api.md). Actions (every method but GET) and every API call need
`Authorization: Bearer <admin_token>` when a token is configured (the config refuses a
non-loopback admin address without one). A deliberately tiny HTTP/1.0 responder: one
request (a body only with Content-Length, at most MAX_BODY bytes), one response, close.
A request it cannot read (a line over 64 KiB, more than MAX_HEADERS headers, a
Content-Length that is not 1 to MAX_LENGTH_DIGITS ASCII digits, a target that is no URL)
is answered 400 and logged at most once a second, with no traceback: it may come from
anyone who reaches the port, before any token is checked."""

from __future__ import annotations

import asyncio
import hmac
import math
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from gateway import api
from protocol.ops import ErrorCode
from protocol.token import DEVICE_RE
from storage.errors import BackendUnavailable

if TYPE_CHECKING:
    from gateway.node import Node

DrainHandler = Callable[[float | None, str | None], None]
MAX_HEADERS = 64
MAX_BODY = 256 * 1024
MAX_LENGTH_DIGITS = 18  # a Content-Length int() takes at once (longer ones are refused)


class _BadRequest(Exception):
    """The request cannot be read: answer 400 with this text."""


class AdminServer:
    def __init__(
        self,
        node: Node,
        host: str,
        port: int,
        *,
        on_drain: DrainHandler | None = None,
        token: str = "",
    ) -> None:
        self._node = node
        self._token = token
        self._host = host
        self._port = port
        self._on_drain = on_drain
        self._server: asyncio.Server | None = None
        self.api = api.Api(node)
        node.metrics.watch_admission(lambda: node.accepting, lambda: node.max_connections)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(5):
                    line = await _line(reader, "request line")
                    parts = line.decode("latin-1").split()
                    bearer = ""
                    length = 0
                    expect = False
                    for _ in range(MAX_HEADERS):
                        header = (await _line(reader, "header")).decode("latin-1").strip()
                        if not header:
                            break
                        name, _, value = header.partition(":")
                        name, value = name.strip().lower(), value.strip()
                        if name == "authorization":
                            scheme, _, cred = value.partition(" ")
                            if scheme.lower() == "bearer":
                                bearer = cred.strip()
                        elif name == "content-length":
                            length = _content_length(value)
                        elif name == "expect":
                            expect = value.lower() == "100-continue"
                    else:
                        raise _BadRequest(f"more than {MAX_HEADERS} headers")
                    request_body = b""
                    if 0 < length <= MAX_BODY:
                        if expect and parts[2:3] == ["HTTP/1.1"]:  # curl, bodies over 1 KiB
                            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                        request_body = await reader.readexactly(length)
                method = parts[0] if parts else "GET"
                target = parts[1] if len(parts) >= 2 else "/"
                try:
                    path = urlsplit(target).path
                except ValueError:  # "http://[x/..." (a bad IPv6 host), say
                    raise _BadRequest("the request target is no URL") from None
                if path.startswith(api.PREFIX):
                    status, ctype, body = await self._api(
                        method, target, bearer, length, request_body
                    )
                elif method != "GET" and not self._authorized(bearer):
                    status, ctype, body = "401 Unauthorized", "text/plain", b"admin token needed\n"
                elif path == "/revoke":
                    status, ctype, body = await self._revoke(method, urlsplit(target).query)
                else:
                    status, ctype, body = self._route(method, target)
            except _BadRequest as e:
                node = self._node
                if (held := node.log_throttle.allow("admin bad request")) is not None:
                    node.log.info("admin request refused", reason=str(e), similar_held_back=held)
                status, ctype, body = "400 Bad Request", "text/plain", f"{e}\n".encode()
            head = (
                f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug here: logged, throttled (anyone can send the request)
            node = self._node
            if (held := node.log_throttle.allow("admin failed")) is not None:
                node.log.exception("admin request failed", similar_held_back=held)
        finally:
            writer.close()

    async def _api(
        self, method: str, target: str, bearer: str, length: int, body: bytes
    ) -> tuple[str, str, bytes]:
        """A server API call: every method needs the token (reads show messages)."""
        url = urlsplit(target)
        if not self._authorized(bearer):
            status = 401
            answer = api.error_body(ErrorCode.AUTH_FAILED, "Authorization: Bearer <token> needed")
        elif length < 0 or length > MAX_BODY:
            status = 413
            answer = api.error_body(
                ErrorCode.BAD_REQUEST, f"the body must have a Content-Length of 0..{MAX_BODY}"
            )
        else:
            status, answer = await self.api.handle(method, url.path, url.query, body)
        return api.http_status(status), "application/json", api.dumps(answer)

    def _authorized(self, bearer: str) -> bool:
        if not self._token:
            return True  # loopback only (see Config.validate)
        return hmac.compare_digest(bearer.encode(), self._token.encode())

    def _route(self, method: str, target: str) -> tuple[str, str, bytes]:
        node = self._node
        url = urlsplit(target)
        path = url.path
        if path == "/drain":
            return self._drain(method, parse_qs(url.query))
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"use GET\n"
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            if node.accepting:
                return "200 OK", "text/plain", b"ready\n"
            return "503 Service Unavailable", "text/plain", b"draining\n"
        if path == "/metrics":
            return "200 OK", "text/plain; version=0.0.4", node.metrics.render()
        return "404 Not Found", "text/plain", b"not found\n"

    async def _revoke(self, method: str, raw_query: str) -> tuple[str, str, bytes]:
        """POST /revoke?uid=N[&device=D]: refuse the uid's (or one device's) current
        tokens from now on and kick its sessions on every node."""
        if method != "POST":
            return "405 Method Not Allowed", "text/plain", b"use POST /revoke?uid=N\n"
        query = parse_qs(raw_query)
        try:
            uid = int(query["uid"][0])
            if not 0 < uid < 1 << 64:
                raise ValueError(uid)
        except (KeyError, ValueError):
            return "400 Bad Request", "text/plain", b"uid=N (1..2^64-1) is required\n"
        device = query["device"][0] if "device" in query else None
        if device is not None and not DEVICE_RE.fullmatch(device):
            return "400 Bad Request", "text/plain", b"device must match [A-Za-z0-9_-]{1,32}\n"
        try:
            kicked = await self._node.revoke(uid, device)
        except BackendUnavailable as e:
            return "503 Service Unavailable", "text/plain", f"{e}\n".encode()
        return "200 OK", "text/plain", f"revoked; {kicked} session(s) kicked\n".encode()

    def _drain(self, method: str, query: dict[str, list[str]]) -> tuple[str, str, bytes]:
        if method != "POST":
            return "405 Method Not Allowed", "text/plain", b"use POST /drain\n"
        if self._on_drain is None:
            return "501 Not Implemented", "text/plain", b"drain is not available here\n"
        try:
            rate = float(query["rate"][0]) if "rate" in query else None
        except ValueError:
            return "400 Bad Request", "text/plain", b"rate must be a number (per second)\n"
        if rate is not None and not (math.isfinite(rate) and rate >= 0):
            return "400 Bad Request", "text/plain", b"rate must be a finite number >= 0\n"
        hint = query["hint"][0] if "hint" in query else None
        if not self._node.accepting:
            return "409 Conflict", "text/plain", b"already draining\n"
        self._on_drain(rate, hint)
        return "202 Accepted", "text/plain", b"draining\n"


async def _line(reader: asyncio.StreamReader, what: str) -> bytes:
    try:
        return await reader.readline()
    except ValueError:  # over the reader's limit (64 KiB)
        raise _BadRequest(f"{what} over 64 KiB") from None


def _content_length(value: str) -> int:
    """A Content-Length of ASCII digits (str.isdigit() also takes "²", which int()
    refuses), short enough for int() at once; else _BadRequest."""
    if not (value.isascii() and value.isdigit() and len(value) <= MAX_LENGTH_DIGITS):
        raise _BadRequest(f"Content-Length must be 1 to {MAX_LENGTH_DIGITS} ASCII digits")
    return int(value)
