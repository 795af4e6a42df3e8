"""One SQLite connection on a thread of its own, used from the event loop.

The SQLite adapters (the embedded store's writer, reader and checkpointer, the archive
and media indexes, the revocation log) each hold one or more of these: the connection is
opened, used and closed on its thread only, so the event loop never blocks on SQLite,
and one connection's statements never interleave. A `sqlite3.Error` reaches the caller
as `StoreUnavailable`, chaining it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from storage.errors import StoreUnavailable

T = TypeVar("T")

Body = Callable[[sqlite3.Connection], T]


def transaction(conn: sqlite3.Connection, body: Body[T]) -> T:
    """`body(conn)` in one write transaction (BEGIN IMMEDIATE: the write lock is taken
    first, so a check the body reads cannot be overtaken), committed, or rolled back when
    it raises. A body that found nothing to write may end the transaction itself with
    ROLLBACK."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn)
        if conn.in_transaction:
            conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


class Transaction(Protocol):
    """How `SqliteThread.tx` runs a body on the thread: `transaction`, or a wrapper of
    it that keeps the owner's in-memory state in step with the commit."""

    def __call__(self, conn: sqlite3.Connection, body: Body[T], /) -> T: ...


class SqliteThread:
    """One connection, opened by `opener` on this object's thread at the first `open`,
    `call` or `tx`, and closed there by `close`."""

    __slots__ = ("_opener", "_pool", "_transaction", "conn")

    def __init__(
        self,
        name: str,
        opener: Callable[[], sqlite3.Connection],
        *,
        transaction: Transaction = transaction,
    ) -> None:
        self.conn: sqlite3.Connection | None = None  # set on the thread only
        self._opener = opener
        self._transaction = transaction
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)

    async def open(self) -> None:
        await self.call(_nothing)

    async def call(self, fn: Body[T]) -> T:
        """`fn(conn)` on the thread."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._run, fn)
        except sqlite3.Error as e:
            raise StoreUnavailable(f"sqlite: {e}") from e

    async def tx(self, body: Body[T]) -> T:
        """`body(conn)` on the thread, in a write transaction (`transaction`)."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._run_tx, body)
        except sqlite3.Error as e:
            raise StoreUnavailable(f"sqlite: {e}") from e

    def submit(self, fn: Body[object]) -> None:
        """`fn(conn)` on the thread, not waited for (from any thread); fn handles its own
        errors. RuntimeError once closed."""
        self._pool.submit(self._run, fn)

    async def close(self) -> None:
        """Close the connection on the thread, after everything queued, and end it."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._close)
        except sqlite3.Error as e:
            raise StoreUnavailable(f"sqlite: {e}") from e
        finally:
            self._pool.shutdown(wait=True)

    # -- on the thread ----------------------------------------------------------------

    def _run(self, fn: Body[T]) -> T:
        conn = self.conn
        if conn is None:
            conn = self.conn = self._opener()
        return fn(conn)

    def _run_tx(self, body: Body[T]) -> T:
        conn = self.conn
        if conn is None:
            conn = self.conn = self._opener()
        return self._transaction(conn, body)

    def _close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


def _nothing(conn: sqlite3.Connection) -> None:
    pass
