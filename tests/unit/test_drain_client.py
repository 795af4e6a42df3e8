"""`imgw drain --admin` and `imgw revoke`'s HTTP client (gateway/cli/adminclient.py) against a
local aiohttp server: what it sends, and what each kind of failure says: a JSON error's
message, a text answer's body, an answer that is not HTTP, a port that does not answer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.cli.adminclient import DrainError, drain_by_admin, revoke_by_admin


class Admin:
    """An admin port that answers `status` with `body` (as `content_type`) and keeps
    what it was asked."""

    def __init__(self) -> None:
        self.status, self.body, self.content_type = 202, "draining\n", "text/plain"
        self.asked: list[tuple[str, str, str]] = []  # method, path?query, Authorization
        self.addr = ""
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.asked.append((request.method, request.path_qs, auth))
        return web.Response(status=self.status, text=self.body, content_type=self.content_type)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{path}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.addr = f"127.0.0.1:{self._runner.addresses[0][1]}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    a = Admin()
    await a.start()
    yield a
    await a.close()


async def test_drain_posts_its_rate_hint_and_token(admin: Admin) -> None:
    await asyncio.to_thread(
        drain_by_admin, admin.addr, rate=50.0, hint="10.0.0.2:7070", wait=False, timeout=5,
        token="s3cret",
    )  # fmt: skip
    assert admin.asked == [("POST", "/drain?rate=50.0&hint=10.0.0.2:7070", "Bearer s3cret")]


async def test_revoke_returns_the_answer(admin: Admin) -> None:
    admin.status, admin.body = 200, "revoked; 2 session(s) kicked\n"
    got = await asyncio.to_thread(revoke_by_admin, admin.addr, 5, "a b")
    assert got == "revoked; 2 session(s) kicked"
    assert admin.asked == [("POST", "/revoke?uid=5&device=a+b", "")]


async def test_a_json_error_says_its_message(admin: Admin) -> None:
    admin.status, admin.content_type = 401, "application/json"
    admin.body = '{"error": {"code": "unauthorized", "message": "a valid admin token"}}'
    with pytest.raises(DrainError) as e:
        await asyncio.to_thread(revoke_by_admin, admin.addr, 5, None)
    assert str(e.value) == f"{admin.addr} answered 401: a valid admin token"


async def test_a_text_error_says_its_body(admin: Admin) -> None:
    admin.status, admin.body = 409, "already draining\n"
    with pytest.raises(DrainError) as e:
        await asyncio.to_thread(
            drain_by_admin, admin.addr, rate=None, hint=None, wait=False, timeout=5
        )
    assert str(e.value) == f"{admin.addr} answered 409: already draining"
    admin.status, admin.body = 400, '{"error": "not the documented shape"}'
    with pytest.raises(DrainError) as e:
        await asyncio.to_thread(revoke_by_admin, admin.addr, 5, None)
    assert str(e.value).endswith('answered 400: {"error": "not the documented shape"}')


async def test_an_answer_that_is_not_http() -> None:
    async def ssh(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(ssh, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(DrainError, match=f"not an imgw admin port: 127.0.0.1:{port}"):
            await asyncio.to_thread(revoke_by_admin, f"127.0.0.1:{port}", 5, None)
    finally:
        server.close()
        await server.wait_closed()


def test_a_closed_port_cannot_be_reached() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(DrainError, match=f"cannot reach the admin port 127.0.0.1:{port}: "):
            drain_by_admin(f"127.0.0.1:{port}", rate=None, hint=None, wait=False, timeout=5)
