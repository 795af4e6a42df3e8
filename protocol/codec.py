"""Encoding of typed frames into wire bytes (docs/protocol.md: Frames, Ops).

`encode` returns the complete frame (LEN + body) as immutable `bytes`, so one PUSH
can be encoded once and written to many sockets. Values are not validated beyond
what msgpack packing does (an int outside -2^63..2^64-1 raises OverflowError).

The body layout is derived from each frame class: array frames are
``[OP, *fields]`` in declaration order (which is wire order); records are NamedTuples
and nested tuples, which msgpack packs as arrays. Field-less frames are packed once
at import. Only LOGIN, LOGIN_OK, PUSH_REGISTER and SYNC_RESULT, whose bodies carry maps
(SYNC_RESULT's optional last element), have their own encoder.

Thread safety: packing goes through one module-level `msgpack.Packer`, which is not
reentrant. The gateway encodes from its event loop thread only; code that encodes
from several threads at once must use its own `msgpack.Packer`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from operator import attrgetter
from typing import Any, Final

import msgpack

from protocol.frames import (
    CLIENT_FRAME_TYPES,
    SERVER_FRAME_TYPES,
    Frame,
    Login,
    LoginOk,
    PushRegister,
    SyncResult,
)

_packer: Final = msgpack.Packer(use_bin_type=True, autoreset=True)
_pack: Final[Callable[[object], bytes]] = _packer.pack
_pack_len: Final[Callable[[int], bytes]] = struct.Struct(">I").pack

_BodyOf = Callable[[Any], object]


def frame_bytes(body: bytes) -> bytes:
    """Prefix an encoded body with its 4-byte big-endian LEN."""
    return _pack_len(len(body)) + body


def _login_body(f: Login) -> object:
    m: dict[str, object] = {"v": f.v, "uid": f.uid, "device": f.device, "token": f.token}
    if f.caps:
        m["caps"] = list(f.caps)
    return (f.OP.value, f.rid, m)


def _login_ok_body(f: LoginOk) -> object:
    return (
        f.OP.value,
        f.rid,
        {
            "node": f.node,
            "hb": f.hb,
            "idle": f.idle,
            "max_frame": f.max_frame,
            "max_content": f.max_content,
            "ts": f.ts,
        },
    )


def _push_register_body(f: PushRegister) -> object:
    opts = {"preview": f.preview, "locale": f.locale}
    return (f.OP.value, f.rid, f.provider, f.token, opts)


def _sync_result_body(f: SyncResult) -> object:
    body = (f.OP.value, f.rid, f.next_since, f.next_cursor, f.has_more, f.convs)
    if f.partial is None:
        return body
    return (*body, {"missing": f.partial.missing, "servers": f.partial.servers})


def _array_body(cls: type[Frame]) -> _BodyOf:
    op = cls.OP.value
    names: tuple[str, ...] = cls.__match_args__
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda f: (op, one(f))
    many = attrgetter(*names)
    return lambda f: (op, *many(f))


_BODY_OF: Final[dict[type, _BodyOf]] = {
    Login: _login_body,
    LoginOk: _login_ok_body,
    PushRegister: _push_register_body,
    SyncResult: _sync_result_body,
}
_CONSTANT: Final[dict[type, tuple[bytes, bytes]]] = {}  # field-less frames: (body, frame)

for _cls in (*CLIENT_FRAME_TYPES, *SERVER_FRAME_TYPES):
    if not _cls.__match_args__:
        _body = _pack((_cls.OP.value,))
        _CONSTANT[_cls] = (_body, frame_bytes(_body))
    elif _cls not in _BODY_OF:
        _BODY_OF[_cls] = _array_body(_cls)
del _cls, _body


def encode_body(frame: Frame) -> bytes:
    """The msgpack body of `frame`, without LEN."""
    body_of = _BODY_OF.get(type(frame))
    if body_of is not None:
        return _pack(body_of(frame))
    constant = _CONSTANT.get(type(frame))
    if constant is not None:
        return constant[0]
    raise TypeError(f"not a wire frame: {type(frame).__name__}")


def encode(frame: Frame) -> bytes:
    """The complete wire frame of `frame`: 4-byte big-endian LEN, then the body."""
    body_of = _BODY_OF.get(type(frame))
    if body_of is not None:
        body = _pack(body_of(frame))
        return _pack_len(len(body)) + body
    constant = _CONSTANT.get(type(frame))
    if constant is not None:
        return constant[1]
    raise TypeError(f"not a wire frame: {type(frame).__name__}")
