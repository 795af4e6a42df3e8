"""The timing wheel on a controllable loop clock: deadlines fire once, in time, lazily."""

from __future__ import annotations

import asyncio

from gateway.wheel import TimingWheel


class Entry:
    def __init__(self, deadlines: list[float]) -> None:
        self.timer_at = 0.0
        self.timer_slot = 0
        self.deadlines = deadlines  # what on_timer returns, in turn
        self.fired: list[float] = []

    def on_timer(self, now: float) -> float | None:
        self.fired.append(now)
        return self.deadlines.pop(0) if self.deadlines else None


class FakeLoop:
    """Just enough of a loop for the wheel: a clock we move and call_at we run."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.calls: list[tuple[float, object]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, cb: object) -> asyncio.TimerHandle:
        self.calls.append((when, cb))
        return _Handle()  # type: ignore[return-value]

    def advance(self, seconds: float, step: float = 0.25) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            due = [c for c in self.calls if c[0] <= self.now]
            self.calls = [c for c in self.calls if c[0] > self.now]
            for _, cb in due:
                cb()  # type: ignore[operator]


class _Handle:
    def cancel(self) -> None:
        pass


def make() -> tuple[FakeLoop, TimingWheel]:
    loop = FakeLoop()
    wheel = TimingWheel(loop, tick_s=0.25, slots=64)  # type: ignore[arg-type]
    wheel.start()
    return loop, wheel


def test_fires_at_deadline_not_before() -> None:
    loop, wheel = make()
    e = Entry([])
    wheel.schedule(e, loop.now + 2.0)
    loop.advance(1.9)
    assert e.fired == []
    loop.advance(0.5)
    assert len(e.fired) == 1 and 1002.0 <= e.fired[0] <= 1002.5


def test_rearm_returned_deadline_and_stop() -> None:
    loop, wheel = make()
    e = Entry([1003.0, 1005.0])
    wheel.schedule(e, 1001.0)
    loop.advance(10)
    assert [round(t) for t in e.fired] == [1001, 1003, 1005]


def test_deadline_beyond_span_goes_round_again() -> None:
    loop, wheel = make()  # span: 64 slots x 0.25 s = 16 s
    e = Entry([])
    wheel.schedule(e, loop.now + 40)
    loop.advance(39)
    assert e.fired == []
    loop.advance(2)
    assert len(e.fired) == 1 and e.fired[0] >= 1040


def test_earlier_deadline_wins_and_stale_entry_is_skipped() -> None:
    loop, wheel = make()
    e = Entry([])
    wheel.schedule(e, loop.now + 5)
    wheel.schedule(e, loop.now + 1)  # earlier: re-armed
    wheel.schedule(e, loop.now + 3)  # later than armed: no-op
    loop.advance(10)
    assert len(e.fired) == 1 and e.fired[0] < 1002


def test_disarmed_entry_never_fires() -> None:
    loop, wheel = make()
    e = Entry([])
    wheel.schedule(e, loop.now + 1)
    e.timer_at = 0.0
    loop.advance(5)
    assert e.fired == []


def test_catches_up_after_a_stall() -> None:
    loop, wheel = make()
    entries = [Entry([]) for _ in range(10)]
    for i, e in enumerate(entries):
        wheel.schedule(e, loop.now + 0.5 + i * 0.5)
    loop.advance(10, step=10)  # one late timer callback covers 40 ticks
    assert all(len(e.fired) == 1 for e in entries)
