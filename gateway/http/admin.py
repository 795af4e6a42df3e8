"""The admin listener (`--admin-port`): GET /healthz (alive), GET /readyz (accepting),
GET /metrics (Prometheus), POST /drain[?rate=PER_S&hint=HOST:PORT] (drain this node and
exit; what `imgw drain --admin` calls), POST /revoke?uid=N[&device=D] (revoke tokens,
kick the sessions on every node; what `imgw revoke` calls), and the server API under
/api/v1/ (gateway/http/api.py, docs/api.md, docs/openapi.json).

HTTP/1.1 with keep-alive on aiohttp (gateway/http/listener.py): at most
MAX_CONNECTIONS open, a request head within HEAD_TIMEOUT_S, a body of at most MAX_BODY
bytes within BODY_TIMEOUT_S (Content-Length or chunked).

Who may call what (gateway/http/keys.py): /healthz, /readyz and /metrics are open; every
other call presents `Authorization: Bearer <secret>`, the admin token (every scope and
`drain`) or an API key (its scopes). Without an admin token (the config then keeps the
listener on loopback) a request without credentials acts as the admin. Every error is
JSON, `{"error": {"code", "message"}}`, the server API's shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs

from aiohttp import web

from gateway.http import api, openapi
from gateway.http.keys import DRAIN, MODERATE, Caller, Credentials, Unauthorized, parse_api_keys
from gateway.http.listener import HttpError, HttpListener, Limits, read_body
from protocol.token import DEVICE_RE
from storage.errors import BackendUnavailable

if TYPE_CHECKING:
    from gateway.node import Node

DrainHandler = Callable[[float | None, str | None], None]
MAX_BODY: Final = 256 * 1024
MAX_CONNECTIONS: Final = 1024
HEAD_TIMEOUT_S: Final = 5.0
BODY_TIMEOUT_S: Final = 10.0
OPENAPI_PATH: Final = api.PREFIX + "openapi.json"
LIMITS: Final = Limits(max_connections=MAX_CONNECTIONS, head_timeout_s=HEAD_TIMEOUT_S)

# The listener's own paths: the method each takes, and the scope it needs ("": open).
OWN_PATHS: Final = {
    "/healthz": ("GET", ""),
    "/readyz": ("GET", ""),
    "/metrics": ("GET", ""),
    "/drain": ("POST", DRAIN),
    "/revoke": ("POST", MODERATE),
}


class AdminServer:
    def __init__(
        self,
        node: Node,
        host: str,
        port: int,
        *,
        on_drain: DrainHandler | None = None,
        token: str = "",
        api_keys: tuple[str, ...] = (),
    ) -> None:
        self._node = node
        self._on_drain = on_drain
        self.credentials = Credentials(token, parse_api_keys(api_keys))
        self.api = api.Api(node)
        self.listener = HttpListener(
            self._handle, host, port, name="admin", limits=LIMITS, error_page=api.error_page,
            log=node.log, throttle=node.log_throttle,
        )  # fmt: skip
        node.metrics.watch_admission(lambda: node.accepting, lambda: node.max_connections)

    @property
    def port(self) -> int:
        return self.listener.port

    async def start(self) -> None:
        await self.listener.start()

    async def close(self) -> None:
        await self.listener.close()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == OPENAPI_PATH:  # open: the contract is public
            if request.method != "GET":
                raise HttpError(405, f"use GET {path}", headers={"Allow": "GET"})
            return api.json_response(200, openapi.document())
        if path.startswith(api.PREFIX):
            caller = self._caller(request)
            body = b""
            if request.method in api.BODY_METHODS:
                body = await _body(request)
            status, answer, headers = await self.api.handle(
                request.method, path, request.query_string, body, caller
            )
            return api.json_response(status, answer, headers)
        own = OWN_PATHS.get(path)
        if own is None:
            raise HttpError(404, f"no such path {path}")
        method, scope = own
        if request.method != method:
            raise HttpError(405, f"use {method} {path}", headers={"Allow": method})
        if scope:
            caller = self._caller(request)
            if scope not in caller.scopes:
                raise HttpError(403, f"the key {caller.name} lacks the scope {scope}")
        node = self._node
        if path == "/healthz":
            return web.Response(text="ok\n")
        if path == "/readyz":
            if node.accepting:
                return web.Response(text="ready\n")
            return web.Response(status=503, text="draining\n")
        if path == "/metrics":
            return web.Response(
                body=node.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"}
            )
        query = parse_qs(request.query_string)
        if path == "/drain":
            return self._drain(query)
        return await self._revoke(query)

    def _caller(self, request: web.BaseRequest) -> Caller:
        try:
            return self.credentials.caller(request.headers.get("Authorization"))
        except Unauthorized as e:
            raise HttpError(401, str(e), headers={"WWW-Authenticate": "Bearer"}) from None

    async def _revoke(self, query: dict[str, list[str]]) -> web.Response:
        """POST /revoke?uid=N[&device=D]: refuse the uid's (or one device's) current
        tokens from now on and kick its sessions on every node."""
        try:
            uid = int(query["uid"][0])
            if not 0 < uid < 1 << 64:
                raise ValueError(uid)
        except (KeyError, ValueError):
            raise HttpError(400, "uid=N (1..2^64-1) is required") from None
        device = query["device"][0] if "device" in query else None
        if device is not None and not DEVICE_RE.fullmatch(device):
            raise HttpError(400, "device must match [A-Za-z0-9_-]{1,32}")
        try:
            kicked = await self._node.revoke(uid, device)
        except BackendUnavailable as e:
            raise HttpError(503, str(e)) from None
        return web.Response(text=f"revoked; {kicked} session(s) kicked\n")

    def _drain(self, query: dict[str, list[str]]) -> web.Response:
        if self._on_drain is None:
            raise HttpError(501, "drain is not available here")
        try:
            rate = float(query["rate"][0]) if "rate" in query else None
        except ValueError:
            raise HttpError(400, "rate must be a number (per second)") from None
        if rate is not None and not (math.isfinite(rate) and rate >= 0):
            raise HttpError(400, "rate must be a finite number >= 0")
        hint = query["hint"][0] if "hint" in query else None
        if not self._node.accepting:
            raise HttpError(409, "already draining")
        self._on_drain(rate, hint)
        return web.Response(status=202, text="draining\n")


async def _body(request: web.BaseRequest) -> bytes:
    return await read_body(request, MAX_BODY, BODY_TIMEOUT_S)
