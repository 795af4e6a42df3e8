"""Which messages of a conversation the app was given: duplicate suppression by seq."""

from __future__ import annotations

from typing import Final

SEEN_WINDOW: Final = 256
"""Seqs this far below the floor are still told apart (late pushes, SYNC races)."""
SEEN_CAP: Final = 2_048
"""Most seqs held per conversation before the record is trimmed."""


class SeenSeqs:
    """The seqs of one conversation the app was given, or sent itself.

    Every seq <= `floor` counts as handled, except that a seq within SEEN_WINDOW below
    the floor is only a duplicate if `recent` holds it: the floor may jump (a SYNC
    baseline, a catch-up PULL) past pushes still in flight, and pushes from different
    senders arrive out of order. `floor` advances over consecutive seqs in `recent`, so
    after a lost connection the client pulls from the first seq it may have missed.
    """

    __slots__ = ("floor", "recent")

    def __init__(self) -> None:
        self.floor = 0
        self.recent: set[int] = set()

    def add(self, seq: int) -> bool:
        """Record `seq`; False if it was handled before (a duplicate)."""
        recent = self.recent
        if seq <= self.floor - SEEN_WINDOW or seq in recent:
            return False
        recent.add(seq)
        self._compact()
        return True

    def skip_to(self, seq: int) -> None:
        """Everything up to `seq` is handled (listed in a SYNC baseline, or pulled)."""
        if seq > self.floor:
            self.floor = seq
            self._compact()

    def _compact(self) -> None:
        floor, recent = self.floor, self.recent
        while floor + 1 in recent:
            floor += 1
        self.floor = floor
        if len(recent) > SEEN_CAP:
            low = floor - SEEN_WINDOW
            self.recent = recent = {s for s in recent if s > low}
            if len(recent) > SEEN_CAP // 2:
                # The floor is stuck below a hole with many seqs after it: a seq gap.
                self.floor = sorted(recent)[-SEEN_WINDOW]
                low = self.floor - SEEN_WINDOW
                self.recent = {s for s in recent if s > low}
