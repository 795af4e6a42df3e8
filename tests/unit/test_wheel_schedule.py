"""The timing wheel's scheduling, on a hand-driven clock: rescheduling earlier and later,
cancelling, what `on_timer` returns, crowded slots and deadlines past the wheel's span.
(tests/unit/test_wheel.py has the basics.)"""

from __future__ import annotations

import random
from collections.abc import Callable

from gateway.wheel import TimingWheel
from tests.support.fakes import ManualClock

TICK = 0.25
SLOTS = 64
SPAN = TICK * SLOTS  # 16 s
T0 = 1000.0


class Conn:
    """Like gateway.connection.Connection: its own `deadline`, which it may push later
    without touching the wheel; `on_timer` acts once that deadline has passed, or returns
    it to be woken again."""

    def __init__(self, deadline: float) -> None:
        self.timer_at = 0.0
        self.timer_slot = 0
        self.deadline = deadline
        self.woken: list[float] = []  # every on_timer call
        self.expired: list[float] = []  # the calls that found the deadline passed

    def on_timer(self, now: float) -> float | None:
        self.woken.append(now)
        if now >= self.deadline:
            self.expired.append(now)
            return None
        return self.deadline


class Scripted:
    """on_timer returns the given values in turn (a deadline, or None), then None."""

    def __init__(self, *returns: float | None) -> None:
        self.timer_at = 0.0
        self.timer_slot = 0
        self.returns = list(returns)
        self.woken: list[float] = []

    def on_timer(self, now: float) -> float | None:
        self.woken.append(now)
        return self.returns.pop(0) if self.returns else None


def make(on_tick: Callable[[], None] | None = None) -> tuple[ManualClock, TimingWheel]:
    loop = ManualClock(T0)
    wheel = TimingWheel(loop, tick_s=TICK, slots=SLOTS, on_tick=on_tick)  # type: ignore[arg-type]
    wheel.start()
    return loop, wheel


def on_time(fired: float, deadline: float) -> bool:
    """Not before the deadline, and no later than the tick after it."""
    return deadline <= fired <= deadline + TICK


def test_pushing_a_deadline_later_costs_one_early_wakeup_not_one_per_tick() -> None:
    loop, wheel = make()
    c = Conn(T0 + 1)
    wheel.schedule(c, c.deadline)
    c.deadline = T0 + 5  # e.g. a frame arrived: the idle deadline moves
    wheel.schedule(c, c.deadline)  # later than armed: nothing to do on the wheel
    loop.run_until(T0 + 4.9)
    assert len(c.woken) == 1 and on_time(c.woken[0], T0 + 1)
    assert c.expired == []
    loop.run_until(T0 + 20)
    assert len(c.woken) == 2 and len(c.expired) == 1 and on_time(c.expired[0], T0 + 5)


def test_rescheduling_earlier_fires_at_the_earlier_deadline_and_the_old_copy_is_ignored() -> None:
    loop, wheel = make()
    e = Scripted(T0 + 5)  # when woken early, it asks for its old deadline again
    wheel.schedule(e, T0 + 5)
    wheel.schedule(e, T0 + 1)  # earlier: armed in a second slot
    loop.run_until(T0 + 30)
    assert len(e.woken) == 2, e.woken  # the copy left in the +5 slot did not fire again
    assert on_time(e.woken[0], T0 + 1) and on_time(e.woken[1], T0 + 5)


def test_cancelling_then_arming_later_fires_only_at_the_later_deadline() -> None:
    """Connection.close: `timer_at = 0.0`, then schedule the close grace deadline."""
    loop, wheel = make()
    e = Scripted()
    wheel.schedule(e, T0 + 1)
    e.timer_at = 0.0
    wheel.schedule(e, T0 + 3)
    loop.run_until(T0 + 30)
    assert len(e.woken) == 1 and on_time(e.woken[0], T0 + 3)


