"""storage/pacing.py: when a coalescer's batches go."""

from __future__ import annotations

import asyncio

from storage.pacing import Pacer


class Owner:
    """A coalescer: calls queue up, each batch takes everything queued and takes
    `rtt_s` to be answered."""

    def __init__(
        self, *, in_flight: int = 2, linger_s: float = 0.0, rtt_s: float = 0.01, batch: int = 1000
    ):
        self.queue: list[int] = []
        self.batches: list[list[int]] = []
        self.sent_at: list[float] = []
        self.rtt_s = rtt_s
        self.batch = batch
        self.cancels = 0
        self.idle = asyncio.Event()  # set when a batch ends with nothing queued or out
        self.pacer = Pacer(
            self.take, lambda: len(self.queue), self.cancelled,
            in_flight=in_flight, linger_s=linger_s,
        )  # fmt: skip

    def call(self, x: int, *, now: bool = False) -> None:
        self.queue.append(x)
        self.pacer.request(now=now)

    async def take(self) -> None:
        batch, self.queue = self.queue[: self.batch], self.queue[self.batch :]
        self.batches.append(batch)
        self.sent_at.append(asyncio.get_running_loop().time())
        await asyncio.sleep(self.rtt_s)
        if not self.queue and self.pacer.out == 1:  # this batch is the last one out
            self.idle.set()

    def cancelled(self) -> None:
        self.cancels += 1
        self.queue.clear()


async def test_a_lone_call_goes_at_the_end_of_its_iteration() -> None:
    owner = Owner(linger_s=1.0)
    owner.call(1)
    assert owner.batches == []
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert owner.batches == [[1]]


async def test_calls_made_while_batches_are_out_wait_and_go_together() -> None:
    owner = Owner(in_flight=2, rtt_s=0.05)
    for x in range(200):
        owner.call(x)
        await asyncio.sleep(0.001)  # one call per iteration, for 0.2 s
    owner.idle.clear()  # the last call is still queued or out
    await asyncio.wait_for(owner.idle.wait(), 5)
    assert sorted(x for b in owner.batches for x in b) == list(range(200))
    # 2 out per 50 ms round trip over ~0.2 s: about 10 batches, not 200
    assert len(owner.batches) <= 16


async def test_under_load_batches_go_at_most_every_linger() -> None:
    owner = Owner(in_flight=8, linger_s=0.02, rtt_s=0.001)
    loop = asyncio.get_running_loop()
    end = loop.time() + 0.2
    x = 0
    while loop.time() < end:
        owner.call(x)
        x += 1
        await asyncio.sleep(0.001)
    owner.idle.clear()  # the last call is still queued or out
    await asyncio.wait_for(owner.idle.wait(), 5)
    gaps = [b - a for a, b in zip(owner.sent_at, owner.sent_at[1:], strict=False)]
    assert min(gaps) >= 0.019
    assert sum(len(b) for b in owner.batches) == x


async def test_a_cancelled_batch_cancels_what_waits() -> None:
    owner = Owner(in_flight=1, rtt_s=10)
    owner.call(1)
    await asyncio.sleep(0.01)
    owner.call(2)  # waits: one batch is out
    (task,) = owner.pacer._tasks
    task.cancel()
    await asyncio.sleep(0.01)
    assert owner.cancels == 1 and owner.queue == [] and owner.batches == [[1]]


async def _lingering(owner: Owner) -> None:
    """A batch just went: the next call would wait out the linger."""
    owner.call(0)
    await asyncio.sleep(0.005)
    assert owner.batches == [[0]] and not owner.pacer.out


async def test_a_full_batch_still_waits_out_the_linger() -> None:
    """Under load the linger is what keeps batches few: calls beyond a batch queue."""
    owner = Owner(linger_s=0.05, rtt_s=0.001, batch=3)
    await _lingering(owner)
    for x in range(1, 8):
        owner.call(x)
    await asyncio.sleep(0.005)
    assert owner.batches == [[0]]
    await asyncio.sleep(0.06)
    assert owner.batches == [[0], [1, 2, 3]]


async def test_a_call_that_asks_not_to_wait_takes_the_waiting_ones_along() -> None:
    owner = Owner(linger_s=10.0, rtt_s=0.001)
    await _lingering(owner)
    owner.call(1)
    await asyncio.sleep(0.005)
    assert owner.batches == [[0]]
    owner.call(2, now=True)  # a SYNC's next page
    await asyncio.sleep(0.005)
    assert owner.batches == [[0], [1, 2]]
