"""The shard map's pure parts (storage/mysql/shardmap.py): ranges, owners, URLs."""

from __future__ import annotations

import pytest

from storage.models import NewMessage
from storage.mysql import MySQLSettings
from storage.mysql.shardmap import (
    ShardRange,
    masked,
    owners,
    ranges_of,
    same_place,
    server_settings,
    split,
)
from storage.rules import reused_elsewhere

A = "mysql://root@10.0.0.1:3306/imgw"
B = "mysql://root@10.0.0.2:3306/imgw"
C = "mysql://root@10.0.0.3:3307/imgw"


def test_split_gives_contiguous_ranges_as_even_as_they_divide() -> None:
    assert split(16, [A, B]) == [ShardRange(0, 7, A), ShardRange(8, 15, B)]
    assert split(16, [A, B, C]) == [
        ShardRange(0, 5, A),
        ShardRange(6, 10, B),
        ShardRange(11, 15, C),
    ]
    assert split(4, [A]) == [ShardRange(0, 3, A)]


@pytest.mark.parametrize(
    ("shards", "urls"),
    [
        (16, []),
        (16, [A, A]),
        (1, [A, B]),
        (16, ["redis://x/0"]),
        (16, [A + "?pool=3"]),
    ],
)
def test_split_refuses(shards: int, urls: list[str]) -> None:
    with pytest.raises(ValueError):
        split(shards, urls)


def test_owners_and_ranges_are_inverse() -> None:
    ranges = [ShardRange(0, 1, A), ShardRange(2, 2, B), ShardRange(3, 5, A)]
    owner = owners(ranges, 6)
    assert owner == [A, A, B, A, A, A]
    assert ranges_of(owner) == ranges


@pytest.mark.parametrize(
    "ranges",
    [
        [ShardRange(0, 2, A)],  # shard 3 on no server
        [ShardRange(0, 3, A), ShardRange(3, 3, B)],  # shard 3 twice
        [ShardRange(0, 4, A)],  # past the last shard
    ],
)
def test_owners_refuses_gaps_and_overlaps(ranges: list[ShardRange]) -> None:
    with pytest.raises(ValueError):
        owners(ranges, 4)


def test_server_settings_take_credentials_and_options_from_the_metadata_url() -> None:
    meta = MySQLSettings.from_url("mysql://app:s3cret@db0:3306/imgw?shards=8&pool=20&timeout=2")
    s = server_settings(meta, "mysql://db1:3307/imgw_b")
    assert (s.host, s.port, s.database) == ("db1", 3307, "imgw_b")
    assert (s.user, s.password, s.shards, s.pool, s.timeout_s) == ("app", "s3cret", 8, 20, 2.0)
    own = server_settings(meta, "mysql://other:pw@db1:3307/imgw_b")
    assert (own.user, own.password) == ("other", "pw")
    assert same_place(server_settings(meta, "mysql://x:y@db0:3306/imgw"), meta)
    assert not same_place(s, meta)


def test_masked_hides_the_password_only() -> None:
    assert masked("mysql://app:s3cret@db1:3307/imgw") == "mysql://app:***@db1:3307/imgw"
    assert masked(A) == A


def test_add_server_plan_takes_an_even_share_from_the_fullest() -> None:
    from storage.mysql.move import plan

    assert plan([A] * 4, B, None) == [A, A, B, B]
    assert plan([A, A, B, B], C, None) == [A, A, B, C]  # 4 // 3 = 1, from the last fullest
    assert plan([A] * 16, B, None) == [A] * 8 + [B] * 8
    assert plan([A] * 8 + [B] * 8, C, None).count(C) == 5
    assert plan([A] * 4, B, 1) == [A, A, A, B]
    with pytest.raises(ValueError):
        plan([A], B, None)  # nothing to spare
    with pytest.raises(ValueError):
        plan([A, B], C, 2)


def test_a_key_reused_for_a_conversation_elsewhere_is_found() -> None:
    """storage.rules.reused_elsewhere: conversations 1 and 3 on one server, 2 on
    another."""
    place = {1: "s1", 3: "s1", 2: "s2"}.__getitem__
    batch = [
        NewMessage(1, 7, "seen", 1, b""),  # recorded for 1: not a reuse (a move's copy)
        NewMessage(2, 7, "old", 1, b""),  # recorded for 1: reused
        NewMessage(1, 7, "new", 1, b""),
        NewMessage(2, 7, "new", 1, b""),  # first sent in this batch for 1 (elsewhere)
        NewMessage(3, 7, "new", 1, b""),  # same server as 1: its commit decides
        NewMessage(2, 8, "new", 1, b""),  # another sender
    ]
    recorded = {(7, "seen"): {1}, (7, "old"): {1}}
    assert reused_elsewhere(batch, recorded, place) == [1, 3]
    assert reused_elsewhere(batch, {}, place) == [3]