def test_a_cancelled_entry_stays_silent_for_good() -> None:
    loop, wheel = make()
    e = Scripted(T0 + 2)
    wheel.schedule(e, T0 + 1)
    e.timer_at = 0.0
    loop.run_until(T0 + 3 * SPAN)  # the slot comes round three times
    assert e.woken == []


def test_on_timer_returning_none_disarms_and_the_entry_can_be_armed_again() -> None:
    loop, wheel = make()
    e = Scripted(None)
    wheel.schedule(e, T0 + 1)
    loop.run_until(T0 + 2 * SPAN)
    assert len(e.woken) == 1
    assert e.timer_at == 0.0  # disarmed: a schedule for any deadline arms it
    wheel.schedule(e, loop.now + 10)
    loop.run_until(loop.now + 11)
    assert len(e.woken) == 2 and on_time(e.woken[1], T0 + 2 * SPAN + 10)


def test_on_timer_returning_a_new_deadline_re_arms_for_it() -> None:
    loop, wheel = make()
    e = Scripted(T0 + 2.1, T0 + 40.3, None)  # the second is past the wheel's span
    wheel.schedule(e, T0 + 1)
    loop.run_until(T0 + 100)
    assert len(e.woken) == 3
    assert [on_time(w, d) for w, d in zip(e.woken, (T0 + 1, T0 + 2.1, T0 + 40.3), strict=True)] == [
        True,
        True,
        True,
    ]


def test_a_deadline_already_due_fires_on_the_next_tick_not_in_a_loop() -> None:
    loop, wheel = make()
    e = Scripted(T0, T0, T0)  # always "due now"
    wheel.schedule(e, T0 - 10)  # already past
    loop.run_until(T0 + TICK)
    assert e.woken == [T0 + TICK]  # once per tick, however due the deadline
    loop.run_until(T0 + 10)
    assert e.woken == [T0 + TICK * k for k in (1, 2, 3, 4)]


def test_many_entries_in_one_slot_each_fire_once() -> None:
    loop, wheel = make()
    stop = [Scripted(None) for _ in range(500)]
    again = [Scripted(T0 + 3, None) for _ in range(500)]
    cancelled = [Scripted() for _ in range(100)]
    for e in [*stop, *again, *cancelled]:
        wheel.schedule(e, T0 + 1)
    for e in cancelled:
        e.timer_at = 0.0
    loop.run_until(T0 + 2)
    assert all(len(e.woken) == 1 and on_time(e.woken[0], T0 + 1) for e in [*stop, *again])
    loop.run_until(T0 + 3 * SPAN)
    assert all(len(e.woken) == 1 for e in stop)
    assert all(len(e.woken) == 2 and on_time(e.woken[1], T0 + 3) for e in again)
    assert all(e.woken == [] for e in cancelled)


def test_deadlines_far_past_the_span_are_not_woken_early() -> None:
    loop, wheel = make()
    e = Scripted()
    deadline = T0 + 3.5 * SPAN + 0.1  # the cursor wraps three times before it is due
    wheel.schedule(e, deadline)
    loop.run_until(deadline - 0.01)
    assert e.woken == []  # going round is the wheel's business, not the entry's
    loop.run_until(deadline + 1)
    assert len(e.woken) == 1 and on_time(e.woken[0], deadline)


def test_random_deadlines_over_many_spans_each_fire_once_on_time() -> None:
    rng = random.Random(13)
    loop, wheel = make()
    entries: list[tuple[Scripted, float]] = []
    for _ in range(400):
        e = Scripted()
        deadline = T0 + rng.uniform(0, 6 * SPAN)
        wheel.schedule(e, deadline)
        entries.append((e, deadline))
    loop.run_until(T0 + 7 * SPAN)
    late_or_early = [
        (d, e.woken) for e, d in entries if len(e.woken) != 1 or not on_time(e.woken[0], d)
    ]
    assert late_or_early == []


def test_a_stalled_loop_fires_everything_due_in_one_callback() -> None:
    loop, wheel = make()
    entries = [Scripted() for _ in range(8)]
    for i, e in enumerate(entries):
        wheel.schedule(e, T0 + 1 + i)
    loop.stall_to(T0 + 20)  # the loop was busy for 20 s: one late callback
    loop.run_until(T0 + 20)
    assert [e.woken for e in entries] == [[T0 + 20]] * 8


