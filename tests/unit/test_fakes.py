"""The fakes in tests/support/fakes.py behave as the asyncio pieces they stand in for, so
that a protocol test on them means what it would on a socket."""

from __future__ import annotations

import asyncio

from tests.support.fakes import HIGH_WATER, LOW_WATER, FakeTransport, ManualClock


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.events: list[str] = []

    def pause_writing(self) -> None:
        self.events.append("pause_writing")

    def resume_writing(self) -> None:
        self.events.append("resume_writing")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append(f"lost:{exc!r}")


def test_writes_are_recorded_in_order_and_taken_by_the_peer() -> None:
    t = FakeTransport()
    t.write(b"ab")
    t.writelines([b"c", memoryview(b"de")])
    assert t.get_write_buffer_size() == 5
    assert t.take(3) == b"abc"
    assert t.take() == b"de"
    assert t.get_write_buffer_size() == 0
    assert bytes(t.written) == b"abcde"  # the whole history stays


def test_the_protocol_is_paused_past_the_high_mark_and_resumed_at_the_low_mark() -> None:
    p = Recorder()
    t = FakeTransport(p)
    t.write(b"x" * HIGH_WATER)
    assert p.events == []  # at the mark, not past it
    t.write(b"x")
    t.write(b"x" * 1000)
    assert p.events == ["pause_writing"]  # once
    t.take(HIGH_WATER + 1001 - LOW_WATER - 1)
    assert p.events == ["pause_writing"]  # one byte above the low mark
    t.take(1)
    assert p.events == ["pause_writing", "resume_writing"]
    t.set_write_buffer_limits(high=10, low=2)
    t.write(b"y" * 11)
    assert p.events[-1] == "pause_writing"


def test_close_and_abort_drop_later_writes_and_loss_is_delivered_once() -> None:
    p = Recorder()
    t = FakeTransport(p)
    t.write(b"last")
    t.close()
    assert t.is_closing()
    t.write(b"late")
    assert (bytes(t.written), t.late_writes) == (b"last", 1)
    assert p.events == []  # no connection_lost behind the test's back
    t.lose()
    t.lose()
    assert p.events == ["lost:None"]
    a = FakeTransport()
    a.write(b"unsent")
    a.abort()
    assert a.is_closing() and a.get_write_buffer_size() == 0


def test_reading_pauses_and_extra_info() -> None:
    t = FakeTransport(peername=("10.0.0.9", 4242))
    t.pause_reading()
    t.pause_reading()
    assert (t.is_reading(), t.pauses) == (False, 1)
    t.resume_reading()
    assert t.is_reading()
    assert t.get_extra_info("peername") == ("10.0.0.9", 4242)
    assert t.get_extra_info("ssl_object", "none") == "none"


def test_the_clock_runs_timers_in_time_then_call_order_and_skips_cancelled_ones() -> None:
    clock = ManualClock(100.0)
    ran: list[tuple[str, float]] = []
    clock.call_at(102.0, lambda: ran.append(("b", clock.time())))
    clock.call_later(1.0, lambda: ran.append(("a", clock.time())))
    clock.call_at(102.0, lambda: ran.append(("c", clock.time())))
    clock.call_at(101.5, lambda: ran.append(("x", clock.time()))).cancel()
    clock.stall_to(101.0)  # a busy loop: time passes, nothing runs
    assert ran == []
    clock.advance(5)
    assert ran == [("a", 101.0), ("b", 102.0), ("c", 102.0)]
    assert clock.time() == 106.0 and clock.pending() == []


def test_a_timer_set_by_a_timer_runs_in_the_same_advance_if_due() -> None:
    clock = ManualClock(0.0)
    ran: list[float] = []

    def tick() -> None:
        ran.append(clock.time())
        if len(ran) < 3:
            clock.call_later(0.5, tick)

    clock.call_later(0.5, tick)
    clock.advance(10)
    assert ran == [0.5, 1.0, 1.5]
