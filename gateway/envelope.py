"""The bus envelope: what one node publishes to another.

`[kind, [[conn_ids, frame bytes], ...]]`, msgpack-encoded. `FRAMES` writes each frame to
its connections; `KICK` and `REVOKE` close them with KICK duplicate_login or
auth_revoked (their frame bytes are empty); `KICK_AS` closes them with the KICK reason
and text its bytes carry (msgpack `[reason, text]`: the server API's kick). Every node
of a cluster must read what the others write, so the layout and the kind numbers never
change meaning; a new kind is added with a new number, and a node ignores kinds it does
not know.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, cast

import msgpack

FRAMES: Final = 1
KICK: Final = 2  # duplicate_login
REVOKE: Final = 3  # auth_revoked
KICK_AS: Final = 4  # a reason and text of the sender's choosing

Item = tuple[Sequence[int], bytes]  # conn_ids on the target node, and one frame for each


def frames(items: Sequence[Item]) -> bytes:
    """Frames for connections of one node."""
    return _pack(FRAMES, items)


def kick(conn_ids: Iterable[int]) -> bytes:
    """KICK duplicate_login to connections of one node."""
    return _pack(KICK, [(list(conn_ids), b"")])


def revoke(conn_ids: Iterable[int]) -> bytes:
    """KICK auth_revoked to connections of one node."""
    return _pack(REVOKE, [(list(conn_ids), b"")])


def kick_as(conn_ids: Iterable[int], reason: int, text: str) -> bytes:
    """KICK `reason` with `text` to connections of one node."""
    return _pack(KICK_AS, [(list(conn_ids), msgpack.packb([reason, text]))])


def kick_reason(payload: bytes) -> tuple[int, str]:
    """The reason and text a `KICK_AS` item carries; ValueError if it carries none."""
    reason, text = msgpack.unpackb(payload)
    if type(reason) is not int or type(text) is not str:
        raise ValueError(f"not a kick: {reason!r}, {text!r}")
    return reason, text


def unpack(envelope: bytes) -> tuple[int, list[tuple[list[int], bytes]]]:
    """The kind and the items of an envelope (not copied: a malformed item raises when
    it is reached); ValueError if the envelope is not one."""
    try:
        kind, items = msgpack.unpackb(envelope)
    except Exception as e:
        raise ValueError(f"not a bus envelope: {e!r}") from e
    if type(kind) is not int or type(items) is not list:
        raise ValueError(f"not a bus envelope: kind {kind!r}")
    return kind, cast(list[tuple[list[int], bytes]], items)


def _pack(kind: int, items: Sequence[Item]) -> bytes:
    packed: bytes = msgpack.packb([kind, items])  # a tuple packs as an array
    return packed
