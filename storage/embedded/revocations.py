"""The revocation log of an embedded store: `im_revocation` in its SQLite file (schema 5),
on a connection and thread of its own (the gateway's store has the file open too:
SQLite's locks and the busy timeout share it). Opened at the first call."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from storage.embedded.schema import open_migrated
from storage.revocations import Revocation
from storage.sqlitethread import SqliteThread

_I64_MAX = (1 << 63) - 1
_COLS = "uid, device, revoked_s, expires_s"


def _s(uid: int) -> int:
    """A u64 uid as the signed 64-bit integer SQLite stores (as the store's own)."""
    return uid - (1 << 64) if uid > _I64_MAX else uid


def _u(value: int) -> int:
    return value + (1 << 64) if value < 0 else value


class SqliteRevocationLog:
    """`storage.revocations.RevocationLog` in the embedded store's database file."""

    shared = False  # one gateway process holds the embedded store

    def __init__(
        self,
        path: str,
        *,
        busy_timeout_ms: int = 5000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = path
        self._busy_ms = busy_timeout_ms
        self._clock = clock
        self._thread = SqliteThread("imgw-revocations", self._connect)  # at the first call

    def _connect(self) -> sqlite3.Connection:
        return open_migrated(self._path, self._busy_ms)

    async def record(self, revocation: Revocation) -> None:
        r = revocation
        now_ms = int(self._clock() * 1000)

        def body(c: sqlite3.Connection) -> None:
            c.execute(
                f"INSERT INTO im_revocation ({_COLS}, updated_ms) VALUES (?,?,?,?,?) "
                "ON CONFLICT (uid, device) DO UPDATE SET "
                "revoked_s=max(revoked_s, excluded.revoked_s), "
                "expires_s=max(expires_s, excluded.expires_s), updated_ms=excluded.updated_ms",
                (_s(r.uid), r.device, r.revoked_s, r.expires_s, now_ms),
            )

        await self._thread.call(body)

    async def changed_since(self, since_ms: int | None) -> tuple[list[Revocation], int]:
        now = self._clock()

        def q(c: sqlite3.Connection) -> list[Revocation]:
            if since_ms is None:
                sql, arg = f"SELECT {_COLS} FROM im_revocation WHERE expires_s >= ?", int(now)
            else:
                sql, arg = f"SELECT {_COLS} FROM im_revocation WHERE updated_ms >= ?", since_ms
            return [Revocation(_u(u), d, a, e) for u, d, a, e in c.execute(sql, (arg,))]

        return await self._thread.call(q), int(now * 1000)

    async def prune(self, now_s: int) -> int:
        def body(c: sqlite3.Connection) -> int:
            return c.execute("DELETE FROM im_revocation WHERE expires_s < ?", (now_s,)).rowcount

        return await self._thread.call(body)

    async def close(self) -> None:
        await self._thread.close()
