"""PUSH_REGISTER, PUSH_UNREGISTER and MUTE (docs/protocol.md, Offline push), and the
registration LOGOUT removes. The decoder has checked the fields (protocol/parsers.py);
the store applies the rules (storage/push.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.handlers.base import require_member
from protocol.frames import Mute, Ok, PushRegister, PushRegisterOk, PushUnregister
from storage.errors import BackendUnavailable
from storage.push import PUSH_DEVICES_MAX

if TYPE_CHECKING:
    from gateway.ports import Services, Session


async def push_register(node: Services, conn: Session, f: PushRegister) -> None:
    await node.store.push_register(
        conn.uid, conn.device, f.provider, f.token, preview=f.preview, locale=f.locale,
        max_devices=PUSH_DEVICES_MAX,
    )  # fmt: skip
    conn.send(PushRegisterOk(f.rid))


async def push_unregister(node: Services, conn: Session, f: PushUnregister) -> None:
    await node.store.push_unregister(conn.uid, conn.device)
    conn.send(Ok(f.rid))


async def mute(node: Services, conn: Session, f: Mute) -> None:
    await require_member(node, f.conv_id, conn.uid)
    await node.store.set_mute(f.conv_id, conn.uid, f.until_ms)
    conn.send(Ok(f.rid))


async def unregister_at_logout(node: Services, uid: int, device: str) -> None:
    """LOGOUT: the device's registration goes with its session. Best effort: LOGOUT has
    no answer, so a store that cannot take it now leaves the registration, logged (an app
    that must be sure sends PUSH_UNREGISTER first)."""
    try:
        await node.store.push_unregister(uid, device)
    except BackendUnavailable as e:
        if (held := node.log_throttle.allow("logout push_unregister")) is not None:
            node.log.warning(
                "push registration kept at logout: store unavailable",
                uid=uid, device=device, error=str(e), similar_held_back=held,
            )  # fmt: skip
