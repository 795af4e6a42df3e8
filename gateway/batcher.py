"""The send batcher: group commit for SEND.

Messages queue up; a batch starts when `max_batch` are waiting or `max_delay_s` after the
first one arrived, and while the commit slots are busy the next batch gathers (so batches
grow with load and latency stays about one commit). Up to `max_inflight` batches commit
at once, on separate store connections, so one batch's round trips overlap another's.

Order: a conversation is in at most one committing batch, and a message is never taken
ahead of an earlier queued message of its conversation. So SENDs to one conversation are
committed (and get their seqs) in the order they were submitted.

Each message's future resolves only after the commit that stored it; a failed commit
fails every future in it and acks nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from storage.models import AppendResult, NewMessage
from storage.ports import ChatStore

_Item = tuple[NewMessage, "asyncio.Future[AppendResult]"]


class SendBatcher:
    __slots__ = (
        "_busy",
        "_closed",
        "_idle",
        "_inflight",
        "_loop",
        "_max_batch",
        "_max_delay",
        "_max_inflight",
        "_on_batch",
        "_queue",
        "_store",
        "_timer",
    )

    def __init__(
        self,
        store: ChatStore,
        *,
        max_batch: int,
        max_delay_s: float,
        max_inflight: int = 2,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._store = store
        self._max_batch = max_batch
        self._max_delay = max_delay_s
        self._max_inflight = max(1, max_inflight)
        self._on_batch = on_batch  # (batch size, commit seconds), for metrics
        self._loop = asyncio.get_running_loop()
        self._queue: list[_Item] = []
        self._timer: asyncio.TimerHandle | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._busy: set[int] = set()  # conversations in a committing batch
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    def submit(self, msg: NewMessage) -> asyncio.Future[AppendResult]:
        if self._closed:
            raise RuntimeError("send batcher is closed")
        fut: asyncio.Future[AppendResult] = self._loop.create_future()
        self._queue.append((msg, fut))
        self._idle.clear()
        if len(self._inflight) < self._max_inflight:
            if len(self._queue) >= self._max_batch:
                self._flush()
            elif self._timer is None:
                self._timer = self._loop.call_later(self._max_delay, self._flush)
        return fut

    @property
    def pending(self) -> int:
        return len(self._queue)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._queue and len(self._inflight) < self._max_inflight:
            batch = self._take()
            if not batch:
                return  # everything waits for a conversation that is committing
            convs = {m.conv_id for m, _ in batch}
            self._busy |= convs
            task = self._loop.create_task(self._commit(batch, convs))
            self._inflight.add(task)

    def _take(self) -> list[_Item]:
        """The next batch: queued messages in order, skipping conversations that are
        committing, and once a conversation is skipped, its later messages too."""
        batch: list[_Item] = []
        rest: list[_Item] = []
        deferred = set(self._busy)
        queue = self._queue
        for i, item in enumerate(queue):
            if len(batch) >= self._max_batch:
                rest += queue[i:]  # O(batch), not O(queue): the tail keeps its order
                break
            conv = item[0].conv_id
            if conv in deferred:
                rest.append(item)
            else:
                batch.append(item)
        self._queue = rest
        return batch

    async def _commit(self, batch: list[_Item], convs: set[int]) -> None:
        started = time.perf_counter()
        try:
            results = await self._store.append([m for m, _ in batch])
        except Exception as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
        else:
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
        finally:
            if self._on_batch is not None:
                self._on_batch(len(batch), time.perf_counter() - started)
            self._busy -= convs
            task = asyncio.current_task()
            if task is not None:
                self._inflight.discard(task)
            if self._queue:
                self._flush()  # what gathered during this commit goes now
            elif not self._inflight:
                self._idle.set()

    async def settled(self) -> None:
        """Wait until every message submitted so far is committed or failed."""
        waits: list[asyncio.Future[Any]] = [f for _, f in self._queue]
        waits.extend(self._inflight)
        if waits:
            await asyncio.wait(waits)

    async def drain(self) -> None:
        """Commit everything queued; new submissions are refused from now on."""
        self._closed = True
        self._flush()
        await self._idle.wait()
