"""Plain records that cross the storage boundary. No I/O here.

The storage errors live in storage/errors.py; they are re-exported here for the code
that imports them with the records."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

# The errors, re-exported for the code that imports them with the records.
from storage.errors import (
    BackendUnavailable,
    BusUnavailable,
    CacheUnavailable,
    GroupFull,
    Revoked,
    StoreOutcomeUnknown,
    StoreUnavailable,
)

DIGEST_BYTES = 16


def content_digest(content: bytes) -> bytes:
    """What an idempotency record keeps of the content: the first 16 bytes of BLAKE2b."""
    return hashlib.blake2b(content).digest()[:DIGEST_BYTES]


_RECALLED = 5  # protocol.ops.MsgType.RECALL: a client message with it has been recalled


@dataclass(frozen=True, slots=True)
class StoredMessage:
    conv_id: int
    seq: int
    msg_id: int
    sender_uid: int
    msg_type: int
    content: bytes
    server_ms: int
    client_msg_id: str

    def same_send(self, conv_id: int, msg_type: int, content: bytes) -> bool:
        """Whether a resend with these fields is this send again. A recalled message lost
        its type and content, so only its conversation can be compared."""
        if self.msg_type == _RECALLED and self.client_msg_id:
            return self.conv_id == conv_id
        return (self.conv_id, self.msg_type, self.content) == (conv_id, msg_type, content)


@dataclass(frozen=True, slots=True)
class SentRecord:
    """The original SEND_ACK of `(sender_uid, client_msg_id)` and what the send was, so a
    retry gets the same ack and a different send with the same id is a conflict."""

    sender_uid: int
    client_msg_id: str
    conv_id: int
    seq: int
    msg_id: int
    server_ms: int
    msg_type: int
    digest: bytes  # content_digest(content)

    @classmethod
    def of(cls, m: StoredMessage) -> SentRecord:
        return cls(
            m.sender_uid, m.client_msg_id, m.conv_id, m.seq, m.msg_id, m.server_ms,
            m.msg_type, content_digest(m.content),
        )  # fmt: skip

    def same_send(self, conv_id: int, msg_type: int, content: bytes) -> bool:
        if self.msg_type == _RECALLED:  # recalled since: see StoredMessage.same_send
            return self.conv_id == conv_id
        return (self.conv_id, self.msg_type, self.digest) == (
            conv_id, msg_type, content_digest(content),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A client message waiting to be committed by the send batcher."""

    conv_id: int
    sender_uid: int
    client_msg_id: str
    msg_type: int
    content: bytes


class AppendStatus(Enum):
    STORED = "stored"
    DUPLICATE = "duplicate"  # same (sender, client_msg_id) and same payload: original returned
    CONFLICT = "conflict"  # same (sender, client_msg_id), different conv/type/content
    NOT_MEMBER = "not_member"  # the sender is not a current member (or no such conversation)
    DENIED = "denied"  # the content check refused it: not stored
    # Not stored, or not known to be: the store's server for this message's conversation
    # failed, while other messages of the batch, on other servers, may be stored
    # (storage/mysql/store.py). Always an AppendFailed: answered as if `append` had
    # raised its `error`.
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class AppendResult:
    status: AppendStatus
    message: StoredMessage | None = None  # set for STORED and DUPLICATE
    # STORED: the conversation's current members at commit, for fan-out.
    members: Sequence[int] = ()
    # STORED with an outbox: the id of the outbox row recording this commit's fan-out
    # (shared by the batch); clear it once delivered (storage.ports.Outbox).
    outbox_id: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendFailed(AppendResult):
    """FAILED: what the caller is to answer as if `append` had raised it. A subclass,
    so that the results every send builds carry no field for it."""

    error: Exception


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """Fan-out a commit owed: the messages (conv_id, lo_seq..hi_seq) committed by `node`."""

    id: int
    node: str
    entries: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class HookRow:
    """A stored message its webhooks and push events are still owed (storage/hooks.py):
    written by `node` in the message's own commit, at `created_ms` (the store's clock)."""

    conv_id: int
    seq: int
    node: str
    created_ms: int


@dataclass(frozen=True, slots=True)
class NodeLease:
    """A node's outbox lease as the others see it: `live` while its owner renews it (not
    lapsed, not claimed by a survivor); `conn_floor`: every connection id the node's
    current process hands out is above it (earlier ones belong to a previous process
    with the same node id)."""

    live: bool
    conn_floor: int


@dataclass(frozen=True, slots=True)
class Conversation:
    conv_id: int
    kind: int  # ConvKind
    title: str
    owner_uid: int  # 0 for p2p
    created_ms: int


@dataclass(frozen=True, slots=True)
class Membership:
    conv_id: int
    uid: int
    joined_seq: int  # first seq this member may read
    left_seq: int | None  # seq of the message that removed it; None while a member

    @property
    def active(self) -> bool:
        return self.left_seq is None


@dataclass(frozen=True, slots=True)
class SyncRow:
    conv_id: int
    kind: int
    max_seq: int
    read_seq: int
    delivered_seq: int
    unread: int
    last_active_ms: int
    is_member: bool


@dataclass(frozen=True, slots=True)
class SyncPage:
    rows: list[SyncRow]
    has_more: bool
    # Of the `servers` holding the store's conversations, how many did not answer: their
    # rows are not in `rows` (0: the page is whole). Only a store spread over several
    # servers answers without some of them.
    missing: int = 0
    servers: int = 1


# A system message's content, msgpack-encoded: {"event": "created" | "added" |
# "removed" | "left", "by": uid, "uids": [uid, ...]} and, for "created", "title".
SystemEvent = Mapping[str, int | str | Sequence[int]]


@dataclass(frozen=True, slots=True)
class MembershipChange:
    """The outcome of one GROUP_MEMBERS request: the system messages written, in order."""

    messages: list[StoredMessage]
    owner_uid: int


class RecallStatus(Enum):
    RECALLED = "recalled"
    ALREADY = "already"  # recalled before: the first recall's seq is returned
    NO_SUCH_MESSAGE = "no_such_message"
    DENIED = "denied"


@dataclass(frozen=True, slots=True)
class RecallResult:
    status: RecallStatus
    recall_seq: int = 0
    message: StoredMessage | None = None  # the recall message appended, when RECALLED


@dataclass(frozen=True, slots=True)
class Route:
    """Where a logged-in device is connected: the node, the connection, the login epoch."""

    uid: int
    device: str
    node: str
    conn_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class PushDevice:
    """A device registered for offline push (docs/protocol.md, Offline push): the push
    service `provider`, the device's `token` there, whether a notification may carry
    the message's text, the notification's language, and when it was registered (the
    store's clock; the newest of a uid's registrations has the highest)."""

    uid: int
    device: str
    provider: str
    token: str
    preview: bool
    locale: str
    updated_ms: int


__all__ = [
    "DIGEST_BYTES",
    "AppendResult",
    "AppendStatus",
    "BackendUnavailable",
    "BusUnavailable",
    "CacheUnavailable",
    "Conversation",
    "GroupFull",
    "HookRow",
    "Membership",
    "MembershipChange",
    "NewMessage",
    "OutboxRow",
    "PushDevice",
    "RecallResult",
    "RecallStatus",
    "Revoked",
    "Route",
    "SentRecord",
    "StoreOutcomeUnknown",
    "StoreUnavailable",
    "StoredMessage",
    "SyncPage",
    "SyncRow",
    "SystemEvent",
    "content_digest",
]
