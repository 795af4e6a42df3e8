"""The push rules both stores apply (storage/push.py), as pure functions."""

from __future__ import annotations

import hashlib

import pytest

from storage.push import (
    MUTE_FOREVER_MS,
    RegisterPlan,
    chunks,
    mute_until,
    plan_register,
    token_digest,
)


def test_a_first_registration_takes_the_clock() -> None:
    assert plan_register([], "a", 1000, max_devices=10) == RegisterPlan(1000, [])


def test_the_stamp_is_later_than_every_other_of_the_uid() -> None:
    rows = [("a", 1000), ("b", 1005)]
    assert plan_register(rows, "c", 1000, max_devices=10).stamp_ms == 1006
    assert plan_register(rows, "a", 999, max_devices=10).stamp_ms == 1006  # its own too
    assert plan_register(rows, "c", 2000, max_devices=10).stamp_ms == 2000


def test_the_least_recently_registered_make_room() -> None:
    rows = [(f"d{i}", 100 + i) for i in range(10)]
    assert plan_register(rows, "new", 0, max_devices=10).evicted == ["d0"]
    assert plan_register(rows, "d0", 0, max_devices=10).evicted == []  # an update
    assert plan_register(rows, "new", 0, max_devices=8).evicted == ["d0", "d1", "d2"]
    assert plan_register(rows, "d5", 0, max_devices=1).evicted == [
        f"d{i}" for i in range(10) if i != 5
    ]
    # equal stamps: the device name decides, not the order the rows were read in
    assert plan_register([("b", 1), ("a", 1)], "c", 0, max_devices=2).evicted == ["a"]


def test_max_devices_must_leave_room_for_the_new_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        plan_register([], "a", 0, max_devices=0)


@pytest.mark.parametrize(
    ("until", "now", "stored"),
    [
        (0, 5, None),
        (5, 5, None),
        (4, 5, None),
        (6, 5, 6),
        (2**63 - 1, 5, MUTE_FOREVER_MS),
        (2**64 - 1, 5, MUTE_FOREVER_MS),
    ],
)
def test_mute_until(until: int, now: int, stored: int | None) -> None:
    assert mute_until(until, now) == stored


def test_chunks_drop_repeats_and_split() -> None:
    assert chunks([3, 1, 3, 2, 1], 2) == [[3, 1], [2]]
    assert chunks([], 2) == []
    assert chunks(list(range(2500))) == [
        list(range(0, 1000)), list(range(1000, 2000)), list(range(2000, 2500))
    ]  # fmt: skip


def test_token_digest_is_the_sha256_of_the_utf8_bytes() -> None:
    assert token_digest("é") == hashlib.sha256(b"\xc3\xa9").digest()
    assert token_digest("ab") != token_digest("ab ")
