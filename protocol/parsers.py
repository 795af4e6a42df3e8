"""Field validation: a decoded msgpack body (a list) into a typed frame, per op.

Each op has one parser in `CLIENT_FRAME_PARSERS` (client ops, used by the server
side) or `SERVER_FRAME_PARSERS` (server ops, used by the client side). A parser takes
the whole body (op included) and returns the frame, or raises `FieldError` when a
field is missing or ill-typed; the decoder turns that into Invalid BAD_REQUEST.

Rules (docs/protocol.md, Frames): ints are `int` and never `bool`, within 0..2^64-1; ids
that are never 0 (`uid`, `conv_id`, `peer_uid`, listed uids, request `rid`) are >= 1;
strings are msgpack str, content is msgpack bin; extra array elements and unknown
map keys are ignored. The protocol's fixed bounds are checked here too (client_msg_id,
caps, PUSH_REGISTER's provider, token and locale); value checks that need
configuration or close the connection (versions, the LOGIN device pattern, content
limits) belong to the gateway.

`FieldError` is internal to decoding and never escapes `FrameDecoder`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

from protocol.frames import (
    CLIENT_FRAME_TYPES,
    SERVER_FRAME_TYPES,
    ClientFrame,
    ConvOk,
    ConvRecord,
    Delivered,
    Error,
    Frame,
    GroupCreate,
    GroupInfo,
    GroupInfoResult,
    GroupMembers,
    History,
    HistoryResult,
    Kick,
    Login,
    LoginOk,
    Logout,
    MediaGet,
    MediaUpload,
    MediaUrl,
    MsgRecord,
    Mute,
    Notice,
    Ok,
    OpenP2P,
    Ping,
    Pong,
    Presence,
    PresenceResult,
    Pull,
    PullResult,
    Push,
    PushRegister,
    PushRegisterOk,
    PushUnregister,
    Read,
    ReadNotify,
    Recall,
    RecallOk,
    Send,
    SendAck,
    ServerFrame,
    Sync,
    SyncHint,
    SyncPartial,
    SyncResult,
    Typing,
    TypingNotify,
)
from protocol.ops import (
    CLIENT_MSG_ID_MAX_BYTES,
    MAX_CAPS,
    MAX_U64,
    PUSH_LOCALE_MAX,
    PUSH_PROVIDER_MAX,
    PUSH_TOKEN_MAX_BYTES,
    Op,
)


class FieldError(Exception):
    """A field is missing or ill-typed; the message names it."""


Check = Callable[[Any], Any]
Parser = Callable[[list[Any]], Frame]
_F = TypeVar("_F", bound=Frame)
_R = TypeVar("_R", MsgRecord, ConvRecord)
_MISSING: Final = object()


# --- field checks: return the (possibly converted) value or raise FieldError -------


def u64(v: Any) -> int:
    if type(v) is int and 0 <= v <= MAX_U64:
        return v
    raise FieldError("must be an int in 0..2^64-1")


def nonzero_u64(v: Any) -> int:
    if type(v) is int and 1 <= v <= MAX_U64:
        return v
    raise FieldError("must be an int in 1..2^64-1")


def any_int(v: Any) -> int:
    if type(v) is int:
        return v
    raise FieldError("must be an int")


def string(v: Any) -> str:
    if type(v) is str:
        return v
    raise FieldError("must be a str")


def binary(v: Any) -> bytes:
    if type(v) is bytes:
        return v
    raise FieldError("must be a bin")


def boolean(v: Any) -> bool:
    if type(v) is bool:
        return v
    raise FieldError("must be a bool")


def opaque(v: Any) -> int | str | bytes:
    t = type(v)
    if t is str or t is bytes or (t is int and 0 <= v <= MAX_U64):
        return v  # type: ignore[no-any-return]
    raise FieldError("must be an int in 0..2^64-1, a str or a bin")


def client_msg_id(v: Any) -> str:
    # A str of n chars is n..4n UTF-8 bytes: encode only when the length is ambiguous.
    if type(v) is str and 0 < len(v) <= CLIENT_MSG_ID_MAX_BYTES:
        if len(v) <= CLIENT_MSG_ID_MAX_BYTES // 4 or v.isascii():
            return v
        if len(v.encode()) <= CLIENT_MSG_ID_MAX_BYTES:
            return v
    raise FieldError(f"must be a str of 1..{CLIENT_MSG_ID_MAX_BYTES} UTF-8 bytes")


PUSH_PROVIDER_RE: Final = re.compile(rf"[a-z0-9_-]{{1,{PUSH_PROVIDER_MAX}}}")
PUSH_LOCALE_RE: Final = re.compile(rf"[A-Za-z0-9_-]{{0,{PUSH_LOCALE_MAX}}}")


def push_provider(v: Any) -> str:
    if type(v) is str and PUSH_PROVIDER_RE.fullmatch(v):
        return v
    raise FieldError(f"must be a str of 1..{PUSH_PROVIDER_MAX} chars of [a-z0-9_-]")


def push_token(v: Any) -> str:
    # As client_msg_id: encode only when the length in chars leaves the bytes in doubt.
    if type(v) is str and 0 < len(v) <= PUSH_TOKEN_MAX_BYTES:
        if len(v) <= PUSH_TOKEN_MAX_BYTES // 4 or v.isascii():
            return v
        if len(v.encode()) <= PUSH_TOKEN_MAX_BYTES:
            return v
    raise FieldError(f"must be a str of 1..{PUSH_TOKEN_MAX_BYTES} UTF-8 bytes")


def push_locale(v: Any) -> str:
    if type(v) is str and PUSH_LOCALE_RE.fullmatch(v):
        return v
    raise FieldError(f"must be a str of at most {PUSH_LOCALE_MAX} chars of [A-Za-z0-9_-]")


def id_list(v: Any) -> tuple[int, ...]:
    if type(v) is list and all(type(x) is int and 1 <= x <= MAX_U64 for x in v):
        return tuple(v)
    raise FieldError("must be an array of ints in 1..2^64-1")


def _str_list(v: Any) -> tuple[str, ...]:
    if type(v) is list and all(type(x) is str for x in v):
        return tuple(v)
    raise FieldError("must be an array of str")


def caps(v: Any) -> tuple[str, ...]:
    if (
        type(v) is list
        and len(v) <= MAX_CAPS
        and all(type(x) is str and 0 < len(x) <= 32 for x in v)
    ):
        return tuple(v)
    raise FieldError(f"must be an array of at most {MAX_CAPS} str of 1..32 chars")


def presence_entries(v: Any) -> tuple[tuple[int, tuple[str, ...]], ...]:
    if type(v) is not list:
        raise FieldError("must be an array of [uid, [device, ...]]")
    entries = []
    for i, entry in enumerate(v):
        if type(entry) is not list or len(entry) < 2:
            raise FieldError(f"[{i}] must be an array [uid, [device, ...]]")
        try:
            entries.append((nonzero_u64(entry[0]), _str_list(entry[1])))
        except FieldError as exc:
            raise FieldError(f"[{i}] {exc}") from None
    return tuple(entries)


def _checked(
    label: str, names: tuple[str, ...], checks: tuple[Check, ...], values: Any
) -> list[Any]:
    """Run `checks` over `values` pairwise; on failure name the first bad field."""
    try:
        return [check(v) for check, v in zip(checks, values, strict=False)]
    except FieldError:
        pass
    for name, check, v in zip(names, checks, values, strict=False):
        if v is _MISSING:
            raise FieldError(f"{label}.{name} is missing") from None
        try:
            check(v)
        except FieldError as exc:
            raise FieldError(f"{label}.{name} {exc}") from None
    raise AssertionError("unreachable")  # pragma: no cover


def _records(cls: type[_R], *checks: Check) -> Callable[[Any], tuple[_R, ...]]:
    """Check of an array of records, each an array of `checks`' fields."""
    n = len(checks)
    names: tuple[str, ...] = cls._fields
    kind = cls.__name__
    make = tuple.__new__

    def parse(v: Any) -> tuple[_R, ...]:
        if type(v) is not list:
            raise FieldError(f"must be an array of {kind}")
        out = []
        for i, rec in enumerate(v):
            if type(rec) is not list or len(rec) < n:
                raise FieldError(f"[{i}] must be an array of {n} {kind} fields")
            out.append(make(cls, _checked(f"[{i}]", names, checks, rec)))
        return tuple(out)

    return parse


