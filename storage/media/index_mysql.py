"""The media index of a MySQL store, in its metadata database (storage/media/index_sqlite.py
says what it holds). Media rows are keyed by the object key, not by conversation, so
they live beside the conversation directory rather than on the shard servers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.media.index_sqlite import _UPLOAD_COLS, CLAIMED_MS, Upload, _upload
from storage.mysql.transactions import Transactions, rowcount

if TYPE_CHECKING:
    from storage.mysql.settings import MySQLSettings
    from storage.mysql.transactions import Cursor


class MySQLMediaIndex:
    def __init__(self, settings: MySQLSettings) -> None:
        self.settings = settings
        self._db = Transactions(settings)

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    async def record_upload(
        self, key: str, uid: int, size: int, content_type: str, now_ms: int
    ) -> Upload:
        async def body(cur: Cursor) -> Upload:
            # the row's own values are kept once it is referenced or claimed by the sweep
            # (created_ms last: the assignments before it read its old value)
            fresh = f"referenced=0 AND created_ms<>{CLAIMED_MS}"
            await cur.execute(
                f"INSERT INTO im_media_upload ({_UPLOAD_COLS}) VALUES (%s,%s,%s,%s,%s,0) "
                "ON DUPLICATE KEY UPDATE "
                f"size=IF({fresh}, VALUES(size), size), "
                f"content_type=IF({fresh}, VALUES(content_type), content_type), "
                f"created_ms=IF({fresh}, VALUES(created_ms), created_ms)",
                (key, uid, size, content_type, now_ms),
            )
            await cur.execute(
                f"SELECT {_UPLOAD_COLS} FROM im_media_upload WHERE media_key=%s", (key,)
            )
            return _upload(await cur.fetchone())

        return await self._db.run(body)

    async def get_upload(self, key: str) -> Upload | None:
        async def q(cur: Cursor) -> Upload | None:
            await cur.execute(
                f"SELECT {_UPLOAD_COLS} FROM im_media_upload WHERE media_key=%s", (key,)
            )
            row = await cur.fetchone()
            return None if row is None else _upload(row)

        return await self._db.run(q, tx=False)

    async def add_reference(self, key: str, conv_id: int, now_ms: int) -> bool:
        async def body(cur: Cursor) -> bool:
            await cur.execute(
                "SELECT referenced, created_ms FROM im_media_upload WHERE media_key=%s FOR UPDATE",
                (key,),
            )
            row = await cur.fetchone()
            if row is None or (not row[0] and int(row[1]) == CLAIMED_MS):
                return False  # no upload, or the sweep is deleting it
            if not row[0]:
                await cur.execute(
                    "UPDATE im_media_upload SET referenced=1 WHERE media_key=%s", (key,)
                )
            await cur.execute(
                "INSERT IGNORE INTO im_media_ref (media_key, conv_id, created_ms) "
                "VALUES (%s,%s,%s)",
                (key, conv_id, now_ms),
            )
            return True

        return await self._db.run(body)

    async def referencing(self, key: str, limit: int) -> list[int]:
        async def q(cur: Cursor) -> list[int]:
            await cur.execute(
                "SELECT conv_id FROM im_media_ref WHERE media_key=%s ORDER BY conv_id LIMIT %s",
                (key, limit),
            )
            return [int(r[0]) for r in await cur.fetchall()]

        return await self._db.run(q, tx=False)

    async def orphans(self, before_ms: int, limit: int) -> list[Upload]:
        async def q(cur: Cursor) -> list[Upload]:
            await cur.execute(
                f"SELECT {_UPLOAD_COLS} FROM im_media_upload "
                "WHERE referenced=0 AND created_ms<%s ORDER BY created_ms LIMIT %s",
                (before_ms, limit),
            )
            return [_upload(r) for r in await cur.fetchall()]

        return await self._db.run(q, tx=False)

    async def claim(self, key: str, before_ms: int) -> bool:
        async def body(cur: Cursor) -> bool:
            await cur.execute(
                "UPDATE im_media_upload SET created_ms=%s WHERE media_key=%s "
                "AND referenced=0 AND created_ms<%s AND created_ms<>%s",
                (CLAIMED_MS, key, before_ms, CLAIMED_MS),
            )
            return rowcount(cur) > 0

        return await self._db.run(body)

    async def forget(self, key: str, before_ms: int) -> bool:
        async def body(cur: Cursor) -> bool:
            await cur.execute(
                "DELETE FROM im_media_upload WHERE media_key=%s AND referenced=0 AND created_ms<%s",
                (key, before_ms),
            )
            return rowcount(cur) > 0

        return await self._db.run(body)
