"""DELIVERED, READ, TYPING and PRESENCE.

DELIVERED, READ and TYPING carry no rid: their errors are answered with rid 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from gateway.handlers.base import RequestError, require_member
from protocol.codec import encode
from protocol.frames import (
    Delivered,
    Presence,
    PresenceResult,
    Read,
    ReadNotify,
    Typing,
    TypingNotify,
)
from protocol.ops import ConvKind, ErrorCode

if TYPE_CHECKING:
    from gateway.ports import Services, Session

NOTIFY_MAX_MEMBERS: Final = 100  # READ_NOTIFY / TYPING_NOTIFY go to others up to this size
PRESENCE_MAX_UIDS: Final = 1000


async def delivered(node: Services, conn: Session, f: Delivered) -> None:
    await require_member(node, f.conv_id, conn.uid)
    await node.store.set_delivered(f.conv_id, conn.uid, conn.device, f.seq)


async def read(node: Services, conn: Session, f: Read) -> None:
    await require_member(node, f.conv_id, conn.uid)
    moved = await node.store.set_read(f.conv_id, conn.uid, f.seq)
    if moved is None:
        return
    payload = encode(ReadNotify(f.conv_id, conn.uid, moved))
    conv = await node.store.get_conversation(f.conv_id)
    members = await node.store.member_uids(f.conv_id)
    if conv is not None and (conv.kind == ConvKind.P2P or len(members) <= NOTIFY_MAX_MEMBERS):
        node.deliver(members, payload, skip=conn)
    else:
        node.deliver([conn.uid], payload, skip=conn)  # the reader's other devices


async def typing(node: Services, conn: Session, f: Typing) -> None:
    await require_member(node, f.conv_id, conn.uid)
    members = await node.store.member_uids(f.conv_id)
    if len(members) > NOTIFY_MAX_MEMBERS:
        return
    others = [u for u in members if u != conn.uid]
    node.deliver(others, encode(TypingNotify(f.conv_id, conn.uid)))


async def presence(node: Services, conn: Session, f: Presence) -> None:
    asked = list(dict.fromkeys(f.uids))
    if len(asked) > PRESENCE_MAX_UIDS:
        raise RequestError(ErrorCode.BAD_REQUEST, f"at most {PRESENCE_MAX_UIDS} uids")
    others = [u for u in asked if u != conn.uid]
    visible = await node.store.shared_with(conn.uid, others)
    visible.add(conn.uid)
    online = await node.routes.online([u for u in asked if u in visible])
    entries = tuple((u, tuple(sorted(r.device for r in online.get(u, ())))) for u in asked)
    conn.send(PresenceResult(f.rid, entries))