conv_records: Final = _records(ConvRecord, nonzero_u64, u64, u64, u64, u64, u64, u64, boolean)
_msg_records_checked: Final = _records(MsgRecord, u64, u64, u64, u64, binary, u64, string)


def msg_records(v: Any) -> tuple[MsgRecord, ...]:
    # Hot path (PULL and HISTORY pages of up to 200): inline checks, no call per
    # field; anything unusual takes the generic path, which also explains errors.
    if type(v) is list:
        make = tuple.__new__
        out = []
        for rec in v:
            if type(rec) is list and len(rec) >= 7:
                fields = rec[:7]
                seq, msg_id, sender_uid, msg_type, content, server_ms, cmid = fields
                if (
                    type(seq) is int
                    and 0 <= seq <= MAX_U64
                    and type(msg_id) is int
                    and 0 <= msg_id <= MAX_U64
                    and type(sender_uid) is int
                    and 0 <= sender_uid <= MAX_U64
                    and type(msg_type) is int
                    and 0 <= msg_type <= MAX_U64
                    and type(content) is bytes
                    and type(server_ms) is int
                    and 0 <= server_ms <= MAX_U64
                    and type(cmid) is str
                ):
                    out.append(make(MsgRecord, fields))
                    continue
            break
        else:
            return tuple(out)
    return _msg_records_checked(v)


