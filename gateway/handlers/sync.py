"""SYNC: the conversations that changed since the caller's last pass.

`since` and `cursor` are opaque to clients. Here `since` is the store time (ms) at which
the previous pass started, and each pass lists rows changed at or after `since` minus
SYNC_OVERLAP_MS, so a commit that landed late or a node whose clock runs behind is listed
again rather than missed. A pass pages through rows by (last_active_ms, conv_id)
descending; the cursor carries the pass's start time (every page returns the same
`next_since`), its `since` and the last key served. A row that changes during a pass may
move ahead of the cursor and be skipped on this pass; its change time is after the pass
started, so the next pass lists it.

A store spread over several servers answers without a server that is down (a partial
page, `SyncPage.missing`): the answer carries `partial` (how many servers are missing),
and the pass is not taken as done: every later page of it, and the pass's answer to keep,
returns the pass's own `since` as `next_since` (the cursor carries the fact with tag
b"P"), so the next pass lists again everything changed since, the missed conversations
included. A client that ignores `partial` thus skips nothing; it lists the conversations
the answering servers hold again (docs/protocol.md, Paging and SYNC).

Wire forms (bin): since = b"S" + u64 ms; cursor = tag + u64 pass_ms + u64 since_ms +
u64 last_active_ms + u64 conv_id, tag b"C" (b"P": a page of this pass was partial). `0`
is the initial value of both.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gateway.handlers.base import RequestError, page_limit
from protocol.frames import ConvRecord, Sync, SyncPartial, SyncResult
from protocol.ops import ErrorCode

if TYPE_CHECKING:
    from gateway.ports import Services, Session

SYNC_OVERLAP_MS: Final = 10_000
CONV_LIMIT_DEFAULT: Final = 100
CONV_LIMIT_MAX: Final = 500
FUTURE_SLACK_MS: Final = 300_000  # a since this far ahead of our clock was never issued

_SINCE: Final = struct.Struct(">cQ")
_CURSOR: Final = struct.Struct(">cQQQQ")
_WHOLE: Final = b"C"
_PARTIAL: Final = b"P"
_I64: Final = 1 << 63


def encode_since(ms: int) -> bytes:
    return _SINCE.pack(b"S", ms)


def decode_since(value: int | str | bytes, now_ms: int) -> int:
    if value == 0 and type(value) is int:
        return 0
    if isinstance(value, bytes) and len(value) == _SINCE.size:
        tag, ms = _SINCE.unpack(value)
        if tag == b"S" and ms <= now_ms + FUTURE_SLACK_MS:
            return int(ms)
    raise RequestError(ErrorCode.BAD_REQUEST, "since was not issued by this server; use 0")


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a pass stands: when it started, the key of the last row served, and whether
    a page of it was partial."""

    pass_ms: int
    last_active_ms: int
    conv_id: int
    partial: bool = False

    def encode(self, since_ms: int) -> bytes:
        tag = _PARTIAL if self.partial else _WHOLE
        return _CURSOR.pack(tag, self.pass_ms, since_ms, self.last_active_ms, self.conv_id)


def decode_cursor(value: int | str | bytes, since_ms: int) -> Cursor | None:
    """The cursor of the last page served, or None for page 1."""
    if value == 0 and type(value) is int:
        return None
    if isinstance(value, bytes) and len(value) == _CURSOR.size:
        tag, pass_ms, c_since, active, conv_id = _CURSOR.unpack(value)
        # A forged cursor can carry any u64; the stores take signed 64-bit integers.
        if (
            tag in (_WHOLE, _PARTIAL)
            and c_since == since_ms
            and max(pass_ms, active, conv_id) < _I64
        ):
            return Cursor(pass_ms, active, conv_id, tag == _PARTIAL)
    raise RequestError(
        ErrorCode.BAD_REQUEST, "cursor was not issued for this since; restart with cursor 0"
    )


async def sync(node: Services, conn: Session, f: Sync) -> None:
    store = node.store
    now = store.now_ms()
    since_ms = decode_since(f.since, now)
    after = decode_cursor(f.cursor, since_ms)
    pass_ms = now if after is None else after.pass_ms
    limit = page_limit(f.limit, CONV_LIMIT_DEFAULT, CONV_LIMIT_MAX)
    page = await store.sync(
        conn.uid,
        conn.device,
        changed_since_ms=max(0, since_ms - SYNC_OVERLAP_MS) if since_ms else 0,
        after=None if after is None else (after.last_active_ms, after.conv_id),
        limit=limit,
    )
    partial_pass = page.missing > 0 or (after is not None and after.partial)
    rows = tuple(
        ConvRecord(
            r.conv_id,
            r.kind,
            r.max_seq,
            r.read_seq,
            r.delivered_seq,
            r.unread,
            r.last_active_ms,
            r.is_member,
        )
        for r in page.rows
    )
    next_cursor: int | bytes = 0
    if page.has_more and rows:
        last = rows[-1]
        next_cursor = Cursor(pass_ms, last.last_active_ms, last.conv_id, partial_pass).encode(
            since_ms
        )
    # A partial pass is not done: the next pass starts from this one's since again.
    next_since = encode_since(since_ms if partial_pass else pass_ms)
    partial = SyncPartial(page.missing, page.servers) if page.missing else None
    conn.send(SyncResult(f.rid, next_since, next_cursor, bool(next_cursor), rows, partial))
