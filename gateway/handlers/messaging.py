"""SEND, PULL, HISTORY and RECALL."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Final

from gateway.handlers.base import (
    RequestError,
    membership_error,
    page_limit,
    require_member,
    require_reader,
)
from gateway.handlers.media import check_media_send
from protocol.frames import (
    History,
    HistoryResult,
    MsgRecord,
    Pull,
    PullResult,
    Recall,
    RecallOk,
    Send,
    SendAck,
)
from protocol.mediakeys import key_of_content
from protocol.ops import (
    CAP_CONTENT_DENIED,
    CAP_OUTCOME_UNKNOWN,
    MEDIA_MSG_TYPES,
    ErrorCode,
    MsgType,
    is_client_msg_type,
)
from storage.errors import BackendUnavailable, StoreOutcomeUnknown
from storage.models import (
    AppendFailed,
    AppendResult,
    AppendStatus,
    NewMessage,
    RecallStatus,
    StoredMessage,
)
from storage.rules import SERVER_UID

if TYPE_CHECKING:
    from gateway.ports import Services, Session

MSG_LIMIT_DEFAULT: Final = 50
MSG_LIMIT_MAX: Final = 200
_CONFLICT: Final = "client_msg_id already used for a different message"


def _ack(rid: int, m: StoredMessage) -> SendAck:
    return SendAck(rid, m.conv_id, m.seq, m.msg_id, m.server_ms)


def _record(m: StoredMessage) -> MsgRecord:
    return MsgRecord(
        m.seq, m.msg_id, m.sender_uid, m.msg_type, m.content, m.server_ms, m.client_msg_id
    )


async def _answer_resend(node: Services, conn: Session, f: Send) -> bool:
    """If this (sender, client_msg_id) was stored before, answer as the original send did
    and return True. Checked before refusing a send, so a retry of an acked message is
    acked again whatever changed since (membership, rate)."""
    prior = await node.store.find_sent(conn.uid, f.client_msg_id)
    if prior is None:
        return False
    if prior.same_send(f.conv_id, f.msg_type, f.content):
        node.metrics.sends.labels(result="duplicate").inc()
        conn.send(SendAck(f.rid, prior.conv_id, prior.seq, prior.msg_id, prior.server_ms))
    else:
        conn.error(f.rid, ErrorCode.IDEMPOTENCY_CONFLICT, _CONFLICT)
    return True


_OUTCOME_UNKNOWN: Final = (
    "the store did not confirm whether it stored this message; send it again with the same "
    "client_msg_id to learn"
)


_DENIED: Final = "the content check refused this message; it was not stored"


def _check_send(node: Services, uid: int, f: Send) -> None:
    # The server (the server API's system messages) sends type system; clients never.
    if not is_client_msg_type(f.msg_type) and (uid, f.msg_type) != (SERVER_UID, MsgType.SYSTEM):
        raise RequestError(ErrorCode.BAD_MSG_TYPE, f"msg_type {f.msg_type} is reserved")
    if len(f.content) > node.config.max_content:
        raise RequestError(
            ErrorCode.CONTENT_TOO_LARGE, f"content over {node.config.max_content} bytes"
        )
    if node.batcher.pending >= node.config.max_pending_sends:
        # Shed load rather than queue without bound: latency would grow without limit.
        node.metrics.sends.labels(result="overloaded").inc()
        raise RequestError(ErrorCode.UNAVAILABLE, "gateway overloaded; retry with the same id")


def _submit(node: Services, conn: Session, f: Send) -> None:
    # Idempotency and membership are checked in the commit itself (see ChatStore.append):
    # no round trip per message before it, and no window between check and commit.
    msg = NewMessage(f.conv_id, conn.uid, f.client_msg_id, f.msg_type, f.content)
    fut = node.batcher.submit(msg)
    fut.add_done_callback(functools.partial(_committed, node, conn, f, node.loop.time()))
    if node.batcher.pending >= node.config.send_backpressure:
        conn.hold_sends()


def send_now(node: Services, conn: Session, f: Send) -> bool:
    """SEND without a task, for a connection with nothing queued: True when handled;
    False when it must take the queued path (rate limited: a resend lookup may answer)."""
    if node.media is not None and f.msg_type in MEDIA_MSG_TYPES:
        return False  # a media key is checked first, which awaits the media index
    try:
        _check_send(node, conn.uid, f)
    except RequestError as e:
        conn.error(f.rid, e.code, e.text)
        return True
    if not node.limiter.take(conn.uid):
        return False
    _submit(node, conn, f)
    return True


async def send(node: Services, conn: Session, f: Send) -> None:
    _check_send(node, conn.uid, f)
    if not node.limiter.take(conn.uid):
        if await _answer_resend(node, conn, f):
            return
        node.metrics.sends.labels(result="rate_limited").inc()
        raise RequestError(ErrorCode.RATE_LIMITED, "send rate limit; slow down")
    # after the rate limit: the check costs index transactions and an object-store HEAD
    if node.media is not None and f.msg_type in MEDIA_MSG_TYPES:
        key = key_of_content(f.content)
        if key is not None:  # a media message: its key must be the sender's upload
            try:
                await check_media_send(node, conn.uid, f.conv_id, key)
            except RequestError:
                if await _answer_resend(node, conn, f):  # acked before: acked again
                    return
                raise
    _submit(node, conn, f)


def _committed(
    node: Services, conn: Session, f: Send, started: float, fut: asyncio.Future[AppendResult]
) -> None:
    if fut.cancelled():
        conn.error(f.rid, ErrorCode.UNAVAILABLE, "send interrupted; retry with the same id")
        return
    exc = fut.exception()
    if exc is not None:
        _failed(node, conn, f, exc)
        return
    result = fut.result()
    status = result.status
    if status is not AppendStatus.STORED:
        if isinstance(result, AppendFailed):  # its server failed, not the whole batch
            _failed(node, conn, f, result.error)
            return
        node.limiter.refund(conn.uid)  # nothing new stored: the send costs no token
    if status is AppendStatus.DENIED:
        node.metrics.sends.labels(result="denied").inc()
        known = CAP_CONTENT_DENIED in conn.caps
        conn.error(f.rid, ErrorCode.CONTENT_DENIED if known else ErrorCode.FORBIDDEN, _DENIED)
        return
    if status is AppendStatus.NOT_MEMBER:
        node.metrics.sends.labels(result="not_member").inc()
        node.spawn(_refuse_non_member(node, conn, f))
        return
    if status is AppendStatus.CONFLICT or result.message is None:
        conn.error(f.rid, ErrorCode.IDEMPOTENCY_CONFLICT, _CONFLICT)
        return
    conn.send(_ack(f.rid, result.message))
    node.metrics.ack_seconds.observe(node.loop.time() - started)
    if status is AppendStatus.DUPLICATE:
        node.metrics.sends.labels(result="duplicate").inc()
        return
    node.metrics.sends_stored.inc()
    node.push_message(result.message, exclude=conn, uids=result.members)
    if result.outbox_id and node.outbox is not None:
        node.outbox.delivered(result.outbox_id)


def _failed(node: Services, conn: Session, f: Send, exc: BaseException) -> None:
    """The answer to a SEND whose commit raised `exc`."""
    if isinstance(exc, StoreOutcomeUnknown):
        # Maybe stored: never say "not stored". Clients that do not know the code
        # get unavailable, whose instruction (same id again) is right here too.
        node.metrics.sends.labels(result="outcome_unknown").inc()
        known = CAP_OUTCOME_UNKNOWN in conn.caps
        code = ErrorCode.OUTCOME_UNKNOWN if known else ErrorCode.UNAVAILABLE
        conn.error(f.rid, code, _OUTCOME_UNKNOWN)
        return
    node.metrics.sends.labels(result="unavailable").inc()
    if not isinstance(exc, BackendUnavailable):
        node.log.error("send commit failed", error=repr(exc))
    conn.error(f.rid, ErrorCode.UNAVAILABLE, "store unavailable; retry with the same id")


async def _refuse_non_member(node: Services, conn: Session, f: Send) -> None:
    """not_member, or no_such_conversation when the conversation does not exist."""
    try:
        error = await membership_error(node, f.conv_id)
    except BackendUnavailable:
        error = RequestError(ErrorCode.NOT_MEMBER, f"not a member of conversation {f.conv_id}")
    conn.error(f.rid, error.code, error.text)


async def pull(node: Services, conn: Session, f: Pull) -> None:
    m = await require_reader(node, f.conv_id, conn.uid)
    limit = page_limit(f.limit, MSG_LIMIT_DEFAULT, MSG_LIMIT_MAX)
    msgs, more = await node.store.read_after(
        f.conv_id, f.after_seq, limit, min_seq=m.joined_seq, max_seq=m.left_seq
    )
    conn.send(PullResult(f.rid, f.conv_id, more, tuple(_record(x) for x in msgs)))


async def history(node: Services, conn: Session, f: History) -> None:
    m = await require_reader(node, f.conv_id, conn.uid)
    limit = page_limit(f.limit, MSG_LIMIT_DEFAULT, MSG_LIMIT_MAX)
    msgs, more = await node.store.read_before(
        f.conv_id, f.before_seq, limit, min_seq=m.joined_seq, max_seq=m.left_seq
    )
    conn.send(HistoryResult(f.rid, f.conv_id, more, tuple(_record(x) for x in msgs)))


async def recall(node: Services, conn: Session, f: Recall) -> None:
    m = await require_member(node, f.conv_id, conn.uid)
    result = await node.store.recall(
        f.conv_id,
        f.seq,
        conn.uid,
        window_ms=int(node.config.recall_window * 1000),
        min_seq=m.joined_seq,
    )
    if result.status is RecallStatus.NO_SUCH_MESSAGE:
        raise RequestError(ErrorCode.NO_SUCH_MESSAGE, f"no message {f.seq} in {f.conv_id}")
    if result.status is RecallStatus.DENIED:
        raise RequestError(
            ErrorCode.RECALL_DENIED, "only the sender may recall, within the recall window"
        )
    conn.send(RecallOk(f.rid, f.conv_id, result.recall_seq))
    if result.message is not None:
        node.push_message(result.message, exclude=conn)
