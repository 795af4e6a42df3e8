"""An outbound call's deadline is the whole call's: a server that answers one byte every
150 ms (never idle long enough for a per-read timeout) still fails it within the
deadline, so the content check's fail-open/closed rule fires, the notifier retries and a
media SEND on S3 answers unavailable."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.hooks.contentcheck import FAIL_CLOSED, FAIL_OPEN, CheckFailed, WebhookCheck
from gateway.hooks.notify import NotifyStage
from gateway.hooks.queue import Owed
from protocol.mediakeys import media_key
from storage.errors import ObjectsUnavailable
from storage.media import objects as media_objects
from storage.models import NewMessage, StoredMessage
from tests.support.webhook import notify_queue

DEADLINE_S = 0.5
BYTE_EVERY_S = 0.15


class Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []
        self.warned = asyncio.Event()

    def warning(self, event: str, **kw: Any) -> None:
        self.warnings.append((event, kw))
        self.warned.set()


@pytest.fixture
async def dribbling_hook() -> AsyncIterator[str]:
    """An HTTP server that reads a request and answers it one byte every 150 ms (at the
    end of the test, the rest at once: a thread still reading finishes)."""
    hurry = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            body = b'{"allow": [true]}'
            answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            answer += str(len(body)).encode() + b"\r\n\r\n" + body
            for i in range(len(answer)):
                if hurry.is_set():
                    writer.write(answer[i:])
                    break
                writer.write(answer[i : i + 1])
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hurry.wait(), BYTE_EVERY_S)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    finally:
        hurry.set()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("fail", [FAIL_OPEN, FAIL_CLOSED])
async def test_a_dribbling_check_hook_fails_within_the_deadline(
    dribbling_hook: str, fail: str
) -> None:
    log = Log()
    check = WebhookCheck(dribbling_hook, timeout_s=DEADLINE_S, fail=fail, pool=2, log=log)
    began = time.monotonic()
    try:
        if fail == FAIL_OPEN:
            assert await check.check([NewMessage(9, 42, "m1", 1, b"hi")]) == [True]
        else:
            with pytest.raises(CheckFailed):
                await check.check([NewMessage(9, 42, "m1", 1, b"hi")])
    finally:
        await check.close()
    took = time.monotonic() - began
    assert took < DEADLINE_S + 1.0, f"the check took {took:.1f} s against a {DEADLINE_S} s deadline"
    assert check.failures == 1 and log.warnings[0][0] == "content check failed"


async def test_a_dribbling_notify_hook_fails_within_the_deadline(dribbling_hook: str) -> None:
    log = Log()
    notifier = notify_queue(
        dribbling_hook, node_id="n1", timeout_s=DEADLINE_S, retry_cap_s=60.0, log=log
    )
    notifier.start()
    try:
        notifier.add(Owed(StoredMessage(9, 1, 100, 42, 1, b"hi", 1_700_000_000_000, "m1")))
        await asyncio.wait_for(log.warned.wait(), DEADLINE_S + 1.0)
        stage = notifier.stages[0]
        assert isinstance(stage, NotifyStage) and stage.post.failures == 1
        assert notifier.delivered == 0 and notifier.queued == 1  # kept, to be retried
        assert log.warnings[0][0] == "notify webhook failed; retrying"
    finally:
        await notifier.close(flush_s=0)


async def test_a_dribbling_s3_store_fails_a_media_check_within_the_deadline(
    dribbling_hook: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HEAD a media SEND waits for: ObjectsUnavailable (the SEND answers unavailable)
    at the deadline, not whenever the store's last byte comes."""
    monkeypatch.setattr(media_objects, "S3_CALL_TIMEOUT_S", DEADLINE_S)
    for name, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
        monkeypatch.setenv(name, value)
    endpoint = dribbling_hook.rsplit("/", 1)[0]
    store = media_objects.open_objects(f"s3://imgw/im?endpoint={endpoint}&region=us-east-1", b"")
    began = time.monotonic()
    with pytest.raises(ObjectsUnavailable, match="no answer"):
        await store.size_of(media_key(5, "ab" * 32))
    took = time.monotonic() - began
    assert took < DEADLINE_S + 1.0, f"HEAD took {took:.1f} s against a {DEADLINE_S} s deadline"
