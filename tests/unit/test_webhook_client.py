"""The webhooks' HTTP client (gateway/hooks/contentcheck.py, gateway/hooks/notify.py)
against a local aiohttp server: the content check keeps one connection alive across
batches, sends the documented body, and treats a redirect like any other status that is
not 200; the notifier reuses its connection and sends its bearer token."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gateway.hooks.contentcheck import FAIL_CLOSED, CheckFailed, WebhookCheck, check_body
from gateway.hooks.queue import Owed
from protocol.ops import MsgType
from storage.models import NewMessage, StoredMessage
from tests.support.waiting import wait_until
from tests.support.webhook import notify_queue


class Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.warnings.append((event, kw))


class Hook:
    """An aiohttp server that allows every message (or answers `status`), and keeps the
    bodies, headers and connections of the requests it served."""

    def __init__(self) -> None:
        self.status = 200
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.connections: set[asyncio.BaseTransport] = set()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        assert request.transport is not None
        self.connections.add(request.transport)
        body = json.loads(await request.read())
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.status != 200:
            return web.Response(status=self.status, headers={"Location": "/elsewhere"})
        return web.json_response({"allow": [True] * len(body.get("messages", []))})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    h = Hook()
    await h.start()
    yield h
    await h.close()


def _batch(n: int, start: int = 0) -> list[NewMessage]:
    return [NewMessage(9, 42, f"m{i}", 1, f"hello {i}".encode()) for i in range(start, start + n)]


async def test_the_check_keeps_one_connection_alive_across_batches(hook: Hook) -> None:
    check = WebhookCheck(hook.url, timeout_s=5, fail=FAIL_CLOSED, pool=4, log=Log())
    try:
        for i in range(10):
            assert await check.check(_batch(3, start=3 * i)) == [True] * 3
    finally:
        await check.close()
    assert len(hook.bodies) == 10
    assert len(hook.connections) == 1, f"{len(hook.connections)} connections for 10 batches"
    assert (check.checked, check.denied, check.failures) == (30, 0, 0)


async def test_the_check_sends_the_documented_body(hook: Hook) -> None:
    batch = [NewMessage(9, 42, 'm-é "q" \\', 1, b"\x00bin\xff"), NewMessage(7, 43, "m2", 2, b"")]
    check = WebhookCheck(hook.url, timeout_s=5, fail=FAIL_CLOSED, pool=1, log=Log())
    try:
        assert await check.check(batch) == [True, True]
    finally:
        await check.close()
    [body] = hook.bodies
    assert body == {
        "messages": [
            {"conv_id": 9, "sender_uid": 42, "client_msg_id": 'm-é "q" \\', "msg_type": 1,
             "content": base64.b64encode(b"\x00bin\xff").decode()},
            {"conv_id": 7, "sender_uid": 43, "client_msg_id": "m2", "msg_type": 2,
             "content": ""},
        ]
    }  # fmt: skip
    assert hook.headers[0]["Content-Type"] == "application/json"
    assert json.loads(check_body(batch)) == body


def test_the_body_carries_a_message_type_as_its_number() -> None:
    [message] = json.loads(check_body([NewMessage(1, 2, "c", MsgType.IMAGE, b"x")]))["messages"]
    assert message["msg_type"] == int(MsgType.IMAGE)


async def test_a_redirect_fails_the_check(hook: Hook) -> None:
    hook.status = 307
    log = Log()
    check = WebhookCheck(hook.url, timeout_s=5, fail=FAIL_CLOSED, pool=1, log=log)
    try:
        with pytest.raises(CheckFailed, match="status 307"):
            await check.check(_batch(1))
    finally:
        await check.close()
    assert len(hook.bodies) == 1  # not followed
    assert check.failures == 1 and log.warnings[0][0] == "content check failed"


async def test_a_check_that_was_never_used_closes(hook: Hook) -> None:
    check = WebhookCheck(hook.url, timeout_s=5, fail=FAIL_CLOSED, pool=1, log=Log())
    await check.close()  # no session was opened
    assert await check.check(_batch(1)) == [True]  # a session opened on use
    await check.close()


async def test_the_notifier_reuses_its_connection_and_sends_its_token(hook: Hook) -> None:
    notifier = notify_queue(hook.url, node_id="n1", token="s3cret", batch_max=2, log=Log())
    notifier.start()
    try:
        for seq in range(1, 7):
            notifier.add(
                Owed(StoredMessage(9, seq, 100 + seq, 42, 1, b"hi", 1_700_000_000_000, "m"))
            )
            await asyncio.sleep(0)
        await wait_until(lambda: notifier.delivered == 6, 10, "6 messages delivered")
    finally:
        await notifier.close(flush_s=0)
    seqs = [m["seq"] for body in hook.bodies for m in body["messages"]]
    assert seqs == [1, 2, 3, 4, 5, 6]
    assert {h["Authorization"] for h in hook.headers} == {"Bearer s3cret"}
    assert len(hook.connections) == 1
