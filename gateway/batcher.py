"""The send batcher: group commit for SEND.

Messages queue up; a flush starts when `max_batch` are waiting or `max_delay_s` after the
first one arrived, and while one commit is in flight the next batch gathers (so batches
grow with load and latency stays one commit). Each message's future resolves only after
the commit that stored it; a failed commit fails every future in it and acks nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from storage.models import AppendResult, NewMessage
from storage.ports import ChatStore


class SendBatcher:
    __slots__ = (
        "_closed",
        "_idle",
        "_inflight",
        "_loop",
        "_max_batch",
        "_max_delay",
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
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._store = store
        self._max_batch = max_batch
        self._max_delay = max_delay_s
        self._on_batch = on_batch  # (batch size, commit seconds), for metrics
        self._loop = asyncio.get_running_loop()
        self._queue: list[tuple[NewMessage, asyncio.Future[AppendResult]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._inflight: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    def submit(self, msg: NewMessage) -> asyncio.Future[AppendResult]:
        if self._closed:
            raise RuntimeError("send batcher is closed")
        fut: asyncio.Future[AppendResult] = self._loop.create_future()
        self._queue.append((msg, fut))
        self._idle.clear()
        if self._inflight is None:
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
        if self._inflight is not None or not self._queue:
            return
        batch = self._queue[: self._max_batch]
        del self._queue[: self._max_batch]
        self._inflight = self._loop.create_task(self._commit(batch))

    async def _commit(self, batch: list[tuple[NewMessage, asyncio.Future[AppendResult]]]) -> None:
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
            self._inflight = None
            if self._queue:
                self._flush()  # what gathered during this commit goes now
            else:
                self._idle.set()

    async def drain(self) -> None:
        """Commit everything queued; new submissions are refused from now on."""
        self._closed = True
        self._flush()
        await self._idle.wait()
