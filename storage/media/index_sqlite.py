"""The media index in the store's database: uploads and the conversations referencing
them (tables created by the store's migration: SQLite schema 4, MySQL schema 7).

- `im_media_upload(media_key PK, uid, size, content_type, created_ms, referenced)`: one
  row per key whose upload URL was handed out; `referenced` turns 1 with the first
  reference and never back, so the orphan sweep reads the index `(referenced,
  created_ms)` and never the referenced rows.
- `im_media_ref(media_key, conv_id) PK`: a conversation holds a message carrying the key
  (written before that message's commit: see docs/decisions.md).

The sweep claims an orphan before it deletes its object (`claim`: `created_ms` becomes
`CLAIMED_MS`); a claimed row is never renewed by `record_upload` nor referenced by
`add_reference`, so no message can come to reference an object the sweep is deleting.

Only keys are stored, never URLs.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Final, Protocol

from storage.sqlitethread import SqliteThread

# The created_ms of an upload the orphan sweep has claimed: its object is being deleted,
# then its row; until then it is neither renewed nor referenced.
CLAIMED_MS: Final = 0


@dataclass(frozen=True, slots=True)
class Upload:
    key: str
    uid: int
    size: int
    content_type: str
    created_ms: int
    referenced: bool


class MediaIndex(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def record_upload(
        self, key: str, uid: int, size: int, content_type: str, now_ms: int
    ) -> Upload:
        """Record an upload URL handed out for `key` (again: its size, type and time are
        renewed while no message references it and the sweep has not claimed it); the
        row as it is now."""
        ...

    async def get_upload(self, key: str) -> Upload | None: ...

    async def add_reference(self, key: str, conv_id: int, now_ms: int) -> bool:
        """`conv_id` holds (or is about to hold) a message carrying `key`, an upload that
        `record_upload` recorded; False (writing nothing) if no such upload exists or
        the sweep has claimed it."""
        ...

    async def referencing(self, key: str, limit: int) -> list[int]:
        """Up to `limit` conversations referencing `key`."""
        ...

    async def orphans(self, before_ms: int, limit: int) -> list[Upload]:
        """The oldest `limit` uploads created before `before_ms` that nothing references."""
        ...

    async def claim(self, key: str, before_ms: int) -> bool:
        """Claim an orphan created before `before_ms` for the sweep (its `created_ms`
        becomes CLAIMED_MS); False if it is no such orphan any more (referenced, renewed,
        gone, or claimed already)."""
        ...

    async def forget(self, key: str, before_ms: int) -> bool:
        """Delete the upload row if it is still an orphan created before `before_ms`."""
        ...


_UPLOAD_COLS = "media_key, uid, size, content_type, created_ms, referenced"


def _upload(row: tuple[object, ...]) -> Upload:
    key, uid, size, ctype, ms, ref = row
    return Upload(str(key), int(uid), int(size), str(ctype), int(ms), bool(ref))  # type: ignore[call-overload]


class SqliteMediaIndex:
    """The media index of an embedded store's database file (the gateway's own store has
    it open too: SQLite's locks and the busy timeout share it)."""

    def __init__(self, path: str, *, busy_timeout_ms: int = 5000) -> None:
        self._path = path
        self._busy_ms = busy_timeout_ms
        self._thread = SqliteThread("imgw-media-sqlite", self._connect)

    def _connect(self) -> sqlite3.Connection:
        from storage.embedded.schema import open_migrated

        return open_migrated(self._path, self._busy_ms)

    async def open(self) -> None:
        await self._thread.open()

    async def close(self) -> None:
        await self._thread.close()

    async def record_upload(
        self, key: str, uid: int, size: int, content_type: str, now_ms: int
    ) -> Upload:
        def body(c: sqlite3.Connection) -> Upload:
            c.execute(
                f"INSERT INTO im_media_upload ({_UPLOAD_COLS}) VALUES (?,?,?,?,?,0) "
                "ON CONFLICT (media_key) DO UPDATE SET size=excluded.size, "
                "content_type=excluded.content_type, created_ms=excluded.created_ms "
                f"WHERE referenced=0 AND created_ms<>{CLAIMED_MS}",
                (key, uid, size, content_type, now_ms),
            )
            row = c.execute(
                f"SELECT {_UPLOAD_COLS} FROM im_media_upload WHERE media_key=?", (key,)
            ).fetchone()
            return _upload(row)

        return await self._thread.tx(body)

    async def get_upload(self, key: str) -> Upload | None:
        def q(c: sqlite3.Connection) -> Upload | None:
            row = c.execute(
                f"SELECT {_UPLOAD_COLS} FROM im_media_upload WHERE media_key=?", (key,)
            ).fetchone()
            return None if row is None else _upload(row)

        return await self._thread.call(q)

    async def add_reference(self, key: str, conv_id: int, now_ms: int) -> bool:
        def body(c: sqlite3.Connection) -> bool:
            found = c.execute(
                "UPDATE im_media_upload SET referenced=1 WHERE media_key=? AND created_ms<>?",
                (key, CLAIMED_MS),
            ).rowcount
            if not found:
                return False
            c.execute(
                "INSERT OR IGNORE INTO im_media_ref (media_key, conv_id, created_ms) "
                "VALUES (?,?,?)",
                (key, conv_id, now_ms),
            )
            return True

        return await self._thread.tx(body)

    async def referencing(self, key: str, limit: int) -> list[int]:
        def q(c: sqlite3.Connection) -> list[int]:
            rows = c.execute(
                "SELECT conv_id FROM im_media_ref WHERE media_key=? ORDER BY conv_id LIMIT ?",
                (key, limit),
            ).fetchall()
            return [int(r[0]) for r in rows]

        return await self._thread.call(q)

    async def orphans(self, before_ms: int, limit: int) -> list[Upload]:
        def q(c: sqlite3.Connection) -> list[Upload]:
            rows = c.execute(
                f"SELECT {_UPLOAD_COLS} FROM im_media_upload "
                "WHERE referenced=0 AND created_ms<? ORDER BY created_ms LIMIT ?",
                (before_ms, limit),
            ).fetchall()
            return [_upload(r) for r in rows]

        return await self._thread.call(q)

    async def claim(self, key: str, before_ms: int) -> bool:
        def body(c: sqlite3.Connection) -> bool:
            return bool(
                c.execute(
                    "UPDATE im_media_upload SET created_ms=? WHERE media_key=? "
                    "AND referenced=0 AND created_ms<? AND created_ms<>?",
                    (CLAIMED_MS, key, before_ms, CLAIMED_MS),
                ).rowcount
            )

        return await self._thread.tx(body)

    async def forget(self, key: str, before_ms: int) -> bool:
        def body(c: sqlite3.Connection) -> bool:
            return bool(
                c.execute(
                    "DELETE FROM im_media_upload "
                    "WHERE media_key=? AND referenced=0 AND created_ms<?",
                    (key, before_ms),
                ).rowcount
            )

        return await self._thread.tx(body)
