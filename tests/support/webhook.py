"""A webhook receiver for the tests: a plain HTTP/1.1 server on asyncio streams."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.hooks.notify import NotifyStage
from gateway.hooks.post import JsonPost
from gateway.hooks.queue import HookQueue
from tests.support.proc import free_port
from tests.support.waiting import wait_until


class Receiver:
    """A webhook receiver: records each POST's body and Authorization header, and
    answers with the next of `statuses` (then `status`, 200 unless set)."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.status = 200
        self.posts: list[dict[str, Any]] = []
        self.auth: list[str] = []
        self.refused = 0  # posts answered with another status than 200
        self.port = free_port()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> Receiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: the client reuses the connection
                line = await reader.readline()
                if not line:
                    return
                length, auth = 0, ""
                while (header := (await reader.readline()).decode().strip()) != "":
                    name, _, value = header.partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    elif name.lower() == "authorization":
                        auth = value.strip()
                body = await reader.readexactly(length)
                status = self.statuses.pop(0) if self.statuses else self.status
                if status == 200:
                    self.posts.append(json.loads(body))
                    self.auth.append(auth)
                else:
                    self.refused += 1
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode())
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def events(self) -> list[dict[str, Any]]:
        """The push events posted (`--push-url`), repeats included."""
        return [e for post in self.posts for e in post.get("events", ())]

    async def wait_for_events(self, ids: set[str], timeout: float = 10.0) -> list[dict[str, Any]]:
        """Wait until an event of each of `ids` was posted; all the events posted."""
        await wait_until(
            lambda: ids <= {e["id"] for e in self.events()}, timeout, f"{len(ids)} push events"
        )
        return self.events()

    def messages(self) -> list[dict[str, Any]]:
        return [m for post in self.posts for m in post["messages"]]

    async def wait_for(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        await wait_until(
            lambda: len({m["msg_id"] for m in self.messages()}) >= n, timeout, f"{n} messages"
        )
        return self.messages()


def notify_queue(
    url: str,
    *,
    node_id: str,
    token: str = "",
    timeout_s: float = 5.0,
    batch_max: int = 100,
    retry_cap_s: float = 30.0,
    log: Any,
) -> HookQueue:
    """A hook queue with the notify webhook alone and no store (memory only)."""
    post = JsonPost(url, what="notify webhook", token=token, timeout_s=timeout_s, log=log)
    return HookQueue(
        [NotifyStage(post, node_id=node_id)], batch_max=batch_max, retry_cap_s=retry_cap_s,
        log=log,
    )  # fmt: skip
