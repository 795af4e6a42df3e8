"""Typed frames of wire protocol v1: one slotted dataclass per op, fields in wire order.

The field order of every array frame is its wire order (docs/protocol.md, Ops), which
lets the codec derive the body layout from the class instead of repeating it. LOGIN and
LOGIN_OK carry maps on the wire; their fields are the map's keys after ``rid``.

PUSH_REGISTER carries its `opts` map last; its keys are fields of `PushRegister`.

Records (`MsgRecord`, `ConvRecord`) are NamedTuples so that msgpack packs them as
arrays without any conversion. `Invalid` is not a wire op: it is what the decoder
returns for a well-framed body that must be answered with an ERROR.

Frames are not frozen: a frozen dataclass costs about 1 µs more to build, over half of
a SEND's decode time. Treat them as values anyway: nothing mutates a frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, TypeAlias

from protocol.ops import ErrorCode, Op

Opaque: TypeAlias = int | str | bytes
"""A SYNC position (`since`, `cursor`): opaque to the client, msgpack int, str or bin."""


class MsgRecord(NamedTuple):
    """One message in PULL_RESULT / HISTORY_RESULT."""

    seq: int
    msg_id: int
    sender_uid: int
    msg_type: int
    content: bytes
    server_ms: int
    client_msg_id: str


class ConvRecord(NamedTuple):
    """One conversation row in SYNC_RESULT."""

    conv_id: int
    kind: int
    max_seq: int
    read_seq: int
    delivered_seq: int
    unread: int
    last_active_ms: int
    is_member: bool


# --- client to server -------------------------------------------------------------


@dataclass(slots=True)
class Login:
    OP: ClassVar[Op] = Op.LOGIN
    rid: int
    v: int
    uid: int
    device: str
    token: str
    caps: tuple[str, ...] = ()  # optional in the map: capabilities (protocol.ops CAP_*)


@dataclass(slots=True)
class Ping:
    OP: ClassVar[Op] = Op.PING


@dataclass(slots=True)
class Send:
    OP: ClassVar[Op] = Op.SEND
    rid: int
    conv_id: int
    client_msg_id: str
    msg_type: int
    content: bytes


@dataclass(slots=True)
class Delivered:
    OP: ClassVar[Op] = Op.DELIVERED
    conv_id: int
    seq: int


@dataclass(slots=True)
class Read:
    OP: ClassVar[Op] = Op.READ
    conv_id: int
    seq: int


@dataclass(slots=True)
class Typing:
    OP: ClassVar[Op] = Op.TYPING
    conv_id: int


@dataclass(slots=True)
class Presence:
    OP: ClassVar[Op] = Op.PRESENCE
    rid: int
    uids: tuple[int, ...]


@dataclass(slots=True)
class Sync:
    OP: ClassVar[Op] = Op.SYNC
    rid: int
    since: Opaque
    cursor: Opaque
    limit: int


@dataclass(slots=True)
class Pull:
    OP: ClassVar[Op] = Op.PULL
    rid: int
    conv_id: int
    after_seq: int
    limit: int


@dataclass(slots=True)
class History:
    OP: ClassVar[Op] = Op.HISTORY
    rid: int
    conv_id: int
    before_seq: int
    limit: int


@dataclass(slots=True)
class Recall:
    OP: ClassVar[Op] = Op.RECALL
    rid: int
    conv_id: int
    seq: int


@dataclass(slots=True)
class OpenP2P:
    OP: ClassVar[Op] = Op.OPEN_P2P
    rid: int
    peer_uid: int


@dataclass(slots=True)
class GroupCreate:
    OP: ClassVar[Op] = Op.GROUP_CREATE
    rid: int
    title: str
    uids: tuple[int, ...]


@dataclass(slots=True)
class GroupMembers:
    OP: ClassVar[Op] = Op.GROUP_MEMBERS
    rid: int
    conv_id: int
    add: tuple[int, ...]
    remove: tuple[int, ...]


@dataclass(slots=True)
class GroupInfo:
    OP: ClassVar[Op] = Op.GROUP_INFO
    rid: int
    conv_id: int


@dataclass(slots=True)
class Logout:
    OP: ClassVar[Op] = Op.LOGOUT


@dataclass(slots=True)
class MediaUpload:
    """Ask for a signed upload URL of a file: its SHA-256 (64 lowercase hex), size in
    bytes and content type."""

    OP: ClassVar[Op] = Op.MEDIA_UPLOAD
    rid: int
    sha256: str
    size: int
    content_type: str


@dataclass(slots=True)
class MediaGet:
    """Ask for a signed download URL of an object key a message carries."""

    OP: ClassVar[Op] = Op.MEDIA_GET
    rid: int
    key: str


@dataclass(slots=True)
class PushRegister:
    """Register the logged-in device for offline push at service `provider` under
    `token`. `preview` and `locale` travel in the opts map (their defaults when absent)."""

    OP: ClassVar[Op] = Op.PUSH_REGISTER
    rid: int
    provider: str
    token: str
    preview: bool = False  # may a notification carry the message's text
    locale: str = ""  # BCP 47-ish language of the notification's words; "": none given


@dataclass(slots=True)
class PushUnregister:
    OP: ClassVar[Op] = Op.PUSH_UNREGISTER
    rid: int


@dataclass(slots=True)
class Mute:
    """No notifications of `conv_id` to the uid's devices until `until_ms` (0: unmute)."""

    OP: ClassVar[Op] = Op.MUTE
    rid: int
    conv_id: int
    until_ms: int


