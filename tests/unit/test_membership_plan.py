"""GROUP_MEMBERS rules as one pure plan (both stores apply it)."""

from __future__ import annotations

import pytest

from storage.membership import plan_change
from storage.models import GroupFull


def test_events_in_protocol_order_and_noops_skipped() -> None:
    plan = plan_change([1, 2, 3], 1, 1, add=[4, 2, 4], remove=[3, 9, 1], max_members=10)
    assert plan.events == [("added", [4]), ("removed", [3]), ("left", [1])]
    assert (plan.owner, plan.owner_changed) == (2, True)  # earliest remaining member


def test_nothing_to_change_writes_nothing() -> None:
    plan = plan_change([1, 2], 1, 1, add=[2], remove=[7], max_members=10)
    assert plan.events == [] and not plan.owner_changed


def test_owner_leaving_an_empty_group_leaves_no_owner() -> None:
    assert plan_change([1], 1, 1, add=[], remove=[1], max_members=10).owner == 0


def test_limit_counts_the_result() -> None:
    assert plan_change([1, 2], 1, 1, add=[3], remove=[2], max_members=2).events
    with pytest.raises(GroupFull):
        plan_change([1, 2], 1, 1, add=[3], remove=[], max_members=2)
