"""Push badges (storage/badges.py): a remembered count, moved by what its window gained
and lost, equals a fresh count of the window, whatever the window does; a badge keeps a
uid's most recently active conversations; memory stays bounded."""

from __future__ import annotations

import random

import pytest

from storage.badges import BADGE_CONVS, BadgeCounts, Span, Window, badge_totals, spans


def count(msgs: list[tuple[int, bool]], span: Span) -> int:
    """What a store counts in `span` over a conversation's messages (sender, counts)."""
    uid, _, lo, hi = span
    return sum(1 for s, counts in msgs[lo:hi] if counts and s != uid)  # seq k at msgs[k-1]


@pytest.mark.parametrize("seed", range(20))
def test_a_remembered_count_moves_with_its_window(seed: int) -> None:
    rng = random.Random(seed)
    uid, conv = 7, 3
    msgs: list[tuple[int, bool]] = []
    counts = BadgeCounts()
    read = 0
    scan = rng.choice([3, 10, 50])
    for _ in range(200):
        msgs += [(rng.choice([uid, 8, 9]), rng.random() < 0.8) for _ in range(rng.randint(0, 5))]
        step = rng.random()
        if step < 0.2:
            read = rng.randint(read, len(msgs))  # a READ
        elif step < 0.23:
            read = rng.randint(0, read)  # left and rejoined further back
        hi = len(msgs)
        if hi <= read:
            continue
        w = Window(uid, conv, hi, max(read, hi - scan), hi)
        plans = counts.plan([w])
        got = counts.badges(plans, {s: count(msgs, s) for s in spans(plans)})
        want = count(msgs, (uid, conv, w.lo, w.hi))
        assert got.get(uid, 0) == want


def test_counts_only_what_a_sliding_window_gained_and_lost() -> None:
    counts = BadgeCounts()
    first = counts.plan([Window(1, 2, 0, 0, 100)])
    assert spans(first) == [(1, 2, 0, 100)]
    counts.badges(first, {(1, 2, 0, 100): 40})
    later = counts.plan([Window(1, 2, 0, 3, 103)])
    assert spans(later) == [(1, 2, 100, 103), (1, 2, 0, 3)]
    assert counts.badges(later, {(1, 2, 100, 103): 2, (1, 2, 0, 3): 1}) == {1: 41}
    assert spans(counts.plan([Window(1, 2, 0, 3, 103)])) == []  # nothing new: no query


def test_a_badge_sums_the_most_recently_active_conversations() -> None:
    rows = [(1, active, conv, 2) for conv, active in enumerate(range(BADGE_CONVS + 5))]
    rows.append((1, -1, 999, 1_000))  # the least recently active: left out
    rows.append((2, 5, 1, 0))  # nothing unread: no badge
    assert badge_totals(rows) == {1: 2 * BADGE_CONVS}


def test_memory_is_bounded_and_forgets_the_least_recently_counted() -> None:
    counts = BadgeCounts(memory=3)
    for conv in range(5):
        plans = counts.plan([Window(1, conv, conv, 0, 10)])
        counts.badges(plans, {})
    assert len(counts) == 3
    assert spans(counts.plan([Window(1, 0, 0, 0, 10)])) == [(1, 0, 0, 10)]  # forgotten
    assert spans(counts.plan([Window(1, 4, 4, 0, 10)])) == []  # remembered
