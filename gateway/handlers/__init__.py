"""Request handlers, one module per area; `dispatch` routes a decoded frame to its handler
and turns handler errors into ERROR frames."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from gateway.handlers import conversations, media, messaging, push, receipts, session, sync
from gateway.handlers.base import RequestError
from protocol import frames as fr
from protocol.ops import ErrorCode
from storage.errors import BackendUnavailable

if TYPE_CHECKING:
    from gateway.ports import Services, Session

F = TypeVar("F")
Handler = Callable[["Services", "Session", Any], Awaitable[None]]  # takes its own frame type


def _on(
    frame_type: type[F], handler: Callable[[Services, Session, F], Awaitable[None]]
) -> tuple[type[F], Handler]:
    """One table entry; mypy checks that `handler` takes `frame_type`."""
    return frame_type, handler


HANDLERS: Final[dict[type, Handler]] = {}
for _type, _handler in (
    _on(fr.Login, session.login),
    _on(fr.Ping, session.ping),
    _on(fr.Logout, session.logout),
    _on(fr.Send, messaging.send),
    _on(fr.Pull, messaging.pull),
    _on(fr.History, messaging.history),
    _on(fr.Recall, messaging.recall),
    _on(fr.Delivered, receipts.delivered),
    _on(fr.Read, receipts.read),
    _on(fr.Typing, receipts.typing),
    _on(fr.Presence, receipts.presence),
    _on(fr.Sync, sync.sync),
    _on(fr.OpenP2P, conversations.open_p2p),
    _on(fr.GroupCreate, conversations.group_create),
    _on(fr.GroupMembers, conversations.group_members),
    _on(fr.GroupInfo, conversations.group_info),
    _on(fr.MediaUpload, media.media_upload),
    _on(fr.MediaGet, media.media_get),
    _on(fr.PushRegister, push.push_register),
    _on(fr.PushUnregister, push.push_unregister),
    _on(fr.Mute, push.mute),
):
    HANDLERS[_type] = _handler


def dispatch_now(node: Services, conn: Session, frame: object) -> bool:
    """Handle `frame` at once if it has a synchronous path (the hot SEND); False if it
    must be queued for `dispatch`."""
    if type(frame) is fr.Send:
        return messaging.send_now(node, conn, frame)
    return False


async def dispatch(node: Services, conn: Session, frame: object) -> None:
    if isinstance(frame, fr.Invalid):
        conn.error(frame.rid, frame.code, frame.text)
        return
    handler = HANDLERS.get(type(frame))
    rid: int = getattr(frame, "rid", 0)
    if handler is None:  # a server frame type: the decoder should have said so already
        conn.error(rid, ErrorCode.UNKNOWN_OP, "not a client op")
        return
    try:
        await handler(node, conn, frame)
    except RequestError as e:
        conn.error(rid, e.code, e.text)
    except BackendUnavailable as e:
        node.metrics.storage_errors.labels(op=type(frame).__name__.lower()).inc()
        op = type(frame).__name__
        if (held := node.log_throttle.allow(op)) is not None:
            node.log.warning("storage unavailable", op=op, error=str(e), similar_held_back=held)
        conn.error(rid, ErrorCode.UNAVAILABLE, "storage unavailable; retry later")
    except Exception as e:
        op = type(frame).__name__
        # one traceback a second per op and exception type: a client repeating a frame
        # that trips a bug must not flood the log
        if (held := node.log_throttle.allow(f"failed {op} {type(e).__name__}")) is not None:
            node.log.exception("handler failed", op=op, conn=conn.conn_id, similar_held_back=held)
        conn.error(rid, ErrorCode.INTERNAL, "internal error")
