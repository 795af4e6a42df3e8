"""The shared HTTP listener (gateway/http/listener.py) on real sockets on 127.0.0.1, with
a handler that echoes the body it reads: keep-alive, chunked bodies, the head deadline,
the caps, read_body's limit, and malformed requests answered through error_page."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.http.listener import HttpListener, Limits, read_body
from tests.support.rawhttp import closed, reply
from tests.support.waiting import wait_until

BODY_LIMIT = 100


async def echo(request: web.BaseRequest) -> web.StreamResponse:
    body = await read_body(request, BODY_LIMIT, 2.0)
    return web.Response(text=f"{request.method} {request.path} {body.decode()}")


def tagged_page(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=f"page {status}: {text}", content_type="text/plain")


@contextlib.asynccontextmanager
async def serving(limits: Limits) -> AsyncIterator[HttpListener]:
    listener = HttpListener(
        echo, "127.0.0.1", 0, name="test", limits=limits, error_page=tagged_page
    )
    await listener.start()
    try:
        yield listener
    finally:
        await listener.close(0.1)


@pytest.fixture
async def listener() -> AsyncIterator[HttpListener]:
    async with serving(Limits(head_timeout_s=0.3, idle_timeout_s=5)) as server:
        yield server


@contextlib.asynccontextmanager
async def connection(
    server: HttpListener,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def test_two_requests_on_one_connection(listener: HttpListener) -> None:
    async with connection(listener) as (reader, writer):
        writer.write(b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = await reply(reader)
        assert (status, body) == (200, b"GET /one ")
        writer.write(b"POST /two HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        status, _, body = await reply(reader)
        assert (status, body) == (200, b"POST /two hello")
        assert listener.open == 1


async def test_a_chunked_body_is_read_whole(listener: HttpListener) -> None:
    async with connection(listener) as (reader, writer):
        writer.write(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in (b"ab", b"cde", b"f"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        status, _, body = await reply(reader)
        assert (status, body) == (200, b"POST /c abcdef")


async def test_a_head_trickled_past_the_deadline_closes_the_connection(
    listener: HttpListener,
) -> None:
    """A header line every 0.05 s: never idle, but the head is not whole after 0.3 s."""
    loop = asyncio.get_running_loop()
    async with connection(listener) as (reader, writer):
        began = loop.time()
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n")

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError):
                for i in range(40):  # 2 s in all
                    writer.write(b"X-%d: 1\r\n" % i)
                    await asyncio.sleep(0.05)

        sender = asyncio.create_task(trickle())
        try:
            assert await closed(reader)  # unanswered
            assert loop.time() - began < 1.5
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender


async def test_connections_over_the_cap_are_answered_503() -> None:
    async with serving(Limits(max_connections=2)) as server:
        async with connection(server), connection(server):
            await wait_until(lambda: server.open == 2, 5, "both accepted")
            async with connection(server) as (reader, _):
                status, headers, body = await reply(reader)
                assert (status, headers["retry-after"]) == (503, "1")
                assert body.startswith(b"page 503: ")
                assert await closed(reader)
        await wait_until(lambda: server.open == 0, 5, "both slots free")
        async with connection(server) as (reader, writer):
            writer.write(b"GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reply(reader))[0] == 200


async def test_connections_from_one_address_over_its_cap_are_answered_429() -> None:
    async with serving(Limits(max_connections=10, per_address=1)) as server:
        async with connection(server):
            await wait_until(lambda: server.open == 1, 5, "the first accepted")
            async with connection(server) as (reader, _):
                status, _, body = await reply(reader)
                assert (status, body[:10]) == (429, b"page 429: ")
                assert await closed(reader)
        await wait_until(lambda: server.open == 0, 5, "its slot free again")
        async with connection(server) as (reader, writer):
            writer.write(b"GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reply(reader))[0] == 200


async def test_a_content_length_over_the_limit_is_answered_413(listener: HttpListener) -> None:
    """Answered at once, the connection to be closed (aiohttp first reads and drops what
    comes of the body for up to its lingering time, so the peer can read the answer)."""
    async with connection(listener) as (reader, writer):
        over = BODY_LIMIT + 1
        writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % over)
        status, headers, body = await reply(reader)  # before the body is sent
        assert (status, headers["connection"].lower()) == (413, "close")
        assert body.startswith(b"page 413: ")


async def test_a_chunked_body_that_grows_past_the_limit_is_answered_413(
    listener: HttpListener,
) -> None:
    async with connection(listener) as (reader, writer):
        writer.write(b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        part = b"a" * 40
        for _ in range(3):  # 120 bytes, over 100 on the third chunk
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.01)
        status, headers, body = await reply(reader)  # with no last chunk sent
        assert (status, headers["connection"].lower()) == (413, "close")
        assert body.startswith(b"page 413: ")


async def test_a_malformed_request_line_is_answered_400_through_error_page(
    listener: HttpListener,
) -> None:
    async with connection(listener) as (reader, writer):
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        status, _, body = await reply(reader)
        assert (status, body[:10]) == (400, b"page 400: ")
        assert await closed(reader)
