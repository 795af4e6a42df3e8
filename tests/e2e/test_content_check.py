"""The content check before the commit: a webhook answers allow/deny per message; denied
messages are not stored and their senders get content_denied (or forbidden, for clients
that did not ask for the new code); a failing webhook follows --check-fail."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import pytest

from protocol.frames import ConvOk, Error, GroupCreate, Login, LoginOk, Send, SendAck
from protocol.ops import CAP_CONTENT_DENIED, ErrorCode
from tests.conftest import StartGateway
from tests.faults.test_production_faults import pull_all
from tests.support.wire import Wire, token


class Webhook:
    """An HTTP/1.1 server (keep-alive) that denies content containing b"bad", or, when
    `down`, answers 500; `delay_s` holds every answer."""

    def __init__(self) -> None:
        self.down = False
        self.delay_s = 0.0
        self.batches: list[list[dict[str, object]]] = []
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/check"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                assert line.startswith(b"POST /check ")
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                body = json.loads(await reader.readexactly(length))
                self.batches.append(body["messages"])
                await asyncio.sleep(self.delay_s)
                if self.down:
                    out, status = b"{}", b"500 Internal Server Error"
                else:
                    allow = [b"bad" not in base64.b64decode(m["content"]) for m in body["messages"]]
                    out, status = json.dumps({"allow": allow}).encode(), b"200 OK"
                writer.write(
                    b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(out)).encode() + b"\r\n\r\n" + out
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    hook = Webhook()
    await hook.start()
    yield hook
    await hook.close()


async def _send(w: Wire, conv: int, cmid: str, content: bytes) -> object:
    return await w.request(Send(0, conv, cmid, 1, content), timeout=10)


@pytest.mark.backends("embedded", "production", "cluster")
async def test_denied_messages_are_not_stored(
    start_gateway: StartGateway, webhook: Webhook
) -> None:
    gw = await start_gateway(check_url=webhook.url)
    old = await Wire.login(gw.port, 1, "d")  # a client without the new capability
    new = await Wire.open(gw.port)
    ok = await new.request(Login(0, 1, 2, "d", token(2, "d"), (CAP_CONTENT_DENIED,)))
    assert isinstance(ok, LoginOk)
    g = await old.request(GroupCreate(0, "g", (2,)))
    assert isinstance(g, ConvOk)
    assert isinstance(await _send(old, g.conv_id, "fine-1", b"hello"), SendAck)
    denied = await _send(old, g.conv_id, "bad-1", b"a bad word")
    assert isinstance(denied, Error) and denied.code == ErrorCode.FORBIDDEN, denied
    denied = await _send(new, g.conv_id, "bad-2", b"bad again")
    assert isinstance(denied, Error) and denied.code == ErrorCode.CONTENT_DENIED, denied
    stored = [c for _, _, c in await pull_all(old, g.conv_id) if c]
    assert stored == ["fine-1"]
    sent = {m["client_msg_id"] for batch in webhook.batches for m in batch}
    assert {"fine-1", "bad-1", "bad-2"} <= sent
    assert webhook.batches[-1][0]["sender_uid"] == 2


@pytest.mark.backends("embedded")
async def test_a_failing_webhook_fails_open_or_closed(
    start_gateway: StartGateway, webhook: Webhook
) -> None:
    webhook.down = True
    opened = await start_gateway(check_url=webhook.url, check_fail="open")
    w = await Wire.login(opened.port, 1, "d")
    g = await w.request(GroupCreate(0, "g", (2,)))
    assert isinstance(g, ConvOk)
    assert isinstance(await _send(w, g.conv_id, "open-1", b"bad but unchecked"), SendAck)

    closed = await start_gateway(check_url=webhook.url, check_fail="closed")
    w2 = await Wire.login(closed.port, 3, "d")
    g2 = await w2.request(GroupCreate(0, "g", (4,)))
    assert isinstance(g2, ConvOk)
    refused = await _send(w2, g2.conv_id, "closed-1", b"fine")
    assert isinstance(refused, Error) and refused.code == ErrorCode.UNAVAILABLE
    webhook.down, webhook.delay_s = False, 1.0  # up, but slower than the deadline
    refused = await _send(w2, g2.conv_id, "closed-1", b"fine")
    assert isinstance(refused, Error) and refused.code == ErrorCode.UNAVAILABLE
    webhook.delay_s = 0.0
    assert isinstance(await _send(w2, g2.conv_id, "closed-1", b"fine"), SendAck)  # the retry
    assert [c for _, _, c in await pull_all(w2, g2.conv_id) if c] == ["closed-1"]
