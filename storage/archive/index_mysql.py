"""The archive index of a MySQL store (storage/archive/index_sqlite.py says what it holds).

Apart from index_sqlite.py because it routes through `MySQLStore`, which reads the archive
index itself (its pages, its idempotency records): one module each way, no cycle."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from storage.archive.index_sqlite import (
    FILES_SQL,
    LAST_RUN_PREFIX,
    UNREAD_INSERT_SQL,
    ArchivedMessage,
    ArchiveFile,
    Status,
    _expected,
    _recent_sends,
    batch_runs,
    expected_head,
    indexed_files,
    unread_rows,
)
from storage.mysql import MySQLStore, sql
from storage.mysql.schema import message_table
from storage.rules import UnreadRun

if TYPE_CHECKING:
    from storage.mysql.settings import MySQLSettings
    from storage.mysql.transactions import Cursor, Transactions


class MySQLIndex:
    """The archive index of a MySQL store. A conversation's index rows live beside its
    messages, on the server of its shard (the shard map: storage/mysql/shardmap.py), so
    the index row and the hot delete commit in one transaction there; `imgw db
    add-server` moves them with the shard. The conversations are listed, and the last
    run recorded, in the metadata database. Routing is the store's own: a MySQLStore is
    opened (and follows the shard map) for it."""

    def __init__(self, settings: MySQLSettings, *, clock: Callable[[], int]) -> None:
        self.settings = settings
        self._clock = clock
        self._store = MySQLStore(settings, clock=clock)

    def _db(self, conv_id: int) -> Transactions:
        return self._store._at(conv_id).db  # the server of the conversation's shard

    def _table(self, conv_id: int) -> str:
        return self._store.shard_of(conv_id)

    async def open(self) -> None:
        await self._store.start()  # refuses a schema older than this imgw's

    async def close(self) -> None:
        await self._store.close()

    def now_ms(self) -> int:
        return self._clock()

    async def conversations(self, after: int, limit: int) -> list[int]:
        async def q(cur: Cursor) -> list[int]:
            # the metadata database allocates every conv_id and keeps its row
            await cur.execute(
                "SELECT conv_id FROM im_conversation WHERE conv_id>%s ORDER BY conv_id LIMIT %s",
                (after, limit),
            )
            return [int(r[0]) for r in await cur.fetchall()]

        return await self._store._db.run(q, tx=False)

    async def archived_top(self, conv_id: int) -> int:
        async def q(cur: Cursor) -> int:
            await cur.execute("SELECT MAX(seq_hi) FROM im_archive WHERE conv_id=%s", (conv_id,))
            row = await cur.fetchone()
            return int(row[0] or 0)

        return await self._db(conv_id).run(q, tx=False)

    async def oldest_hot(self, conv_id: int) -> tuple[int, int] | None:
        async def q(cur: Cursor) -> tuple[int, int] | None:
            await cur.execute(
                f"SELECT seq, send_ms FROM {self._table(conv_id)} WHERE conv_id=%s "
                "ORDER BY seq LIMIT 1",
                (conv_id,),
            )
            row = await cur.fetchone()
            return None if row is None else (int(row[0]), int(row[1]))

        return await self._db(conv_id).run(q, tx=False)

    async def hot_batch(self, conv_id: int, after_seq: int, limit: int) -> list[ArchivedMessage]:
        async def q(cur: Cursor) -> list[ArchivedMessage]:
            await cur.execute(
                f"SELECT {sql.MSG_COLS}, status FROM {self._table(conv_id)} "
                "WHERE conv_id=%s AND seq>%s ORDER BY seq LIMIT %s",
                (conv_id, after_seq, limit),
            )
            return [ArchivedMessage(sql.message_of(r), int(r[8])) for r in await cur.fetchall()]

        return await self._db(conv_id).run(q, tx=False)

    async def commit(
        self, conv_id: int, rows: Sequence[ArchivedMessage], root: str, key: str, size: int
    ) -> bool:
        lo, hi = rows[0].msg.seq, rows[-1].msg.seq
        table = self._table(conv_id)
        now = self._clock()
        runs = unread_rows(conv_id, hi, batch_runs(rows))

        async def body(cur: Cursor) -> bool:
            # The row locks serialise this with a recall of any of them (a recall locks
            # its target FOR UPDATE first): it either landed before (the check fails)
            # or finds the row gone (NO_SUCH_MESSAGE).
            await cur.execute(
                f"SELECT seq, msg_type, status FROM {table} WHERE conv_id=%s "
                "AND seq BETWEEN %s AND %s ORDER BY seq FOR UPDATE",
                (conv_id, lo, hi),
            )
            found = [(int(a), int(b), int(c)) for a, b, c in await cur.fetchall()]
            await cur.execute(
                "SELECT MAX(seq_hi) FROM im_archive WHERE conv_id=%s FOR UPDATE", (conv_id,)
            )
            top = (await cur.fetchone())[0]
            if found != _expected(rows) or int(top or 0) != lo - 1:
                return False
            await cur.execute(
                "INSERT INTO im_archive (conv_id, seq_lo, seq_hi, root, file_key, n_rows, "
                "n_bytes, created_ms) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                (conv_id, lo, hi, root, key, len(rows), size, now),
            )
            if runs:
                await cur.executemany(UNREAD_INSERT_SQL.format(p="%s"), runs)
            sends = _recent_sends(rows, now)
            if sends:
                values = ",".join(
                    sql.row((m.sender_uid, m.client_msg_id.encode(), m.conv_id, m.seq,
                             m.msg_id, m.msg_type, m.content, m.server_ms))
                    for m in sends
                )  # fmt: skip
                await cur.execute(
                    "INSERT IGNORE INTO im_archive_sent (sender_uid, client_msg_id, conv_id, "
                    f"seq, msg_id, msg_type, content, send_ms) VALUES {values}"
                )
            await cur.execute(
                f"DELETE FROM {table} WHERE conv_id=%s AND seq BETWEEN %s AND %s",
                (conv_id, lo, hi),
            )
            return True

        return await self._db(conv_id).run(body)

    async def _expired_to(self, cur: Cursor, conv_id: int, through: int, now: int) -> None:
        await cur.execute(
            "INSERT INTO im_archive (conv_id, seq_lo, seq_hi, root, file_key, n_rows, n_bytes, "
            "created_ms) VALUES (%s, 1, %s, '', '', 0, 0, %s) "
            "ON DUPLICATE KEY UPDATE seq_hi=VALUES(seq_hi)",
            (conv_id, through, now),
        )

    async def expire_file(
        self, conv_id: int, old: ArchiveFile, through: int, new: ArchiveFile | None,
        n_rows: int, n_bytes: int, runs: Sequence[UnreadRun] = (),
    ) -> bool:  # fmt: skip
        now = self._clock()

        async def body(cur: Cursor) -> bool:
            await cur.execute(
                "SELECT seq_lo, seq_hi, file_key FROM im_archive WHERE conv_id=%s "
                "ORDER BY seq_lo LIMIT 2 FOR UPDATE",
                (conv_id,),
            )
            head = [(int(a), int(b), str(k)) for a, b, k in await cur.fetchall()]
            want = expected_head(old)
            if head[: len(want)] != want:
                return False
            await cur.execute(
                "DELETE FROM im_archive WHERE conv_id=%s AND seq_lo=%s", (conv_id, old.seq_lo)
            )
            await cur.execute(
                "DELETE FROM im_archive_unread WHERE conv_id=%s AND seq_hi=%s",
                (conv_id, old.seq_hi),
            )
            await self._expired_to(cur, conv_id, through, now)
            if new is not None:
                await cur.execute(
                    "INSERT INTO im_archive (conv_id, seq_lo, seq_hi, root, file_key, n_rows, "
                    "n_bytes, created_ms) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                    (conv_id, new.seq_lo, new.seq_hi, new.root, new.key, n_rows, n_bytes, now),
                )
                if runs:
                    await cur.executemany(
                        UNREAD_INSERT_SQL.format(p="%s"), unread_rows(conv_id, new.seq_hi, runs)
                    )
            return True

        return await self._db(conv_id).run(body)

    async def expire_hot(self, conv_id: int, rows: Sequence[ArchivedMessage]) -> bool:
        lo, hi = rows[0].msg.seq, rows[-1].msg.seq
        table = self._table(conv_id)
        now = self._clock()

        async def body(cur: Cursor) -> bool:
            # the same locks as the archiver's commit: a recall either landed before
            # (the check fails) or finds the row gone
            await cur.execute(
                f"SELECT seq, msg_type, status FROM {table} WHERE conv_id=%s "
                "AND seq BETWEEN %s AND %s ORDER BY seq FOR UPDATE",
                (conv_id, lo, hi),
            )
            found = [(int(a), int(b), int(c)) for a, b, c in await cur.fetchall()]
            await cur.execute(
                "SELECT MAX(seq_hi), COALESCE(SUM(file_key<>''), 0) FROM im_archive "
                "WHERE conv_id=%s FOR UPDATE",
                (conv_id,),
            )
            top, files = await cur.fetchone()
            if found != _expected(rows) or int(top or 0) != lo - 1 or int(files) != 0:
                return False
            await cur.execute(
                f"DELETE FROM {table} WHERE conv_id=%s AND seq BETWEEN %s AND %s",
                (conv_id, lo, hi),
            )
            await self._expired_to(cur, conv_id, hi, now)
            return True

        return await self._db(conv_id).run(body)

    async def files(self, conv_id: int, lo: int, hi: int) -> list[ArchiveFile]:
        async def q(cur: Cursor) -> list[ArchiveFile]:
            await cur.execute(FILES_SQL.format(p="%s"), (conv_id, hi, lo))
            return indexed_files(conv_id, await cur.fetchall())

        return await self._db(conv_id).run(q, tx=False)

    async def status(self) -> Status:
        hot, hot_bytes, oldest = 0, 0, None
        servers: dict[int, Transactions] = {}
        for shard in range(self._store._shards):
            db = self._db(shard)  # shard n holds conv_ids n, n + shards, ...
            servers[id(db)] = db

            async def count(cur: Cursor, table: str = message_table(shard)) -> tuple[Any, ...]:
                await cur.execute(f"SELECT COUNT(*), MIN(send_ms) FROM {table}")
                n, first = await cur.fetchone()
                await cur.execute(
                    "SELECT COALESCE(SUM(data_length + index_length), 0) FROM "
                    "information_schema.tables WHERE table_schema=DATABASE() AND table_name=%s",
                    (table,),
                )
                return int(n), first, int((await cur.fetchone())[0])

            n, first, size = await db.run(count, tx=False)
            hot += n
            hot_bytes += size
            if first is not None:
                oldest = int(first) if oldest is None else min(oldest, int(first))

        async def archived(cur: Cursor) -> tuple[int, int, int, int]:
            await cur.execute(
                "SELECT COUNT(*), COUNT(DISTINCT conv_id), COALESCE(SUM(n_rows), 0), "
                "COALESCE(SUM(n_bytes), 0) FROM im_archive WHERE file_key<>''"
            )
            files, convs, rows, size = await cur.fetchone()
            return int(files), int(convs), int(rows), int(size)

        files = convs = rows = size = 0
        for db in servers.values():
            f, c, r, b = await db.run(archived, tx=False)
            files, convs, rows, size = files + f, convs + c, rows + r, size + b

        async def last(cur: Cursor) -> dict[str, str]:
            await cur.execute(
                "SELECT name, value FROM im_meta WHERE name LIKE %s", (LAST_RUN_PREFIX + "%",)
            )
            return {n[len(LAST_RUN_PREFIX) :]: v for n, v in await cur.fetchall()}

        last_run = await self._store._db.run(last, tx=False)
        return Status(hot, hot_bytes, oldest, rows, size, files, convs, last_run)

    async def set_last_run(self, fields: dict[str, str]) -> None:
        async def body(cur: Cursor) -> None:
            await cur.execute("DELETE FROM im_meta WHERE name LIKE %s", (LAST_RUN_PREFIX + "%",))
            for k, v in fields.items():
                await cur.execute(
                    "INSERT INTO im_meta (name, value) VALUES (%s, %s)",
                    (LAST_RUN_PREFIX + k, v[:255]),
                )

        await self._store._db.run(body)
