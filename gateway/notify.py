"""The notify webhook: committed messages, in batches, POSTed to `--notify-url` after the
commit, so that a backend can index them, moderate after the fact or send mobile pushes
to users who are offline (docs/api.md, Webhook).

    POST <notify_url>   (Authorization: Bearer <notify_token> when one is set)
    {"node": "<node id>", "messages": [{"conv_id": 12, "seq": 8, "msg_id": "…",
      "sender_uid": 1001, "msg_type": 1, "content_b64": "…", "server_ms": …,
      "client_msg_id": "…", "text": "…"}, ...]}

Any 2xx answer acknowledges the batch. Delivery is at least once: a batch is posted
again, after 0.1 s doubling up to `retry_cap_s`, until it is acknowledged (so a
receiver deduplicates by `msg_id`), and batches go in commit order, one at a time. A
post without a whole answer within `timeout_s` (the whole call, not each read: an
`asyncio.timeout` around the request, the status and the body) has failed and is
retried. A send never waits for the webhook: messages are queued when they are pushed,
and the queue is bounded (`queue_max`); past it, messages are not queued but counted
(`dropped`) and logged, and the receiver catches up by reading history. Queued messages
live in the node's memory: a node that dies loses its queue (the messages are stored;
only their notification is lost).

Posts go through one aiohttp session, opened in the event loop by `start()`: one
keep-alive connection (posts go one at a time), and no cookies, redirects (a 3xx answer
is a failure) or proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import aiohttp
from yarl import URL

from gateway.jsonout import message_json, out_id
from storage.models import StoredMessage

RETRY_BASE_S: Final = 0.1


def notification(msg: StoredMessage) -> dict[str, Any]:
    return {
        "conv_id": out_id(msg.conv_id),
        **message_json(
            msg.seq, msg.msg_id, msg.sender_uid, msg.msg_type, msg.content, msg.server_ms,
            msg.client_msg_id,
        ),
    }  # fmt: skip


class Notifier:
    def __init__(
        self,
        url: str,
        *,
        node_id: str,
        token: str = "",
        queue_max: int = 10_000,
        batch_max: int = 100,
        timeout_s: float = 5.0,
        retry_cap_s: float = 30.0,
        log: Any,
        throttle: Callable[[str], int | None] = lambda key: 0,
    ) -> None:
        self.url = url
        self._node_id = node_id
        self._queue: deque[StoredMessage] = deque()
        self._queue_max = queue_max
        self._batch_max = batch_max
        self._retry_cap_s = retry_cap_s
        self._log = log
        self._throttle = throttle  # log at most so often (gateway.logs.Throttle.allow)
        self._timeout_s = timeout_s
        self._url = URL(url)
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._session: aiohttp.ClientSession | None = None
        self._wake = asyncio.Event()  # set: the queue is not empty
        self._idle = asyncio.Event()  # set: the queue is empty
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0  # messages acknowledged
        self.dropped = 0  # messages not queued: the queue was full
        self.failures = 0  # posts that failed (each retried)

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def oldest_age_s(self) -> float:
        """Seconds since the oldest message in the queue was committed (0: none)."""
        if not self._queue:
            return 0.0
        return max(0.0, time.time() - self._queue[0].server_ms / 1000)

    def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(),  # none: asyncio.timeout keeps the whole call's
            cookie_jar=aiohttp.DummyCookieJar(),
            headers=self._headers,
        )
        self._task = asyncio.get_running_loop().create_task(self._run())

    def add(self, msg: StoredMessage) -> None:
        """Queue a committed message for the webhook; never blocks, never raises."""
        if len(self._queue) >= self._queue_max:
            self.dropped += 1
            if (held := self._throttle("notify queue full")) is not None:
                self._log.warning(
                    "notify queue full: message not notified", conv_id=msg.conv_id,
                    seq=msg.seq, queue=len(self._queue), similar_held_back=held,
                )  # fmt: skip
            return
        self._queue.append(msg)
        self._wake.set()
        self._idle.clear()

    async def _run(self) -> None:
        queue = self._queue
        while True:
            while not queue:
                self._wake.clear()
                await self._wake.wait()
            batch = [queue[i] for i in range(min(self._batch_max, len(queue)))]
            delay = RETRY_BASE_S
            while not await self._post(batch):
                await asyncio.sleep(delay)
                delay = min(self._retry_cap_s, delay * 2)
            for _ in batch:  # still at the head: add() only appends
                queue.popleft()
            self.delivered += len(batch)
            if not queue:
                self._idle.set()

    async def _post(self, batch: list[StoredMessage]) -> bool:
        assert self._session is not None, "start() first"
        body = {"node": self._node_id, "messages": [notification(m) for m in batch]}
        try:
            data = json.dumps(body, separators=(",", ":")).encode()
            async with asyncio.timeout(self._timeout_s):
                async with self._session.post(self._url, data=data, allow_redirects=False) as r:
                    status = r.status
                    await r.read()
            if 200 <= status < 300:
                return True
            error = f"status {status}"
        except Exception as e:  # timeouts, connection errors alike
            error = repr(e)
        self.failures += 1
        if (held := self._throttle("notify failed")) is not None:
            self._log.warning(
                "notify webhook failed; retrying", url=self.url, messages=len(batch),
                error=error, queue=len(self._queue), similar_held_back=held,
            )  # fmt: skip
        return False

    async def close(self, flush_s: float = 2.0) -> None:
        """Give the queue up to `flush_s` to drain, then stop (what is left is lost)."""
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(self._idle.wait(), flush_s)
            except TimeoutError:
                self._log.warning("notify queue not drained at shutdown", left=len(self._queue))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
