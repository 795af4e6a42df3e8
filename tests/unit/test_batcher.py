"""The send batcher's ordering rules under concurrent commits, on a store that commits
after a random delay and records what it saw."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from gateway.batcher import SendBatcher
from storage.models import AppendResult, AppendStatus, NewMessage, StoreUnavailable


class RecordingStore:
    def __init__(self, seed: int, fail_every: int = 0) -> None:
        self.rng = random.Random(seed)
        self.committed: list[NewMessage] = []
        self.active: set[int] = set()
        self.overlaps = 0
        self.max_parallel = 0
        self.running = 0
        self.calls = 0
        self.fail_every = fail_every

    async def append(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        convs = {m.conv_id for m in batch}
        if convs & self.active:
            self.overlaps += 1
        self.active |= convs
        self.running += 1
        self.max_parallel = max(self.max_parallel, self.running)
        self.calls += 1
        try:
            await asyncio.sleep(self.rng.uniform(0, 0.004))
            if self.fail_every and self.calls % self.fail_every == 0:
                raise StoreUnavailable("injected")
            self.committed += batch
            return [AppendResult(AppendStatus.STORED) for _ in batch]
        finally:
            self.active -= convs
            self.running -= 1


async def test_per_conversation_order_and_exclusive_batches() -> None:
    store = RecordingStore(seed=7)
    batcher = SendBatcher(store, max_batch=8, max_delay_s=0.001, max_inflight=3)  # type: ignore[arg-type]
    rng = random.Random(1)
    sent: dict[int, list[str]] = {}
    futures = []
    for i in range(600):
        conv = rng.randrange(12)
        cmid = f"m{i}"
        sent.setdefault(conv, []).append(cmid)
        futures.append(batcher.submit(NewMessage(conv, 1, cmid, 1, b"")))
        if rng.random() < 0.1:
            await asyncio.sleep(0)
    await batcher.drain()
    assert all(f.done() and f.result().status is AppendStatus.STORED for f in futures)
    assert store.overlaps == 0, "a conversation was in two committing batches"
    assert store.max_parallel > 1, "commits overlapped"
    got: dict[int, list[str]] = {}
    for m in store.committed:
        got.setdefault(m.conv_id, []).append(m.client_msg_id)
    assert got == sent


async def test_failed_commit_fails_only_its_batch() -> None:
    store = RecordingStore(seed=3, fail_every=3)
    batcher = SendBatcher(store, max_batch=5, max_delay_s=0.001, max_inflight=2)  # type: ignore[arg-type]
    futures = [batcher.submit(NewMessage(i % 4, 1, f"m{i}", 1, b"")) for i in range(100)]
    await batcher.drain()
    ok = [f for f in futures if f.exception() is None]
    failed = [f for f in futures if f.exception() is not None]
    assert failed and ok
    assert len(store.committed) == len(ok)
