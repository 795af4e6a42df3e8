"""Request handlers, one module per area; `dispatch` routes a decoded frame to its handler
and turns handler errors into ERROR frames."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from gateway.handlers import conversations, messaging, receipts, session, sync
from gateway.handlers.base import RequestError
from protocol import frames as fr
from protocol.ops import ErrorCode
from storage.models import BackendUnavailable

if TYPE_CHECKING:
    from gateway.connection import Connection
    from gateway.node import Node

Handler = Callable[["Node", "Connection", Any], Awaitable[None]]

HANDLERS: Final[dict[type, Handler]] = {
    fr.Login: session.login,
    fr.Ping: session.ping,
    fr.Logout: session.logout,
    fr.Send: messaging.send,
    fr.Pull: messaging.pull,
    fr.History: messaging.history,
    fr.Recall: messaging.recall,
    fr.Delivered: receipts.delivered,
    fr.Read: receipts.read,
    fr.Typing: receipts.typing,
    fr.Presence: receipts.presence,
    fr.Sync: sync.sync,
    fr.OpenP2P: conversations.open_p2p,
    fr.GroupCreate: conversations.group_create,
    fr.GroupMembers: conversations.group_members,
    fr.GroupInfo: conversations.group_info,
}


def dispatch_now(node: Node, conn: Connection, frame: Any) -> bool:
    """Handle `frame` at once if it has a synchronous path (the hot SEND); False if it
    must be queued for `dispatch`."""
    if type(frame) is fr.Send:
        return messaging.send_now(node, conn, frame)
    return False


async def dispatch(node: Node, conn: Connection, frame: Any) -> None:
    if type(frame) is fr.Invalid:
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