# --- parsers ----------------------------------------------------------------------


def _array(cls: Callable[..., _F], *checks: Check) -> Callable[[list[Any]], _F]:
    """Parser of an array frame whose fields after the op are checked by `checks`."""
    n = len(checks)
    spec: Any = cls  # a frame class; typed as a constructor so mypy checks the result
    names: tuple[str, ...] = spec.__match_args__
    label: str = spec.OP.name
    assert len(names) == n, cls

    if n == 0:
        singleton = cls()  # field-less: one instance serves every frame
        return lambda body: singleton

    def parse(body: list[Any]) -> _F:
        if len(body) <= n:
            raise FieldError(f"{label} needs {n} fields after the op, got {len(body) - 1}")
        return cls(*_checked(label, names, checks, body[1:]))

    return parse


def _map(
    cls: Callable[..., _F],
    keys: tuple[str, ...],
    *checks: Check,
    optional: tuple[tuple[str, Check], ...] = (),
) -> Callable[[list[Any]], _F]:
    """Parser of `[op, rid, {key: value}]` (LOGIN, LOGIN_OK); `checks[0]` checks rid.
    `optional` keys may be absent (the field keeps its default)."""
    spec: Any = cls
    label: str = spec.OP.name
    check_rid, *check_keys = checks
    assert spec.__match_args__ == ("rid", *keys, *(k for k, _ in optional)), cls

    def parse(body: list[Any]) -> _F:
        if len(body) < 3:
            raise FieldError(f"{label} needs rid and a map after the op")
        rid = _checked(label, ("rid",), (check_rid,), (body[1],))[0]
        m = body[2]
        if type(m) is not dict:
            raise FieldError(f"{label} body[2] must be a map")
        values = [m.get(k, _MISSING) for k in keys]
        frame = cls(rid, *_checked(label, keys, tuple(check_keys), values))
        for k, check in optional:
            if (v := m.get(k, _MISSING)) is not _MISSING:
                setattr(frame, k, _checked(label, (k,), (check,), (v,))[0])
        return frame

    return parse


def _push_register(body: list[Any]) -> PushRegister:
    """`[80, rid, provider, token, opts]`: opts is a map whose keys `preview` and
    `locale` may be absent (their defaults); other keys are ignored."""
    label = "PUSH_REGISTER"
    if len(body) < 5:
        raise FieldError(f"{label} needs 4 fields after the op, got {len(body) - 1}")
    names = ("rid", "provider", "token")
    rid, provider, token = _checked(
        label, names, (nonzero_u64, push_provider, push_token), body[1:4]
    )
    opts = body[4]
    if type(opts) is not dict:
        raise FieldError(f"{label}.opts must be a map")
    preview, locale = _checked(
        label,
        ("opts.preview", "opts.locale"),
        (boolean, push_locale),
        (opts.get("preview", False), opts.get("locale", "")),
    )
    return PushRegister(rid, provider, token, preview, locale)


_sync_result_fields: Final = (nonzero_u64, opaque, opaque, boolean, conv_records)
_SYNC_RESULT_NAMES: Final = ("rid", "next_since", "next_cursor", "has_more", "convs")


