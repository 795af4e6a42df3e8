"""Named leases in MySQL (`im_lease`, schema 6): one node at a time does a job.

A lease is a row `(name, owner, expires_ms)` in the metadata database. `take` renews it
for its holder, or takes it over once it has expired, in one transaction; the holder is
whoever's name the row carries afterwards. Expiry is judged by the database server's
clock, so the nodes' clocks may disagree. It works with or without Redis: only MySQL,
the authority, is involved.

What it guards must stay correct when two nodes run it at once for a moment (a holder
paused past its expiry, then resuming): it is for load, not for safety. Pruning
(`MySQLStore.maintain`) is such a job: a DELETE of expired rows, idempotent.
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Final

from storage.mysql.transactions import Cursor, Transactions

DB_NOW_MS: Final = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"


def default_owner() -> str:
    """A name unique to this process and store: host, pid, random suffix."""
    return f"{socket.gethostname()[:80]}/{os.getpid()}/{secrets.token_hex(4)}"


class Lease:
    """The lease `name` in `db`, taken as `owner` for `ttl_ms` at a time."""

    def __init__(self, db: Transactions, name: str, owner: str, ttl_ms: int) -> None:
        if ttl_ms <= 0:
            raise ValueError("a lease's ttl must be > 0 ms")
        self._db = db
        self.name = name
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.held = False  # as of the last take/release
        self.taken = 0  # times it was taken over (not renewed)

    async def take(self) -> bool:
        """Renew the lease if this owner holds it, take it if it is free or expired;
        whether this owner holds it now (for ttl_ms from the database's now)."""

        async def body(cur: Cursor) -> tuple[bool, bool]:
            await cur.execute(
                "SELECT owner, expires_ms >= " + DB_NOW_MS + " FROM im_lease "
                "WHERE name=%s FOR UPDATE",
                (self.name,),
            )
            row = await cur.fetchone()
            if row is None:
                await cur.execute(
                    "INSERT IGNORE INTO im_lease (name, owner, expires_ms) "
                    "VALUES (%s, %s, " + DB_NOW_MS + " + %s)",
                    (self.name, self.owner, self.ttl_ms),
                )
            elif row[0] == self.owner or not row[1]:
                await cur.execute(
                    "UPDATE im_lease SET owner=%s, expires_ms=" + DB_NOW_MS + " + %s WHERE name=%s",
                    (self.owner, self.ttl_ms, self.name),
                )
            else:
                return False, False
            await cur.execute("SELECT owner FROM im_lease WHERE name=%s", (self.name,))
            now = await cur.fetchone()
            return now is not None and now[0] == self.owner, row is None or row[0] != self.owner

        held, new = await self._db.run(body)
        if held and new:
            self.taken += 1
        self.held = held
        return held

    async def release(self) -> None:
        """Let the lease go now (if held), so another node need not wait for expiry."""

        async def body(cur: Cursor) -> None:
            await cur.execute(
                "UPDATE im_lease SET expires_ms=0 WHERE name=%s AND owner=%s",
                (self.name, self.owner),
            )

        if self.held:
            self.held = False
            await self._db.run(body)

    async def holder(self) -> tuple[str, bool] | None:
        """(owner, unexpired) of the lease's row; None when nobody ever took it."""

        async def body(cur: Cursor) -> tuple[str, bool] | None:
            await cur.execute(
                "SELECT owner, expires_ms >= " + DB_NOW_MS + " FROM im_lease WHERE name=%s",
                (self.name,),
            )
            row = await cur.fetchone()
            return None if row is None else (str(row[0]), bool(row[1]))

        return await self._db.run(body, tx=False)
