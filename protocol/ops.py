"""Op codes, error codes, KICK reasons and message types of wire protocol v1."""

from __future__ import annotations

from enum import IntEnum
from typing import Final

PROTOCOL_VERSION: Final = 1

MAX_FRAME_DEFAULT: Final = 65_536
MAX_CONTENT_DEFAULT: Final = 2_048
HEADER_SIZE: Final = 4
MAX_U64: Final = (1 << 64) - 1
CLIENT_MSG_ID_MAX_BYTES: Final = 64
# PUSH_REGISTER (docs/protocol.md, Offline push): a provider is 1..16 chars of
# [a-z0-9_-]; a token 1..PUSH_TOKEN_MAX_BYTES UTF-8 bytes (a Web Push subscription as
# JSON, the longest kind, is well under it); a locale at most 35 chars of [A-Za-z0-9_-].
PUSH_PROVIDER_MAX: Final = 16
PUSH_TOKEN_MAX_BYTES: Final = 2_048
PUSH_LOCALE_MAX: Final = 35


class Op(IntEnum):
    LOGIN = 1
    LOGIN_OK = 2
    PING = 3
    PONG = 4
    SEND = 10
    SEND_ACK = 11
    PUSH = 20
    DELIVERED = 21
    READ = 22
    READ_NOTIFY = 23
    TYPING = 24
    TYPING_NOTIFY = 25
    PRESENCE = 26
    PRESENCE_RESULT = 27
    SYNC = 30
    SYNC_RESULT = 31
    PULL = 32
    PULL_RESULT = 33
    HISTORY = 34
    HISTORY_RESULT = 35
    SYNC_HINT = 36
    NOTICE = 37
    RECALL = 40
    RECALL_OK = 41
    OPEN_P2P = 50
    CONV_OK = 51
    GROUP_CREATE = 52
    GROUP_MEMBERS = 54
    OK = 55
    GROUP_INFO = 56
    GROUP_INFO_RESULT = 57
    KICK = 60
    LOGOUT = 62
    MEDIA_UPLOAD = 70
    MEDIA_URL = 71
    MEDIA_GET = 72
    PUSH_REGISTER = 80
    PUSH_REGISTER_OK = 81
    PUSH_UNREGISTER = 82
    MUTE = 84
    ERROR = 127


CLIENT_OPS: Final = frozenset(
    {
        Op.LOGIN,
        Op.PING,
        Op.SEND,
        Op.DELIVERED,
        Op.READ,
        Op.TYPING,
        Op.PRESENCE,
        Op.SYNC,
        Op.PULL,
        Op.HISTORY,
        Op.RECALL,
        Op.OPEN_P2P,
        Op.GROUP_CREATE,
        Op.GROUP_MEMBERS,
        Op.GROUP_INFO,
        Op.LOGOUT,
        Op.MEDIA_UPLOAD,
        Op.MEDIA_GET,
        Op.PUSH_REGISTER,
        Op.PUSH_UNREGISTER,
        Op.MUTE,
    }
)
SERVER_OPS: Final = frozenset(set(Op) - CLIENT_OPS)

# Capabilities a client lists in LOGIN's optional "caps" (unknown ones are ignored).
# "outcome_unknown": the client understands ERROR outcome_unknown (32); others get
# unavailable (30) in its place, whose instruction (send again with the same
# client_msg_id) is right for both.
CAP_OUTCOME_UNKNOWN: Final = "outcome_unknown"
# "content_denied": the client understands ERROR content_denied (33); others get
# forbidden (27) for a message the content check refused.
CAP_CONTENT_DENIED: Final = "content_denied"
KNOWN_CAPS: Final = frozenset({CAP_OUTCOME_UNKNOWN, CAP_CONTENT_DENIED})
MAX_CAPS: Final = 16  # entries in "caps", each at most 32 bytes


class ErrorCode(IntEnum):
    BAD_FRAME = 1
    FRAME_TOO_LARGE = 2
    UNKNOWN_OP = 3
    BAD_REQUEST = 4
    NOT_LOGGED_IN = 10
    AUTH_FAILED = 11
    VERSION_UNSUPPORTED = 12
    NOT_MEMBER = 20
    NO_SUCH_CONVERSATION = 21
    CONTENT_TOO_LARGE = 22
    BAD_MSG_TYPE = 23
    RATE_LIMITED = 24
    RECALL_DENIED = 25
    IDEMPOTENCY_CONFLICT = 26
    FORBIDDEN = 27
    NO_SUCH_MESSAGE = 28
    UNAVAILABLE = 30
    INTERNAL = 31
    OUTCOME_UNKNOWN = 32  # only to clients whose LOGIN lists CAP_OUTCOME_UNKNOWN
    CONTENT_DENIED = 33  # only to clients whose LOGIN lists CAP_CONTENT_DENIED

    @property
    def closes_connection(self) -> bool:
        """Whether the server closes a logged-in connection after this error."""
        return self in _CLOSING_ERRORS


_CLOSING_ERRORS: Final = frozenset(
    {
        ErrorCode.BAD_FRAME,
        ErrorCode.FRAME_TOO_LARGE,
        ErrorCode.NOT_LOGGED_IN,
        ErrorCode.AUTH_FAILED,
        ErrorCode.VERSION_UNSUPPORTED,
    }
)


class KickReason(IntEnum):
    DUPLICATE_LOGIN = 1
    DRAINING = 2
    AUTH_REVOKED = 3
    SLOW_CONSUMER = 4
    SHUTDOWN = 5


class MsgType(IntEnum):
    TEXT = 1
    IMAGE = 2
    VOICE = 3
    FILE = 4
    RECALL = 5
    SYSTEM = 6


class ConvKind(IntEnum):
    P2P = 1
    GROUP = 2


# Message types whose content may carry an object-store key (docs/media.md).
MEDIA_MSG_TYPES: Final = frozenset({MsgType.IMAGE, MsgType.VOICE, MsgType.FILE})

APP_MSG_TYPE_MIN: Final = 100
APP_MSG_TYPE_MAX: Final = 127


# The msg_types a client may send, as inclusive ranges: 1-4 and 100-127. The one
# definition of them: they also count as unread and can be recalled (the stores' SQL
# for unread counts is generated from it, storage/rules.py).
CLIENT_MSG_TYPES: Final[tuple[tuple[int, int], ...]] = (
    (int(MsgType.TEXT), int(MsgType.FILE)),
    (APP_MSG_TYPE_MIN, APP_MSG_TYPE_MAX),
)
(_LO1, _HI1), (_LO2, _HI2) = CLIENT_MSG_TYPES


def is_client_msg_type(msg_type: int) -> bool:
    """Whether a client may send `msg_type` (CLIENT_MSG_TYPES). These also count as unread
    and can be recalled."""
    return _LO1 <= msg_type <= _HI1 or _LO2 <= msg_type <= _HI2
