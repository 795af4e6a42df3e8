"""The admin port reads requests from anyone who reaches it, before any token: a request
it cannot read is answered 4xx in JSON, never a traceback, and its log is throttled."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.config import Config
from gateway.http.admin import AdminServer
from gateway.logs import Throttle
from gateway.metrics import Metrics


class Log:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.records.append(("info", event, kw))

    def exception(self, event: str, **kw: Any) -> None:
        self.records.append(("exception", event, kw))


@pytest.fixture
async def admin() -> AsyncIterator[tuple[int, Log]]:
    loop = asyncio.get_running_loop()
    log = Log()
    node = SimpleNamespace(
        config=Config(), loop=loop, log=log, log_throttle=Throttle(loop.time),
        accepting=True, metrics=Metrics(),
    )  # fmt: skip
    server = AdminServer(node, "127.0.0.1", 0)  # type: ignore[arg-type]
    await server.start()
    try:
        yield server.port, log
    finally:
        await server.close()


async def exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        async with asyncio.timeout(5):
            return await reader.read()
    finally:
        writer.close()


BAD_REQUESTS = {
    # "\xb2" is latin-1 for a superscript two: str.isdigit() says yes, int() says no
    "superscript length": b"POST /api/v1/groups HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",
    "5,000-digit length": b"POST /drain HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
    "request line over 16 KiB": b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
    "header over 16 KiB": b"GET /healthz HTTP/1.1\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n",
    "a chunked body in bad chunks": b"POST /api/v1/p2p HTTP/1.1\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    "not HTTP": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
    "65 headers": b"GET /healthz HTTP/1.1\r\n" + b"X-A: 1\r\n" * 65 + b"\r\n",
    "no URL": b"GET http://[abc/healthz HTTP/1.1\r\n\r\n",
}


@pytest.mark.parametrize("request_", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
async def test_a_request_it_cannot_read_is_answered_4xx_in_json(
    admin: tuple[int, Log], request_: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    port, log = admin
    with caplog.at_level(logging.DEBUG):
        reply = await exchange(port, request_)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split()[1] in (b"400", b"413", b"431"), reply[:120]
    assert b"application/json" in head
    assert json.loads(body)["error"]["code"] in ("bad_request", "content_too_large")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]  # no traceback
    assert [(level, event) for level, event, _ in log.records] == [("info", "request refused")]


async def test_the_log_of_bad_requests_is_throttled(admin: tuple[int, Log]) -> None:
    port, log = admin
    for _ in range(100):
        reply = await exchange(port, BAD_REQUESTS["superscript length"])
        assert reply.split()[1] == b"400"
    assert 1 <= len(log.records) <= 3, log.records  # at most one a second
    assert (await exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n")).split()[1] == b"200"