# --- server to client -------------------------------------------------------------


@dataclass(slots=True)
class LoginOk:
    OP: ClassVar[Op] = Op.LOGIN_OK
    rid: int
    node: str
    hb: int
    idle: int
    max_frame: int
    max_content: int
    ts: int


@dataclass(slots=True)
class Pong:
    OP: ClassVar[Op] = Op.PONG


@dataclass(slots=True)
class SendAck:
    OP: ClassVar[Op] = Op.SEND_ACK
    rid: int
    conv_id: int
    seq: int
    msg_id: int
    server_ms: int


@dataclass(slots=True)
class Push:
    OP: ClassVar[Op] = Op.PUSH
    conv_id: int
    seq: int
    msg_id: int
    sender_uid: int
    msg_type: int
    content: bytes
    server_ms: int
    client_msg_id: str


@dataclass(slots=True)
class ReadNotify:
    OP: ClassVar[Op] = Op.READ_NOTIFY
    conv_id: int
    reader_uid: int
    seq: int


@dataclass(slots=True)
class TypingNotify:
    OP: ClassVar[Op] = Op.TYPING_NOTIFY
    conv_id: int
    uid: int


@dataclass(slots=True)
class PresenceResult:
    OP: ClassVar[Op] = Op.PRESENCE_RESULT
    rid: int
    entries: tuple[tuple[int, tuple[str, ...]], ...]
    """(uid, devices online) pairs."""


class SyncPartial(NamedTuple):
    """SYNC_RESULT's optional last element (a map on the wire): of the `servers` holding
    the user's conversations, `missing` did not answer, and their conversations are not
    in the answer (docs/protocol.md, Paging and SYNC)."""

    missing: int
    servers: int


@dataclass(slots=True)
class SyncResult:
    OP: ClassVar[Op] = Op.SYNC_RESULT
    rid: int
    next_since: Opaque
    next_cursor: Opaque
    has_more: bool
    convs: tuple[ConvRecord, ...]
    partial: SyncPartial | None = None  # on the wire only when some servers are missing


@dataclass(slots=True)
class PullResult:
    OP: ClassVar[Op] = Op.PULL_RESULT
    rid: int
    conv_id: int
    has_more: bool
    msgs: tuple[MsgRecord, ...]


@dataclass(slots=True)
class HistoryResult:
    OP: ClassVar[Op] = Op.HISTORY_RESULT
    rid: int
    conv_id: int
    has_more: bool
    msgs: tuple[MsgRecord, ...]


