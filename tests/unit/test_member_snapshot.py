"""The member snapshot's Redis encoding (storage/redis/cache.py) without Redis: what is
written is read back exactly, current members in their join order, former members with
the seq they left at. (Refused snapshots are tested in tests/redis/test_cache.py.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from storage.redis.cache import MemberSnapshot, decode_members, encode_members
from tests.support.tiers import examples

U64 = st.integers(min_value=1, max_value=2**64 - 1)
SEQ = st.integers(min_value=1, max_value=2**53)


@st.composite
def snapshots(draw: st.DrawFn) -> MemberSnapshot:
    uids = draw(st.lists(U64, unique=True, max_size=40))
    rows: dict[int, tuple[int, int | None]] = {}
    for uid in uids:
        joined = draw(SEQ)
        left = draw(st.none() | st.integers(min_value=joined, max_value=2**53))
        rows[uid] = (joined, left)
    current = [uid for uid in uids if rows[uid][1] is None]
    order = draw(st.permutations(current))
    return MemberSnapshot(draw(st.integers(0, 2**63)), draw(SEQ), rows, list(order))


@settings(max_examples=examples(200), deadline=None)
@given(snapshots())
def test_a_snapshot_reads_back_exactly(snap: MemberSnapshot) -> None:
    back = decode_members(snap.conv_id, snap.version, encode_members(snap))
    assert back == snap
    assert back.order == snap.order  # join order, not sorted


def test_a_former_member_keeps_its_seqs_and_is_not_current() -> None:
    snap = MemberSnapshot(5, 9, {3: (1, None), 1: (1, 4), 2: (6, None)}, [3, 2])
    back = decode_members(5, 9, encode_members(snap))
    assert back.rows[1] == (1, 4)
    assert back.order == [3, 2]
