"""The rules of one GROUP_MEMBERS change, decided once for every store: who is added,
removed and leaves, in which order the events are written, the member limit, and who
owns the group afterwards. Pure: the stores apply the plan inside their transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from storage.errors import GroupFull


@dataclass(frozen=True, slots=True)
class MembershipPlan:
    events: list[tuple[str, list[int]]]  # ("added" | "removed" | "left", uids), in order
    owner: int  # the owner after the change (0 when the group is left empty)
    owner_before: int

    @property
    def owner_changed(self) -> bool:
        return self.owner != self.owner_before


def plan_change(
    active: Sequence[int],
    owner: int,
    by: int,
    add: Sequence[int],
    remove: Sequence[int],
    *,
    max_members: int,
) -> MembershipPlan:
    """`active`: the current members in join order. Members already present are not
    re-added, non-members are not removed, `by` removing itself is "left"; when the
    owner goes, the earliest remaining member becomes owner. GroupFull if the group
    would exceed `max_members`."""
    present = set(active)
    adds = [u for u in dict.fromkeys(add) if u not in present]
    removes = [u for u in dict.fromkeys(remove) if u in present and u != by]
    leaves = [by] if by in remove and by in present else []
    if len(present) - len(removes) - len(leaves) + len(adds) > max_members:
        raise GroupFull(f"groups hold at most {max_members} members")
    gone = set(removes) | set(leaves)
    new_owner = owner
    if owner in gone:
        remaining = [u for u in active if u not in gone] + adds
        new_owner = remaining[0] if remaining else 0
    events = [(e, uids) for e, uids in (("added", adds), ("removed", removes), ("left", leaves))]
    return MembershipPlan([(e, u) for e, u in events if u], new_owner, owner)