@dataclass(slots=True)
class SyncHint:
    OP: ClassVar[Op] = Op.SYNC_HINT


@dataclass(slots=True)
class Notice:
    """A notice the server API broadcast to online devices: not stored, no conversation."""

    OP: ClassVar[Op] = Op.NOTICE
    msg_type: int
    content: bytes
    server_ms: int


@dataclass(slots=True)
class RecallOk:
    OP: ClassVar[Op] = Op.RECALL_OK
    rid: int
    conv_id: int
    recall_seq: int


@dataclass(slots=True)
class ConvOk:
    OP: ClassVar[Op] = Op.CONV_OK
    rid: int
    conv_id: int


@dataclass(slots=True)
class Ok:
    OP: ClassVar[Op] = Op.OK
    rid: int


@dataclass(slots=True)
class GroupInfoResult:
    OP: ClassVar[Op] = Op.GROUP_INFO_RESULT
    rid: int
    conv_id: int
    title: str
    owner_uid: int
    uids: tuple[int, ...]


@dataclass(slots=True)
class MediaUrl:
    """The answer to MEDIA_UPLOAD (PUT the file there) and MEDIA_GET (GET it there)."""

    OP: ClassVar[Op] = Op.MEDIA_URL
    rid: int
    key: str
    url: str
    expires_ms: int


@dataclass(slots=True)
class PushRegisterOk:
    OP: ClassVar[Op] = Op.PUSH_REGISTER_OK
    rid: int


@dataclass(slots=True)
class Kick:
    OP: ClassVar[Op] = Op.KICK
    reason: int
    text: str
    reconnect_hint: str


@dataclass(slots=True)
class Error:
    OP: ClassVar[Op] = Op.ERROR
    rid: int
    code: int
    text: str


# --- decode results that are not wire ops ----------------------------------------


@dataclass(slots=True)
class Invalid:
    """A well-framed body the receiver must refuse without closing the connection.

    `code` is UNKNOWN_OP (an op this side does not accept) or BAD_REQUEST (a known op
    with missing or ill-typed fields). `rid` is the rid to echo in the ERROR, 0 when
    the frame has none.
    """

    op: int
    rid: int
    code: ErrorCode
    text: str


ClientFrame: TypeAlias = (
    Login
    | Ping
    | Send
    | Delivered
    | Read
    | Typing
    | Presence
    | Sync
    | Pull
    | History
    | Recall
    | OpenP2P
    | GroupCreate
    | GroupMembers
    | GroupInfo
    | Logout
    | MediaUpload
    | MediaGet
    | PushRegister
    | PushUnregister
    | Mute
)
ServerFrame: TypeAlias = (
    LoginOk
    | Pong
    | SendAck
    | Push
    | ReadNotify
    | TypingNotify
    | PresenceResult
    | SyncResult
    | PullResult
    | HistoryResult
    | SyncHint
    | Notice
    | RecallOk
    | ConvOk
    | Ok
    | GroupInfoResult
    | MediaUrl
    | PushRegisterOk
    | Kick
    | Error
)
Frame: TypeAlias = ClientFrame | ServerFrame

CLIENT_FRAME_TYPES: tuple[type[ClientFrame], ...] = (
    Login,
    Ping,
    Send,
    Delivered,
    Read,
    Typing,
    Presence,
    Sync,
    Pull,
    History,
    Recall,
    OpenP2P,
    GroupCreate,
    GroupMembers,
    GroupInfo,
    Logout,
    MediaUpload,
    MediaGet,
    PushRegister,
    PushUnregister,
    Mute,
)
SERVER_FRAME_TYPES: tuple[type[ServerFrame], ...] = (
    LoginOk,
    Pong,
    SendAck,
    Push,
    ReadNotify,
    TypingNotify,
    PresenceResult,
    SyncResult,
    PullResult,
    HistoryResult,
    SyncHint,
    Notice,
    RecallOk,
    ConvOk,
    Ok,
    GroupInfoResult,
    MediaUrl,
    PushRegisterOk,
    Kick,
    Error,
)