def test_on_tick_runs_once_per_callback_after_the_entries_it_fired() -> None:
    """The node batches the route renewals that on_timer queued in on_tick."""
    events: list[str] = []
    loop, wheel = make(on_tick=lambda: events.append("tick"))

    class Renewing(Scripted):
        def on_timer(self, now: float) -> float | None:
            events.append("renew")
            return None

    for _ in range(3):
        wheel.schedule(Renewing(), T0 + 0.4)  # due in the slot of T0 + 0.5
    loop.run_until(T0 + 0.5)
    assert events == ["tick", "renew", "renew", "renew", "tick"]


def test_stop_cancels_the_loop_timer_and_nothing_fires_after_it() -> None:
    loop, wheel = make()
    e = Scripted()
    wheel.schedule(e, T0 + 1)
    loop.run_until(T0 + 0.5)
    wheel.stop()
    assert loop.pending() == []
    loop.run_until(T0 + 3 * SPAN)
    assert e.woken == []


def test_start_twice_keeps_one_loop_timer() -> None:
    loop, wheel = make()
    wheel.start()
    assert len(loop.pending()) == 1


def held(wheel: TimingWheel) -> int:
    return sum(len(slot) for slot in wheel._slots)


def test_a_copy_left_in_an_old_slot_is_dropped_when_that_slot_comes_round() -> None:
    """Entries are never removed from a slot, so a moved deadline leaves a copy behind; it
    must cost one list slot until its slot fires, not come back into the wheel."""
    loop, wheel = make()
    e = Scripted()
    wheel.schedule(e, T0 + 1)
    e.timer_at = 0.0  # cancelled, then armed later (Connection.close does this)
    wheel.schedule(e, T0 + 3)
    assert held(wheel) == 2
    loop.run_until(T0 + 1.5)  # the old slot came round
    assert held(wheel) == 1 and e.woken == []
    loop.run_until(T0 + 4)
    assert held(wheel) == 0 and len(e.woken) == 1


class Faulty:
    def __init__(self) -> None:
        self.timer_at = 0.0
        self.timer_slot = 0

    def on_timer(self, now: float) -> float | None:
        raise RuntimeError("bug")


def test_an_entry_that_raises_stops_neither_its_slot_nor_the_wheel() -> None:
    errors: list[tuple[object, Exception]] = []
    ticks: list[float] = []
    loop = ManualClock(T0)
    wheel = TimingWheel(
        loop,  # type: ignore[arg-type]
        tick_s=TICK,
        slots=SLOTS,
        on_tick=lambda: ticks.append(loop.now),
        on_error=lambda entry, e: errors.append((entry, e)),
    )
    wheel.start()
    bad, good, later = Faulty(), Conn(T0 + 1), Conn(T0 + 5)
    wheel.schedule(bad, T0 + 1)
    wheel.schedule(good, T0 + 1)  # the same slot, after the faulty entry
    wheel.schedule(later, T0 + 5)
    loop.advance(6)
    assert [entry for entry, _ in errors] == [bad]
    assert good.expired and later.expired  # the slot went on, and so did the wheel
    assert bad.timer_at == 0.0  # left disarmed
    assert ticks[-1] >= T0 + 5.75


def test_a_raising_tick_does_not_stop_the_wheel() -> None:
    errors: list[tuple[object, Exception]] = []

    def tick() -> None:
        raise RuntimeError("bug")

    loop = ManualClock(T0)
    wheel = TimingWheel(
        loop,  # type: ignore[arg-type]
        tick_s=TICK,
        slots=SLOTS,
        on_tick=tick,
        on_error=lambda entry, e: errors.append((entry, e)),
    )
    wheel.start()
    c = Conn(T0 + 2)
    wheel.schedule(c, T0 + 2)
    loop.advance(3)
    assert c.expired and len(errors) >= 8 and errors[0][0] is None