def sync_partial(v: Any) -> SyncPartial:
    if type(v) is not dict:
        raise FieldError("must be a map {missing, servers}")
    missing, servers = _checked(
        "partial",
        ("missing", "servers"),
        (u64, u64),
        (v.get("missing", _MISSING), v.get("servers", _MISSING)),
    )
    return SyncPartial(missing, servers)


def _sync_result(body: list[Any]) -> SyncResult:
    """`[31, rid, next_since, next_cursor, has_more, [conv, ...]]`, and a `partial` map
    after them when some servers did not answer."""
    label = "SYNC_RESULT"
    if len(body) < 6:
        raise FieldError(f"{label} needs 5 fields after the op, got {len(body) - 1}")
    rid, since, cursor, more, convs = _checked(
        label, _SYNC_RESULT_NAMES, _sync_result_fields, body[1:6]
    )
    partial = None
    if len(body) > 6:
        partial = _checked(label, ("partial",), (sync_partial,), (body[6],))[0]
    return SyncResult(rid, since, cursor, more, convs, partial)


# --- hot paths ----------------------------------------------------------------------
# The most frequent ops get inline checks instead of one call per field. They accept
# only what the generic parser accepts (tests compare the two) and hand everything
# else to it, so errors are still explained in one place.

_send_checked: Final = _array(Send, nonzero_u64, nonzero_u64, client_msg_id, u64, binary)
_push_checked: Final = _array(Push, nonzero_u64, u64, u64, u64, u64, binary, u64, string)
_delivered_checked: Final = _array(Delivered, nonzero_u64, u64)
_read_checked: Final = _array(Read, nonzero_u64, u64)
_CMID_SURE_LEN: Final = CLIENT_MSG_ID_MAX_BYTES // 4  # this many chars fit whatever they are


def _send(body: list[Any]) -> Send:
    if len(body) >= 6:
        rid, conv_id, cmid, msg_type, content = body[1:6]
        if (
            type(rid) is int
            and 0 < rid <= MAX_U64
            and type(conv_id) is int
            and 0 < conv_id <= MAX_U64
            and type(cmid) is str
            and 0 < len(cmid) <= CLIENT_MSG_ID_MAX_BYTES
            and (len(cmid) <= _CMID_SURE_LEN or cmid.isascii())
            and type(msg_type) is int
            and 0 <= msg_type <= MAX_U64
            and type(content) is bytes
        ):
            return Send(rid, conv_id, cmid, msg_type, content)
    return _send_checked(body)


def _push(body: list[Any]) -> Push:
    if len(body) >= 9:
        conv_id, seq, msg_id, sender_uid, msg_type, content, server_ms, cmid = body[1:9]
        if (
            type(conv_id) is int
            and 0 < conv_id <= MAX_U64
            and type(seq) is int
            and 0 <= seq <= MAX_U64
            and type(msg_id) is int
            and 0 <= msg_id <= MAX_U64
            and type(sender_uid) is int
            and 0 <= sender_uid <= MAX_U64
            and type(msg_type) is int
            and 0 <= msg_type <= MAX_U64
            and type(content) is bytes
            and type(server_ms) is int
            and 0 <= server_ms <= MAX_U64
            and type(cmid) is str
        ):
            return Push(conv_id, seq, msg_id, sender_uid, msg_type, content, server_ms, cmid)
    return _push_checked(body)


def _delivered(body: list[Any]) -> Delivered:
    if len(body) >= 3:
        conv_id = body[1]
        seq = body[2]
        if (
            type(conv_id) is int
            and 0 < conv_id <= MAX_U64
            and type(seq) is int
            and 0 <= seq <= MAX_U64
        ):
            return Delivered(conv_id, seq)
    return _delivered_checked(body)


def _read(body: list[Any]) -> Read:
    if len(body) >= 3:
        conv_id = body[1]
        seq = body[2]
        if (
            type(conv_id) is int
            and 0 < conv_id <= MAX_U64
            and type(seq) is int
            and 0 <= seq <= MAX_U64
        ):
            return Read(conv_id, seq)
    return _read_checked(body)


# --- tables -------------------------------------------------------------------------

