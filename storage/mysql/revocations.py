"""The revocation log of a MySQL store: `im_revocation` (schema 9) in its metadata
database, on the store's own pool. Revocations are keyed by uid, and no commit reads
them, so they live beside the conversation directory rather than on the shard servers.

Each node reads the rows changed since its previous read once a second; `updated_ms` is
stamped with the database's clock, so the nodes' clocks may disagree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from storage.mysql.lease import DB_NOW_MS
from storage.mysql.transactions import next_rows, rowcount
from storage.revocations import Revocation

if TYPE_CHECKING:
    from collections.abc import Sequence

    from storage.mysql.transactions import Cursor, Row, Transactions

_COLS: Final = "uid, device, revoked_s, expires_s"
PRUNE_BATCH: Final = 1_000  # expired rows deleted by one prune
LOAD_PAGE: Final = 5_000  # rows per page of a node's load


def _revocations(rows: Sequence[Row]) -> list[Revocation]:
    return [Revocation(int(u), str(d), int(a), int(e)) for u, d, a, e in rows]


class MySQLRevocationLog:
    """`storage.revocations.RevocationLog` in a MySQL store's metadata database."""

    shared = True  # every node of the deployment writes it

    def __init__(self, db: Transactions) -> None:
        self._db = db

    async def record(self, revocation: Revocation) -> None:
        r = revocation

        async def body(cur: Cursor) -> None:
            await cur.execute(
                f"INSERT INTO im_revocation ({_COLS}, updated_ms) "
                f"VALUES (%s, %s, %s, %s, {DB_NOW_MS}) ON DUPLICATE KEY UPDATE "
                "revoked_s=GREATEST(revoked_s, VALUES(revoked_s)), "
                "expires_s=GREATEST(expires_s, VALUES(expires_s)), "
                "updated_ms=VALUES(updated_ms)",
                (r.uid, r.device, r.revoked_s, r.expires_s),
            )

        await self._db.run(body, tx=False)  # one statement, committed on its own

    async def changed_since(self, since_ms: int | None) -> tuple[list[Revocation], int]:
        """Changes: one round trip. Every live revocation (a node's start): pages of
        LOAD_PAGE rows in key order, so that a big table is neither read in one result
        nor scanned for each page."""

        async def q(cur: Cursor) -> tuple[list[Revocation], int]:
            # the clock first: a row committed after it is read next time
            if since_ms is not None:
                await cur.execute(
                    f"SELECT {DB_NOW_MS}; "
                    f"SELECT {_COLS} FROM im_revocation WHERE updated_ms >= {int(since_ms):d}"
                )
                ((now_ms,),) = await cur.fetchall()
                return _revocations(await next_rows(cur)), int(now_ms)
            await cur.execute(f"SELECT {DB_NOW_MS}, CAST(UNIX_TIMESTAMP() AS SIGNED)")
            ((now_ms, now_s),) = await cur.fetchall()
            found: list[Revocation] = []
            after: tuple[int, str] = (0, "")
            while True:
                await cur.execute(
                    f"SELECT {_COLS} FROM im_revocation "
                    "WHERE (uid > %s OR (uid = %s AND device > %s)) AND expires_s >= %s "
                    "ORDER BY uid, device LIMIT %s",
                    (after[0], after[0], after[1], now_s, LOAD_PAGE),
                )
                page = _revocations(await cur.fetchall())
                found += page
                if len(page) < LOAD_PAGE:
                    return found, int(now_ms)
                after = (page[-1].uid, page[-1].device)

        return await self._db.run(q, tx=False)

    async def prune(self, now_s: int) -> int:
        async def body(cur: Cursor) -> int:
            await cur.execute(
                "DELETE FROM im_revocation WHERE expires_s < %s LIMIT %s", (now_s, PRUNE_BATCH)
            )
            return rowcount(cur)

        return await self._db.run(body, tx=False)

    async def close(self) -> None:
        """Nothing: the pool is the store's."""
