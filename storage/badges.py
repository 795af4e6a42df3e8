"""Push badges (`ChatStore.unread_badges`): each push event recipient's unread count, at
a cost that does not grow with what the user left unread. Pure: the stores run the SQL
and hand the rows here.

A badge sums, over the user's BADGE_CONVS most recently active conversations with
anything above their read position, the messages that count as unread (storage/rules.py)
among each one's latest BADGE_SCAN: a conversation adds at most BADGE_SCAN (an app shows
"99+"). Messages moved to the archive tier are not counted; SYNC gives exact counts.

Each conversation's window is the seqs lo < seq <= hi, lo = max(read position,
hi - BADGE_SCAN). A user who gets push events is offline, so their windows slide with
each message while their read positions stay: `BadgeCounts` remembers the last count of
each (uid, conversation) and its window, and counts only what the window gained and
lost since (a message or two a batch, where a full count reads BADGE_SCAN index
entries). Stored messages never change sender or type, so a count stays right; one the
archiver or retention removed from under a remembered window stays counted until the
window slides past it. A window that moved back (the user left and rejoined) or past
the remembered one is counted afresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from storage.rules import unread_types_sql

BADGE_CONVS: Final = 100  # a badge counts this many of a user's conversations
BADGE_SCAN: Final = 100  # and, in each, the unread among its latest this many messages
BADGE_MEMORY: Final = 100_000  # (uid, conversation) counts remembered, about 20 MB
RANGES_PER_QUERY: Final = 500
_UNREAD: Final = unread_types_sql()


@dataclass(frozen=True, slots=True)
class Window:
    """The seqs lo < seq <= hi of `conv_id` whose unread messages count for `uid`."""

    uid: int
    conv_id: int
    last_active_ms: int
    lo: int
    hi: int


# A range of seqs to count for a uid: (uid, conv_id, lo, hi), lo < seq <= hi.
Span = tuple[int, int, int, int]


def windows_sql(uids: int, mark: str, *, greatest: str) -> str:
    """For `uids` uids (the parameters), rows (uid, last_active_ms, conv_id, lo, hi): the
    window of each of their BADGE_CONVS most recently active conversations with messages
    above their read position. No subtraction goes below zero (MySQL's columns are
    unsigned); `greatest` is the engine's two-argument maximum."""
    return f"""SELECT uid, last_active, conv_id, lo, hi FROM (
  SELECT m.uid AS uid, m.conv_id AS conv_id, s.last_active_ms AS last_active,
    {greatest}(m.read_seq + {BADGE_SCAN}, s.max_seq) - {BADGE_SCAN} AS lo, s.max_seq AS hi,
    ROW_NUMBER() OVER (PARTITION BY m.uid
                       ORDER BY s.last_active_ms DESC, m.conv_id DESC) AS n
  FROM im_conv_member m JOIN im_conv_seq s ON s.conv_id = m.conv_id
  WHERE m.uid IN ({",".join([mark] * uids)}) AND m.left_seq IS NULL
    AND s.max_seq > m.read_seq
) r WHERE n <= {BADGE_CONVS}"""


def count_one_sql(mark: str) -> str:
    """The count of one span, its parameters conv_id, lo, hi, uid: for an engine that
    runs a prepared statement cheaper than it parses a long one (SQLite)."""
    return (
        f"SELECT COUNT(*) FROM im_message WHERE conv_id={mark} AND seq>{mark} "
        f"AND seq<={mark} AND sender_uid<>{mark} AND {_UNREAD}"
    )


def count_sql(spans: Sequence[Span], table: str = "im_message", first: int = 0) -> str:
    """Rows (k, count), one per span of `spans` numbered from `first`: the messages of
    `table` in the span from others than its uid that count as unread. One bounded
    range of the (conv_id, seq) index each. `spans` hold only integers (uids as the
    table stores them), written into the statement: one round trip for a server over
    the network (MySQL)."""
    return " UNION ALL ".join(
        f"SELECT {k:d} AS k, COUNT(*) AS n FROM {table} WHERE conv_id={c:d} AND seq>{lo:d} "
        f"AND seq<={hi:d} AND sender_uid<>{u:d} AND {_UNREAD}"
        for k, (u, c, lo, hi) in enumerate(spans, first)
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """How to count a window: `base` (the remembered count, or 0) plus what `add` holds,
    less what `sub` holds."""

    window: Window
    base: int
    add: Span | None
    sub: Span | None = None


class BadgeCounts:
    """The last count of each (uid, conversation) and its window, at most BADGE_MEMORY
    of them (the least recently counted are forgotten first). Plans are made from what
    is remembered when they are made, so calls may interleave."""

    def __init__(self, memory: int = BADGE_MEMORY) -> None:
        self._memory = memory
        self._known: dict[tuple[int, int], tuple[int, int, int]] = {}  # -> lo, hi, count

    def __len__(self) -> int:
        return len(self._known)

    def plan(self, windows: Iterable[Window]) -> list[Plan]:
        """For a remembered window, count what it lost and what it gained since; for
        any other, the whole window."""
        out: list[Plan] = []
        for w in windows:
            known = self._known.get((w.uid, w.conv_id))
            if known is not None and known[0] <= w.lo <= known[1] <= w.hi:
                lo, hi, n = known
                add = (w.uid, w.conv_id, hi, w.hi) if w.hi > hi else None
                sub = (w.uid, w.conv_id, lo, w.lo) if w.lo > lo else None
                out.append(Plan(w, n, add, sub))
            else:
                out.append(Plan(w, 0, (w.uid, w.conv_id, w.lo, w.hi)))
        return out

    def badges(self, plans: Iterable[Plan], counted: Mapping[Span, int]) -> dict[int, int]:
        """Each uid's badge from `plans` and the counts of their `spans` (one missing
        counts 0), remembering each window's count."""
        rows: list[tuple[int, int, int, int]] = []
        known = self._known
        for p in plans:
            w = p.window
            n = p.base
            if p.add is not None:
                n += counted.get(p.add, 0)
            if p.sub is not None:
                n -= counted.get(p.sub, 0)
            known.pop((w.uid, w.conv_id), None)
            known[(w.uid, w.conv_id)] = (w.lo, w.hi, n)
            rows.append((w.uid, w.last_active_ms, w.conv_id, n))
        while len(known) > self._memory:
            del known[next(iter(known))]
        return badge_totals(rows)


def spans(plans: Iterable[Plan]) -> list[Span]:
    """The spans `plans` need counted."""
    return [s for p in plans for s in (p.add, p.sub) if s is not None]


def badge_totals(rows: Iterable[tuple[int, int, int, int]]) -> dict[int, int]:
    """Each uid's badge from rows (uid, last_active_ms, conv_id, unread) of one server or
    several: the counts of its BADGE_CONVS most recently active conversations, summed;
    uids with nothing unread omitted."""
    per_uid: dict[int, list[tuple[int, int, int]]] = {}
    for uid, last_active, conv_id, n in rows:
        per_uid.setdefault(uid, []).append((last_active, conv_id, n))
    out: dict[int, int] = {}
    for uid, convs in per_uid.items():
        if len(convs) > BADGE_CONVS:
            convs = sorted(convs, reverse=True)[:BADGE_CONVS]
        if total := sum(n for _, _, n in convs):
            out[uid] = total
    return out
