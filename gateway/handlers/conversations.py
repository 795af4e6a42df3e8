"""OPEN_P2P, GROUP_CREATE, GROUP_MEMBERS and GROUP_INFO."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from gateway.handlers.base import RequestError, require_member
from protocol.frames import (
    ConvOk,
    GroupCreate,
    GroupInfo,
    GroupInfoResult,
    GroupMembers,
    Ok,
    OpenP2P,
)
from protocol.ops import ConvKind, ErrorCode
from storage.errors import GroupFull
from storage.models import Conversation, StoredMessage

if TYPE_CHECKING:
    from gateway.ports import Services, Session

GROUP_MAX_MEMBERS: Final = 1000
TITLE_MAX_BYTES: Final = 256


async def open_p2p(node: Services, conn: Session, f: OpenP2P) -> None:
    if f.peer_uid == conn.uid:
        raise RequestError(ErrorCode.BAD_REQUEST, "cannot open a conversation with yourself")
    conv_id = await node.store.find_p2p(conn.uid, f.peer_uid)
    if conv_id is None:  # a new conversation for both: within max_conversations
        await _check_room(node, [conn.uid, f.peer_uid])
        conv_id = await node.store.open_p2p(conn.uid, f.peer_uid)
    conn.send(ConvOk(f.rid, conv_id))


async def _check_room(node: Services, uids: Sequence[int]) -> None:
    """Every uid joining by its own doing may be in one conversation more
    (max_conversations). A quota counts the p2ps and the groups a user has shown up in
    (`Store.conversation_counts`): being put in a group takes none of it, so strangers
    cannot fill it; the p2p counts for both sides, one per pair."""
    cap = node.config.max_conversations
    counts = await node.store.conversation_counts(uids)
    full = sorted(u for u, n in counts.items() if n >= cap)
    if full:
        shown = ", ".join(map(str, full[:10]))
        raise RequestError(
            ErrorCode.FORBIDDEN, f"in {cap} conversations already (the most allowed): {shown}"
        )


async def group_create(node: Services, conn: Session, f: GroupCreate) -> None:
    if len(f.title.encode()) > TITLE_MAX_BYTES:
        raise RequestError(ErrorCode.BAD_REQUEST, f"title over {TITLE_MAX_BYTES} bytes")
    members = list(dict.fromkeys([conn.uid, *f.uids]))
    if len(members) > GROUP_MAX_MEMBERS:
        raise RequestError(ErrorCode.BAD_REQUEST, f"groups hold at most {GROUP_MAX_MEMBERS}")
    await _check_room(node, [conn.uid])  # the others join when they read there
    if not node.group_limiter.take(conn.uid):
        raise RequestError(
            ErrorCode.RATE_LIMITED,
            f"at most {node.config.groups_per_day} new groups a day; try again later",
        )
    conv_id, created = await node.store.create_group(conn.uid, f.title, members)
    conn.send(ConvOk(f.rid, conv_id))
    node.push_message(created)


async def _group(node: Services, conv_id: int) -> Conversation:
    conv = await node.store.get_conversation(conv_id)
    if conv is None:
        raise RequestError(ErrorCode.NO_SUCH_CONVERSATION, f"no conversation {conv_id}")
    if conv.kind != ConvKind.GROUP:
        raise RequestError(ErrorCode.BAD_REQUEST, f"conversation {conv_id} is not a group")
    return conv


async def group_members(node: Services, conn: Session, f: GroupMembers) -> None:
    conv = await _group(node, f.conv_id)
    await require_member(node, f.conv_id, conn.uid)
    if set(f.add) & set(f.remove):
        raise RequestError(ErrorCode.BAD_REQUEST, "a uid is in both the add and remove lists")
    others_removed = [u for u in f.remove if u != conn.uid]
    if (f.add or others_removed) and conv.owner_uid != conn.uid:
        raise RequestError(ErrorCode.FORBIDDEN, "only the owner may add or remove others")
    before = await node.store.member_uids(f.conv_id)
    present = set(before)
    new = {u for u in f.add if u not in present}
    if len(present) + len(new) > GROUP_MAX_MEMBERS:
        raise RequestError(ErrorCode.BAD_REQUEST, f"groups hold at most {GROUP_MAX_MEMBERS}")
    try:  # checked again under the group's lock: concurrent adds can't overshoot
        change = await node.store.change_members(
            f.conv_id, conn.uid, f.add, f.remove, max_members=GROUP_MAX_MEMBERS
        )
    except GroupFull as e:
        raise RequestError(ErrorCode.BAD_REQUEST, str(e)) from e
    conn.send(Ok(f.rid))
    if change.messages:
        # Everyone who was or is a member hears of it: removed members get their removal.
        after = await node.store.member_uids(f.conv_id)
        audience = list(dict.fromkeys([*before, *after]))
        for msg in change.messages:
            node.push_message(msg, uids=audience)


async def set_title(node: Services, by: int, conv_id: int, title: str) -> StoredMessage:
    """Set a group's title as its owner `by` (the server API: no TCP op sets it), and
    push the "titled" system message to every member."""
    if len(title.encode()) > TITLE_MAX_BYTES:
        raise RequestError(ErrorCode.BAD_REQUEST, f"title over {TITLE_MAX_BYTES} bytes")
    await _group(node, conv_id)
    await require_member(node, conv_id, by)
    msg = await node.store.set_title(conv_id, by, title)
    if msg is None:  # checked under the group's lock: the owner may have changed
        raise RequestError(ErrorCode.FORBIDDEN, "only the owner may set the title")
    node.push_message(msg)
    return msg


async def group_info(node: Services, conn: Session, f: GroupInfo) -> None:
    conv = await _group(node, f.conv_id)
    await require_member(node, f.conv_id, conn.uid)
    members = await node.store.member_uids(f.conv_id)
    conn.send(GroupInfoResult(f.rid, f.conv_id, conv.title, conv.owner_uid, tuple(members)))
