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
retried. A send never waits for the webhook: messages are queued when they are pushed.

What is owed is durable (`hooks`, the store's hook rows, storage/ports.py): the commit
that stores a message also stores its hook row, and the row is deleted once the webhook
acknowledged it. The queue in memory is only the fast path, bounded by `queue_max`;
past it messages wait in the store (`deferred`). Whenever the queue is empty the
notifier reads the store for rows of its node that it does not hold (those past the
queue, those a predecessor with the same hook node left, and those adopted from a dead
node, gateway/outbox.py) once they are FRESH_MS old, and posts them: after the newer
messages it had queued, so order holds only within what the queue carried. So a node
killed between a commit and the webhook's answer loses nothing: its next start, or a
survivor, posts what it owed (a message acknowledged just before the kill may be posted
again).

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
from typing import TYPE_CHECKING, Any, Final

import aiohttp
from yarl import URL

from gateway.jsonout import message_json, out_id
from storage.models import StoredMessage

if TYPE_CHECKING:
    from storage.ports import ChatStore

RETRY_BASE_S: Final = 0.1
POLL_S: Final = 1.0  # how often an idle notifier looks for rows it does not hold
# A row younger than this may belong to a message still on its way to `add` (committed,
# not yet pushed): left to the fast path, read from the store only once older.
FRESH_MS: Final = 2_000


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
        hooks: ChatStore | None = None,
        hook_node: str = "",
    ) -> None:
        self.url = url
        self._node_id = node_id
        self._hooks = hooks  # the store holding what is owed (None: memory only)
        self._hook_node = hook_node or node_id
        self._undone: list[tuple[int, int]] = []  # acknowledged, rows not deleted yet
        self._backlog = (0, 0)  # the store's rows owed, and the oldest's created_ms
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
        self.dropped = 0  # messages not queued and not in the store: never notified
        self.deferred = 0  # messages not queued (the queue was full): read from the store
        self.failures = 0  # posts that failed (each retried)

    @property
    def queued(self) -> int:
        """Messages owed: in the queue, or (when larger) in the store, as last read."""
        return max(len(self._queue), self._backlog[0])

    @property
    def oldest_age_s(self) -> float:
        """Seconds since the oldest message owed was committed (0: none)."""
        oldest = [self._queue[0].server_ms] if self._queue else []
        if self._backlog[0]:
            oldest.append(self._backlog[1])
        if not oldest:
            return 0.0
        return max(0.0, time.time() - min(oldest) / 1000)

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
            if self._hooks is not None:  # its row waits in the store
                self.deferred += 1
                return
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
            if not queue:
                self._idle.set()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_S if self._hooks else None):
                        await self._wake.wait()
                if not queue and (batch := await self._owed()):
                    self._idle.clear()
                    await self._deliver(batch)
                continue
            batch = [queue[i] for i in range(min(self._batch_max, len(queue)))]
            await self._deliver(batch)
            for _ in batch:  # still at the head: add() only appends
                queue.popleft()

    async def _deliver(self, batch: list[StoredMessage]) -> None:
        """Post `batch` until acknowledged, then delete its rows."""
        delay = RETRY_BASE_S
        while not await self._post(batch):
            await asyncio.sleep(delay)
            delay = min(self._retry_cap_s, delay * 2)
        self.delivered += len(batch)
        if self._hooks is not None:
            self._undone += [(m.conv_id, m.seq) for m in batch]
            await self._forget()

    async def _forget(self) -> None:
        """Delete the rows of what was acknowledged; kept for the next try when the store
        does not answer (the rows would be posted again: at least once)."""
        assert self._hooks is not None
        try:
            await self._hooks.hooks_done(self._undone)
            self._undone = []
        except Exception as e:
            if (held := self._throttle("notify rows")) is not None:
                self._log.warning(
                    "notified rows not deleted; retrying", rows=len(self._undone),
                    error=repr(e), similar_held_back=held,
                )  # fmt: skip

    async def _owed(self) -> list[StoredMessage]:
        """The messages of rows the store holds for this node (the queue is empty):
        a batch, oldest first; [] when none or the store does not answer."""
        store = self._hooks
        if store is None:
            return []
        try:
            if self._undone:
                await self._forget()
                if self._undone:
                    return []
            self._backlog = await store.hooks_backlog()
            if not self._backlog[0]:
                return []
            rows = await store.hooks_of(self._hook_node, self._batch_max)
            fresh = int(time.time() * 1000) - FRESH_MS
            rows = [r for r in rows if r.created_ms <= fresh]
            found: list[StoredMessage] = []
            gone: list[tuple[int, int]] = []
            for row in rows:
                msgs, _ = await store.read_after(
                    row.conv_id, row.seq - 1, 1, min_seq=0, max_seq=None
                )
                if msgs and msgs[0].seq == row.seq:
                    found.append(msgs[0])
                else:  # no longer readable (archived or pruned): nothing to post
                    gone.append((row.conv_id, row.seq))
            if gone:
                await store.hooks_done(gone)
            return found
        except Exception as e:
            if (held := self._throttle("notify rows")) is not None:
                self._log.warning(
                    "cannot read the notify rows owed; retrying", error=repr(e),
                    similar_held_back=held,
                )  # fmt: skip
            return []

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
        """Give the queue up to `flush_s` to drain, then stop: what is left waits in the
        store for the next start (without a store, it is lost)."""
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
