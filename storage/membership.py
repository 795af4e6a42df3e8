"""The rules of membership, decided once for every store. Pure: the stores apply them
inside their transactions and queries.

- One GROUP_MEMBERS change (`plan_change`): who is added, removed and leaves, in which
  order the events are written, the member limit, and who owns the group afterwards.
- Showing up (`shown_up_sql`, `start_read_seq`): a member has shown up in a conversation
  once its read position reaches the message that let it in (its `joined_seq`). Only
  what a member did counts: reading there, or creating the group (the creator starts
  at its own "created" message). Being added, a p2p opened by someone else, or owning a
  group by inheritance (the owner left) shows nothing. Presence answers only about
  members who have shown up in a conversation shared with the asker, and a user's
  conversation quota counts only the groups it has shown up in (and its p2ps).
"""

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


def start_read_seq(pos: int, seq: int) -> int:
    """The read position of the member at `pos` of a group's "created" message `seq`:
    the creator (position 0) has seen its own creation, so it starts at it, shown up;
    everyone it named starts just before it, as a member added later does."""
    return seq if pos == 0 else seq - 1


def shown_up_sql(member: str) -> str:
    """Whether the im_conv_member row `member` (a table alias) has shown up, as SQL
    (MySQL and SQLite alike)."""
    return f"{member}.read_seq >= {member}.joined_seq"