CLIENT_FRAME_PARSERS: Final[dict[int, Callable[[list[Any]], ClientFrame]]] = {
    Op.LOGIN: _map(
        Login,
        ("v", "uid", "device", "token"),
        nonzero_u64,
        any_int,
        nonzero_u64,
        string,
        string,
        optional=(("caps", caps),),
    ),
    Op.PING: _array(Ping),
    Op.SEND: _send,
    Op.DELIVERED: _delivered,
    Op.READ: _read,
    Op.TYPING: _array(Typing, nonzero_u64),
    Op.PRESENCE: _array(Presence, nonzero_u64, id_list),
    Op.SYNC: _array(Sync, nonzero_u64, opaque, opaque, u64),
    Op.PULL: _array(Pull, nonzero_u64, nonzero_u64, u64, u64),
    Op.HISTORY: _array(History, nonzero_u64, nonzero_u64, u64, u64),
    Op.RECALL: _array(Recall, nonzero_u64, nonzero_u64, u64),
    Op.OPEN_P2P: _array(OpenP2P, nonzero_u64, nonzero_u64),
    Op.GROUP_CREATE: _array(GroupCreate, nonzero_u64, string, id_list),
    Op.GROUP_MEMBERS: _array(GroupMembers, nonzero_u64, nonzero_u64, id_list, id_list),
    Op.GROUP_INFO: _array(GroupInfo, nonzero_u64, nonzero_u64),
    Op.LOGOUT: _array(Logout),
    Op.MEDIA_UPLOAD: _array(MediaUpload, nonzero_u64, string, u64, string),
    Op.MEDIA_GET: _array(MediaGet, nonzero_u64, string),
    Op.PUSH_REGISTER: _push_register,
    Op.PUSH_UNREGISTER: _array(PushUnregister, nonzero_u64),
    Op.MUTE: _array(Mute, nonzero_u64, nonzero_u64, u64),
}

SERVER_FRAME_PARSERS: Final[dict[int, Callable[[list[Any]], ServerFrame]]] = {
    Op.LOGIN_OK: _map(
        LoginOk,
        ("node", "hb", "idle", "max_frame", "max_content", "ts"),
        nonzero_u64,
        string,
        u64,
        u64,
        u64,
        u64,
        u64,
    ),
    Op.PONG: _array(Pong),
    Op.SEND_ACK: _array(SendAck, nonzero_u64, nonzero_u64, u64, u64, u64),
    Op.PUSH: _push,
    Op.READ_NOTIFY: _array(ReadNotify, nonzero_u64, nonzero_u64, u64),
    Op.TYPING_NOTIFY: _array(TypingNotify, nonzero_u64, nonzero_u64),
    Op.PRESENCE_RESULT: _array(PresenceResult, nonzero_u64, presence_entries),
    Op.SYNC_RESULT: _sync_result,
    Op.PULL_RESULT: _array(PullResult, nonzero_u64, nonzero_u64, boolean, msg_records),
    Op.HISTORY_RESULT: _array(HistoryResult, nonzero_u64, nonzero_u64, boolean, msg_records),
    Op.SYNC_HINT: _array(SyncHint),
    Op.NOTICE: _array(Notice, u64, binary, u64),
    Op.RECALL_OK: _array(RecallOk, nonzero_u64, nonzero_u64, u64),
    Op.CONV_OK: _array(ConvOk, nonzero_u64, nonzero_u64),
    Op.OK: _array(Ok, nonzero_u64),
    Op.GROUP_INFO_RESULT: _array(
        GroupInfoResult, nonzero_u64, nonzero_u64, string, nonzero_u64, id_list
    ),
    Op.MEDIA_URL: _array(MediaUrl, nonzero_u64, string, string, u64),
    Op.PUSH_REGISTER_OK: _array(PushRegisterOk, nonzero_u64),
    Op.KICK: _array(Kick, u64, string, string),
    # An ERROR about a frame without rid carries rid 0.
    Op.ERROR: _array(Error, u64, u64, string),
}

RID_OPS: Final = frozenset(
    cls.OP
    for cls in (*CLIENT_FRAME_TYPES, *SERVER_FRAME_TYPES)
    if cls.__match_args__[:1] == ("rid",)
)
"""Ops whose second element is a rid (echoed in the ERROR that refuses them)."""

assert set(CLIENT_FRAME_PARSERS) == {cls.OP for cls in CLIENT_FRAME_TYPES}
assert set(SERVER_FRAME_PARSERS) == {cls.OP for cls in SERVER_FRAME_TYPES}
