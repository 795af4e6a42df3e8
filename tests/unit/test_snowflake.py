"""Snowflake ids: monotonic per generator, and no id at all while the worker id is lost."""

from __future__ import annotations

import pytest

from storage.models import StoreUnavailable
from storage.snowflake import SEQ_BITS, Snowflake


def test_ids_increase_and_carry_the_worker_id() -> None:
    ids = Snowflake(7)
    seq = [ids.next_id(now_ms=1_800_000_000_000) for _ in range(5)]
    assert seq == sorted(set(seq))
    assert all((i >> SEQ_BITS) & 0x3FF == 7 for i in seq)
    back = ids.next_id(now_ms=1_700_000_000_000)  # the clock stepped back
    assert back > seq[-1]


def test_a_suspended_generator_refuses_until_it_has_a_worker_id_again() -> None:
    ids = Snowflake(3)
    ids.suspend()
    with pytest.raises(StoreUnavailable, match="lease lost"):
        ids.next_id()
    ids.worker_id = 9
    assert (ids.next_id() >> SEQ_BITS) & 0x3FF == 9
