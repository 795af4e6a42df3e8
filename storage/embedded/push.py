"""Offline push registrations and mutes in the embedded store's SQLite file
(`im_push_device`, `im_conv_mute`: schema 7). Functions of a connection: the store runs
the writes in its writer thread's transactions and the reads on its reader thread. The
rules are storage/push.py's."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

from storage.badges import (
    BadgeCounts,
    Span,
    Window,
    count_one_sql,
    spans,
    windows_sql,
)
from storage.models import PushDevice
from storage.push import (
    chunks,
    mute_until,
    muted_sql,
    pair_chunks,
    plan_register,
)

_I64_MAX: Final = (1 << 63) - 1
_COLS: Final = "uid, device, provider, token, preview, locale, updated_ms"
_COUNT_SQL: Final = count_one_sql("?")


def _s(uid: int) -> int:
    """A u64 id as the signed 64-bit integer SQLite stores (as the store's own)."""
    return uid - (1 << 64) if uid > _I64_MAX else uid


def _u(value: int) -> int:
    return value + (1 << 64) if value < 0 else value


def register(
    conn: sqlite3.Connection,
    uid: int,
    device: str,
    provider: str,
    token: str,
    *,
    preview: bool,
    locale: str,
    now_ms: int,
    max_devices: int,
) -> list[tuple[int, str]]:
    """In the caller's transaction: the token moves here, the uid's oldest beyond
    `max_devices` go, the device's row is written. The (uid, device)s removed."""
    su = _s(uid)
    holder = "provider=? AND token=? AND NOT (uid=? AND device=?)"
    args = (provider, token, su, device)
    moved = conn.execute(f"SELECT uid, device FROM im_push_device WHERE {holder}", args)
    gone = [(_u(u), str(d)) for u, d in moved.fetchall()]
    conn.execute(f"DELETE FROM im_push_device WHERE {holder}", args)
    mine = conn.execute("SELECT device, updated_ms FROM im_push_device WHERE uid=?", (su,))
    plan = plan_register(mine.fetchall(), device, now_ms, max_devices=max_devices)
    conn.executemany(
        "DELETE FROM im_push_device WHERE uid=? AND device=?", [(su, d) for d in plan.evicted]
    )
    conn.execute(
        f"INSERT INTO im_push_device ({_COLS}) VALUES (?,?,?,?,?,?,?) "
        "ON CONFLICT (uid, device) DO UPDATE SET provider=excluded.provider, "
        "token=excluded.token, preview=excluded.preview, locale=excluded.locale, "
        "updated_ms=excluded.updated_ms",
        (su, device, provider, token, int(preview), locale, plan.stamp_ms),
    )
    return gone + [(uid, d) for d in plan.evicted]


def unregister(conn: sqlite3.Connection, uid: int, device: str) -> bool:
    cur = conn.execute("DELETE FROM im_push_device WHERE uid=? AND device=?", (_s(uid), device))
    return cur.rowcount > 0


def delete_token(conn: sqlite3.Connection, provider: str, token: str) -> bool:
    cur = conn.execute("DELETE FROM im_push_device WHERE provider=? AND token=?", (provider, token))
    return cur.rowcount > 0


def devices(conn: sqlite3.Connection, uids: Sequence[int]) -> dict[int, list[PushDevice]]:
    found: dict[int, list[PushDevice]] = {}
    for part in chunks(uids):
        marks = ",".join("?" * len(part))
        rows = conn.execute(
            f"SELECT {_COLS} FROM im_push_device WHERE uid IN ({marks}) "
            "ORDER BY uid, updated_ms DESC",
            tuple(map(_s, part)),
        )
        for u, d, p, t, preview, locale, ms in rows:
            found.setdefault(_u(u), []).append(
                PushDevice(_u(u), d, p, t, bool(preview), locale, ms)
            )
    return found


def set_mute(conn: sqlite3.Connection, conv_id: int, uid: int, until_ms: int, now_ms: int) -> None:
    until = mute_until(until_ms, now_ms)
    if until is None:
        conn.execute("DELETE FROM im_conv_mute WHERE conv_id=? AND uid=?", (conv_id, _s(uid)))
        return
    conn.execute(
        "INSERT INTO im_conv_mute (conv_id, uid, until_ms) VALUES (?,?,?) "
        "ON CONFLICT (conv_id, uid) DO UPDATE SET until_ms=excluded.until_ms",
        (conv_id, _s(uid), until),
    )


def muted(
    conn: sqlite3.Connection, pairs: Sequence[tuple[int, int]], now_ms: int
) -> set[tuple[int, int]]:
    found: set[tuple[int, int]] = set()
    for part in pair_chunks((c, u) for c, u in pairs if c <= _I64_MAX):
        rows = conn.execute(
            muted_sql(len(part), "?"), (*(v for c, u in part for v in (c, _s(u))), now_ms)
        )
        found.update((int(c), _u(u)) for c, u in rows)
    return found


def unread_badges(
    conn: sqlite3.Connection, uids: Sequence[int], counts: BadgeCounts
) -> dict[int, int]:
    windows: list[Window] = []
    counted: dict[Span, int] = {}
    conn.execute("BEGIN")  # one read transaction for every statement, not one each
    try:
        for ids in chunks(uids):
            for uid, active, conv_id, lo, hi in conn.execute(
                windows_sql(len(ids), "?", greatest="MAX"), tuple(map(_s, ids))
            ):
                windows.append(Window(_u(uid), int(conv_id), int(active), int(lo), int(hi)))
        plans = counts.plan(windows)
        for span in spans(plans):  # one prepared statement: the statement cache keeps it
            uid, conv_id, lo, hi = span
            (counted[span],) = conn.execute(_COUNT_SQL, (conv_id, lo, hi, _s(uid))).fetchone()
    finally:
        conn.execute("COMMIT")
    return counts.badges(plans, counted)
