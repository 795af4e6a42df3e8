"""The MySQL store's connection pool and transaction runner.

Every transaction retries on deadlock, lock wait timeout and duplicate key (a
concurrent duplicate send), and maps connection trouble to `StoreUnavailable`. A COMMIT
that went unanswered is recorded (`CommitWatch`) so the caller can fence its server
thread (`Transactions.fence`) and then ask what landed. A body may send its COMMIT at
the end of its last writes (`execute_and_commit`: one round trip fewer), under the same
watch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final, TypeVar, cast

import asyncmy
from asyncmy import errors as db_errors
from asyncmy.connection import Connection
from asyncmy.cursors import Cursor
from asyncmy.pool import Pool

from storage.errors import StoreUnavailable
from storage.looplag import Deadline
from storage.mysql.settings import MySQLSettings
from storage.mysql.sql import Row

T = TypeVar("T")

__all__ = [
    "CommitWatch",
    "Cursor",
    "Row",
    "Transactions",
    "execute_and_commit",
    "next_rows",
    "rowcount",
]

_RETRY_ERRNOS: Final = {1213, 1205, 1062}  # deadlock, lock wait timeout, duplicate key
_MAX_ATTEMPTS: Final = 4
_UNKNOWN_THREAD: Final = 1094  # KILL of a connection id the server no longer has
_NO_SUCH_TABLE: Final = 1146


@dataclass(slots=True)
class CommitWatch:
    """Where the last attempt's COMMIT stands. `unanswered`: it was sent and no answer
    came back (a timeout, a dropped connection), so it may still land."""

    thread_id: int = 0  # the server thread (connection id) it was sent on
    unanswered: bool = False

    def sent(self, conn: Connection) -> None:
        """A COMMIT is about to go out on `conn`."""
        self.thread_id = conn.thread_id()
        self.unanswered = True

    def answered(self, error: BaseException | None = None) -> None:
        """Its answer came: success, or `error`. Only a server's own error (a MySQL
        errno below 2000) is an answer; any other failure leaves the COMMIT in doubt."""
        if error is None:
            self.unanswered = False
        elif isinstance(error, db_errors.MySQLError):
            errno = error.args[0] if error.args and isinstance(error.args[0], int) else 0
            if 0 < errno < 2000:  # the server answered with an error: not committed
                self.unanswered = False


async def execute_and_commit(cur: Cursor, statements: str, watch: CommitWatch) -> None:
    """Run `statements` (`;`-separated; may be empty) and COMMIT in one round trip, for
    a body run with `Transactions.run(..., commits=True)`. If a statement fails, MySQL
    runs none after it, so the COMMIT is skipped and the error raises. The COMMIT goes
    out under `watch`, as `run`'s own does: if no answer comes, the caller fences the
    server thread before saying anything about the outcome."""
    watch.sent(cur.connection)
    try:
        await cur.execute(f"{statements};COMMIT" if statements else "COMMIT")
        while await cur.nextset():  # each statement's result; errors raise
            pass
    except BaseException as e:
        watch.answered(e)
        raise
    watch.answered()


async def next_rows(cur: Cursor) -> list[Row]:
    """The rows of the next statement of a multi-statement query."""
    if not await cur.nextset():
        raise StoreUnavailable("MySQL answered fewer result sets than statements sent")
    return await cur.fetchall()


def rowcount(cur: Cursor) -> int:
    """The rows the last statement matched or changed (asyncmy's stub says `object`;
    the driver sets an int)."""
    return int(cast(int, cur.rowcount))


class Transactions:
    """The pool of one MySQL store, and `run`, which runs a body in a transaction."""

    def __init__(self, settings: MySQLSettings) -> None:
        self.settings = settings
        self._pool: Pool | None = None
        self._lazy = False  # open(lazy=True): a failed open is retried at the next use
        self._opening = asyncio.Lock()
        # called when a statement finds a message shard renamed away (a shard moving,
        # storage/mysql/move.py): the store reads the shard map at once
        self.on_shard_moving: Callable[[], None] | None = None

    async def open(self, *, lazy: bool = False) -> None:
        """Open the pool. `lazy`: a server that does not answer now is tried again by
        the next operation (a shard server down must not stop a gateway's start)."""
        self._lazy = lazy
        try:
            await self._open()
        except StoreUnavailable:
            if not lazy:
                raise

    async def _open(self) -> None:
        s = self.settings
        try:
            self._pool = await asyncio.wait_for(
                asyncmy.create_pool(
                    host=s.host, port=s.port, user=s.user, password=s.password,
                    database=s.database,
                    minsize=1, maxsize=s.pool, autocommit=True, charset="utf8mb4",
                    connect_timeout=s.timeout_s, pool_recycle=3600,
                ),
                timeout=s.timeout_s * 2,
            )  # fmt: skip
        except (db_errors.Error, OSError, TimeoutError) as e:
            hint = (
                "create it with `imgw db migrate --store mysql://...`"
                if "1049" in str(e)
                else "is the server up and the URL right?"
            )
            raise StoreUnavailable(
                f"cannot open MySQL {s.user}@{s.host}:{s.port}/{s.database}: {e}; {hint}"
            ) from e

    async def close(self) -> None:
        self._lazy = False
        if self._pool is not None:
            self._pool.close()
            await self._pool.wait_closed()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Connection]:
        pool = self._pool
        if pool is None and self._lazy:
            async with self._opening:
                if self._pool is None:
                    await self._open()
            pool = self._pool
        if pool is None:
            raise StoreUnavailable("MySQL store not started")
        try:
            # no wait_for: its task would cost a loop iteration on every checkout, and the
            # pool hands out a free connection without awaiting anything
            async with Deadline(self.settings.timeout_s):
                conn = await pool.acquire()
        except (db_errors.Error, OSError, TimeoutError) as e:
            raise StoreUnavailable(f"MySQL unavailable: {e!r}") from e
        except RuntimeError as e:  # the pool closed under it: the node is stopping
            raise StoreUnavailable(f"MySQL store closed: {e}") from e
        healthy = False
        try:
            yield conn
            healthy = True
        finally:
            if not healthy:
                conn.close()  # unknown state (cancelled, broken): never reuse it
            pool.release(conn)

    async def run(
        self,
        body: Callable[[Cursor], Awaitable[T]],
        *,
        tx: bool = True,
        own_tx: bool = False,
        commits: bool = False,
        watch: CommitWatch | None = None,
    ) -> T:
        """Run `body` in one transaction (or, `tx=False`, as autocommit reads: one round
        trip each, no COMMIT), retrying transient conflicts; bounded by the timeout.
        `own_tx`: the body sends BEGIN itself, inside its first multi-statement round
        trip. `commits`: the body sends COMMIT itself, behind its last writes
        (`execute_and_commit`, under `watch`, which is then required). Otherwise COMMIT
        is a round trip of its own. Either way a body given up on (its timeout) must not
        commit later (a COMMIT queued behind a statement waiting on a lock would still
        run after the client closed the connection): `watch` records whether a COMMIT
        went unanswered, so the caller can fence its thread (see `CommitWatch`)."""
        if commits and watch is None:
            raise ValueError("a body that commits needs a CommitWatch")
        for attempt in range(_MAX_ATTEMPTS):
            if watch is not None:
                watch.unanswered = False
            try:
                async with self._conn() as conn, conn.cursor() as cur:
                    try:
                        # more time while the node itself is late (storage/looplag.py)
                        async with Deadline(self.settings.timeout_s):
                            if not tx:
                                return await body(cur)
                            if not own_tx:  # else the body's queries begin it
                                await conn.begin()
                            result = await body(cur)
                            if not commits:
                                await self._commit(conn, watch)
                            return result
                    except BaseException:
                        if tx and conn.connected:
                            try:
                                async with asyncio.timeout(1.0):
                                    await conn.rollback()
                            except Exception:
                                conn.close()
                        raise
            except db_errors.MySQLError as e:
                errno = e.args[0] if e.args and isinstance(e.args[0], int) else 0
                if errno in _RETRY_ERRNOS and attempt + 1 < _MAX_ATTEMPTS:
                    await asyncio.sleep(0.002 * (attempt + 1))
                    continue
                if errno == _NO_SUCH_TABLE and "im_message_" in str(e):
                    # a shard being moved to another server (`imgw db add-server`
                    # renamed it here); the store follows the new map within a second
                    if self.on_shard_moving is not None:
                        self.on_shard_moving()
                    raise StoreUnavailable(f"MySQL: message shard moving: {e}") from e
                if isinstance(e, db_errors.OperationalError | db_errors.InterfaceError):
                    await self._forget_idle_connections()
                    raise StoreUnavailable(f"MySQL: {e}") from e
                if errno in _RETRY_ERRNOS:
                    raise StoreUnavailable(f"MySQL kept conflicting: {e}") from e
                if watch is not None and watch.unanswered:
                    raise StoreUnavailable(f"MySQL: COMMIT failed: {e!r}") from e
                raise
            except (TimeoutError, OSError, ConnectionError) as e:
                await self._forget_idle_connections()
                raise StoreUnavailable(f"MySQL: {e!r}") from e
            except Exception as e:
                if watch is not None and watch.unanswered:  # whatever broke the link
                    await self._forget_idle_connections()
                    raise StoreUnavailable(f"MySQL: COMMIT failed: {e!r}") from e
                raise
        raise AssertionError("unreachable")

    @staticmethod
    async def _commit(conn: Connection, watch: CommitWatch | None) -> None:
        if watch is None:
            await conn.commit()
            return
        watch.sent(conn)
        try:
            await conn.commit()
        except BaseException as e:
            watch.answered(e)
            raise
        watch.answered()

    async def fence(self, thread_id: int) -> None:
        """Make sure the server thread whose COMMIT went unanswered is gone, so that the
        COMMIT can no longer land (a delayed packet reaching a live thread would commit
        it): KILL it from another connection and wait until the server no longer lists
        it. Raises StoreUnavailable when that cannot be done within the timeout."""

        async def q(cur: Cursor) -> None:
            try:
                await cur.execute(f"KILL CONNECTION {thread_id:d}")
            except db_errors.MySQLError as e:
                if not (e.args and e.args[0] == _UNKNOWN_THREAD):
                    raise
            while True:
                await cur.execute(
                    f"SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = {thread_id:d}"
                )
                if not await cur.fetchall():
                    return
                await asyncio.sleep(0.02)

        await self.run(q, tx=False)

    async def _forget_idle_connections(self) -> None:
        """After a connection failure the pooled idle connections are likely dead too
        (server restarted, network cut): close them so the next operations reconnect
        instead of failing one by one."""
        if self._pool is not None:
            await self._pool.clear()
