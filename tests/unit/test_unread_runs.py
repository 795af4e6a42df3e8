"""What an archived batch leaves for unread counts, and counting from it (storage/rules.py:
`unread_runs`, `count_in_runs`), against counting the messages themselves."""

from __future__ import annotations

import random

from protocol.ops import MsgType
from storage.models import StoredMessage
from storage.rules import count_in_runs, counts_as_unread, pack_seqs, unpack_seqs, unread_runs

TYPES = (MsgType.TEXT, MsgType.TEXT, MsgType.IMAGE, MsgType.SYSTEM, MsgType.RECALL, 100)


def batch(rng: random.Random, lo: int, n: int) -> list[StoredMessage]:
    return [
        StoredMessage(7, seq, seq, rng.choice((0, 1, 2, 3)), rng.choice(TYPES), b"", 0, "")
        for seq in range(lo, lo + n)
    ]


def test_seqs_pack_small_and_come_back() -> None:
    seqs = [3, 4, 5, 90, 91, 5000, 5001, 1 << 40]
    assert unpack_seqs(pack_seqs(seqs)) == seqs
    assert len(pack_seqs(list(range(1000, 1100)))) < 110  # a byte a message when close


def test_runs_hold_the_messages_that_count_by_sender() -> None:
    msgs = [
        StoredMessage(7, 10, 1, 1, MsgType.TEXT, b"", 0, ""),
        StoredMessage(7, 11, 2, 0, MsgType.SYSTEM, b"", 0, ""),  # the server's: never counts
        StoredMessage(7, 12, 3, 2, MsgType.RECALL, b"", 0, ""),  # recalled, as archived
        StoredMessage(7, 13, 4, 1, MsgType.IMAGE, b"", 0, ""),
        StoredMessage(7, 14, 5, 2, 100, b"", 0, ""),
    ]
    runs = unread_runs(msgs)
    assert [(r.sender_uid, r.n, r.first, r.last, unpack_seqs(r.seqs)) for r in runs] == [
        (1, 2, 10, 13, [10, 13]),
        (2, 1, 14, 14, [14]),
    ]
    assert unread_runs([msgs[1]]) == []


def test_counting_from_runs_is_counting_the_messages() -> None:
    rng = random.Random(7)
    for _ in range(200):
        lo = rng.randint(1, 50)
        msgs = batch(rng, lo, rng.randint(1, 40))
        runs = unread_runs(msgs)
        for reader in (0, 1, 2, 3, 9):
            mine = [(r.n, r.first, r.last, r.seqs) for r in runs if r.sender_uid != reader]
            after = rng.randint(0, lo + 45)
            upto = rng.randint(after, lo + 50)
            want = sum(
                after < m.seq <= upto and counts_as_unread(m.msg_type) and m.sender_uid != reader
                for m in msgs
            )
            assert count_in_runs(mine, after, upto) == want, (after, upto, reader)
