"""What the webhooks and push sinks are owed, delivered at least once, whatever dies.

Every committed message is owed to the node's stages (the notify webhook,
gateway/hooks/notify.py; the push events, gateway/hooks/push.py), in batches, in commit
order, one batch at a time; a batch not yet full waits up to LINGER_S after its first
message's commit for more. A batch is done when every stage acknowledged it; a stage
that fails is retried after 0.1 s doubling up to `retry_cap_s`, and a stage that already
acknowledged the batch is not asked again. A send never waits for any of it: messages
are queued when they are pushed.

What is owed is durable (`hooks`, the store's hook rows, storage/hooks.py): the commit
that stores a message also stores its hook row, and the row is deleted once the batch is
done: at once when the queue runs empty, and while it stays busy once a second
(FORGET_S) or every FORGET_ROWS rows, so that a busy node spends one write transaction
on deleting rows a second rather than one a batch. The queue in memory is only the fast
path, bounded by `queue_max`; past it messages wait in the store (`deferred`). Whenever
the queue is empty the node reads the store for rows of its hook node that it does not
hold (those past the queue, those a predecessor with the same hook node left, and those
adopted from a dead node, gateway/outbox.py) once they are FRESH_MS old, and delivers
them: after the newer messages it had queued, so order holds only within what the queue
carried. So a node killed between a commit and a sink's answer loses nothing: its next
start, or a survivor, delivers what it owed (what was acknowledged just before the kill
may be delivered again: sinks deduplicate, by `msg_id` or the push event's `id`).

A message from the fast path carries what its fan-out saw (`Owed.members`, the users it
went to, and `Owed.online`, the devices it was written to); one read back from the store
carries neither, and the push stage looks both up when it delivers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from storage.models import StoredMessage

if TYPE_CHECKING:
    from storage.ports import ChatStore

RETRY_BASE_S: Final = 0.1
POLL_S: Final = 1.0  # how often an idle queue looks for rows it does not hold
# A row younger than this may belong to a message still on its way to `add` (committed,
# not yet pushed): left to the fast path, read from the store only once older.
FRESH_MS: Final = 2_000
# A batch not full waits this long after its first message was committed for more:
# under load, batches of batch_max (one POST and three store reads for a hundred
# messages, not for a few); idle, a message waits at most this long.
LINGER_S: Final = 0.2
FORGET_S: Final = 1.0  # a busy queue deletes the rows of what was delivered this often
FORGET_ROWS: Final = 2_000  # or once this many are waiting


@dataclass(frozen=True, slots=True)
class Owed:
    """A committed message owed to the stages, with what its fan-out saw: the uids it
    was pushed to and the (uid, device)s it was written to (None: not known, as for a
    message read back from the store)."""

    msg: StoredMessage
    members: Sequence[int] | None = None
    online: frozenset[tuple[int, str]] | None = None


class Stage(Protocol):
    """One consumer of the owed messages."""

    name: str

    def start(self) -> None: ...

    async def deliver(self, batch: Sequence[Owed]) -> bool:
        """Deliver `batch`; True once the sink acknowledged it. Never raises."""
        ...

    async def close(self) -> None: ...


class HookQueue:
    def __init__(
        self,
        stages: Sequence[Stage],
        *,
        queue_max: int = 10_000,
        batch_max: int = 100,
        retry_cap_s: float = 30.0,
        log: Any,
        throttle: Callable[[str], int | None] = lambda key: 0,
        hooks: ChatStore | None = None,
        hook_node: str = "",
    ) -> None:
        self.stages = list(stages)
        self._hooks = hooks  # the store holding what is owed (None: memory only)
        self._hook_node = hook_node
        self._undone: list[tuple[int, int]] = []  # delivered, rows not deleted yet
        self._forgot_at = 0.0  # time.monotonic() of the last deletion
        self._backlog = (0, 0)  # the store's rows owed, and the oldest's created_ms
        self._queue: deque[Owed] = deque()
        self._queue_max = queue_max
        self._batch_max = batch_max
        self._retry_cap_s = retry_cap_s
        self._log = log
        self._throttle = throttle  # log at most so often (gateway.logs.Throttle.allow)
        self._wake = asyncio.Event()  # set: the queue is not empty
        self._full = asyncio.Event()  # set: the queue holds a batch of batch_max
        self._idle = asyncio.Event()  # set: the queue is empty
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0  # messages every stage acknowledged
        self.dropped = 0  # messages not queued and not in the store: never delivered
        self.deferred = 0  # messages not queued (the queue was full): read from the store

    @property
    def queued(self) -> int:
        """Messages owed: in the queue, or (when larger) in the store, as last read."""
        return max(len(self._queue), self._backlog[0])

    @property
    def oldest_age_s(self) -> float:
        """Seconds since the oldest message owed was committed (0: none)."""
        oldest = [self._queue[0].msg.server_ms] if self._queue else []
        if self._backlog[0]:
            oldest.append(self._backlog[1])
        if not oldest:
            return 0.0
        return max(0.0, time.time() - min(oldest) / 1000)

    def start(self) -> None:
        for stage in self.stages:
            stage.start()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def add(self, owed: Owed) -> None:
        """Queue a committed message for the stages; never blocks, never raises."""
        if len(self._queue) >= self._queue_max:
            if self._hooks is not None:  # its row waits in the store
                self.deferred += 1
                return
            self.dropped += 1
            if (held := self._throttle("hook queue full")) is not None:
                self._log.warning(
                    "hook queue full: message not delivered to the hooks",
                    conv_id=owed.msg.conv_id, seq=owed.msg.seq, queue=len(self._queue),
                    similar_held_back=held,
                )  # fmt: skip
            return
        self._queue.append(owed)
        self._wake.set()
        self._idle.clear()
        if len(self._queue) >= self._batch_max:
            self._full.set()

    async def _run(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                if self._undone:
                    await self._forget()
                self._idle.set()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(POLL_S if self._hooks else None):
                        await self._wake.wait()
                if not queue and (batch := await self._owed()):
                    self._idle.clear()
                    await self._deliver(batch)
                continue
            if len(queue) < self._batch_max:
                await self._linger(queue[0])
            batch = [queue[i] for i in range(min(self._batch_max, len(queue)))]
            await self._deliver(batch)
            for _ in batch:  # still at the head: add() only appends
                queue.popleft()

    async def _linger(self, first: Owed) -> None:
        """Wait for a full batch, until LINGER_S after `first` was committed at most."""
        left = LINGER_S - (time.time() - first.msg.server_ms / 1000)
        if left <= 0:
            return
        self._full.clear()
        if len(self._queue) >= self._batch_max:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await self._full.wait()

    async def _deliver(self, batch: list[Owed]) -> None:
        """Deliver `batch` to every stage until each acknowledged it, then delete its
        rows."""
        delay = RETRY_BASE_S
        waiting = list(self.stages)
        while True:
            waiting = [s for s in waiting if not await s.deliver(batch)]
            if not waiting:
                break
            await asyncio.sleep(delay)
            delay = min(self._retry_cap_s, delay * 2)
        self.delivered += len(batch)
        if self._hooks is not None:
            self._undone += [(o.msg.conv_id, o.msg.seq) for o in batch]
            if len(self._undone) >= FORGET_ROWS or time.monotonic() - self._forgot_at >= FORGET_S:
                await self._forget()

    async def _forget(self) -> None:
        """Delete the rows of what was delivered; kept for the next try when the store
        does not answer (the rows would be delivered again: at least once)."""
        assert self._hooks is not None
        self._forgot_at = time.monotonic()
        try:
            await self._hooks.hooks_done(self._undone)
            self._undone = []
        except Exception as e:
            if (held := self._throttle("hook rows")) is not None:
                self._log.warning(
                    "delivered hook rows not deleted; retrying", rows=len(self._undone),
                    error=repr(e), similar_held_back=held,
                )  # fmt: skip

    async def _owed(self) -> list[Owed]:
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
            found: list[Owed] = []
            gone: list[tuple[int, int]] = []
            for row in rows:
                msgs, _ = await store.read_after(
                    row.conv_id, row.seq - 1, 1, min_seq=0, max_seq=None
                )
                if msgs and msgs[0].seq == row.seq:
                    found.append(Owed(msgs[0]))
                else:  # no longer readable (archived or pruned): nothing to deliver
                    gone.append((row.conv_id, row.seq))
            if gone:
                await store.hooks_done(gone)
            return found
        except Exception as e:
            if (held := self._throttle("hook rows")) is not None:
                self._log.warning(
                    "cannot read the hook rows owed; retrying", error=repr(e),
                    similar_held_back=held,
                )  # fmt: skip
            return []

    async def close(self, flush_s: float = 2.0) -> None:
        """Give the queue up to `flush_s` to drain, then stop: what is left waits in the
        store for the next start (without a store, it is lost)."""
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(self._idle.wait(), flush_s)
            except TimeoutError:
                self._log.warning("hook queue not drained at shutdown", left=len(self._queue))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._undone:  # else delivered again by the next start: allowed, not wanted
            await self._forget()
        for stage in self.stages:
            await stage.close()
