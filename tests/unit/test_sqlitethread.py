"""SqliteThread: one connection, opened, used and closed on its own thread; write
transactions committed or rolled back whole; SQLite's errors as StoreUnavailable."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from storage.embedded.schema import connect
from storage.errors import StoreUnavailable
from storage.sqlitethread import SqliteThread, transaction

T = TypeVar("T")


def _db(tmp_path: Path) -> tuple[str, Callable[[], sqlite3.Connection], list[str]]:
    path = str(tmp_path / "t.db")
    opened_on: list[str] = []

    def opener() -> sqlite3.Connection:
        opened_on.append(threading.current_thread().name)
        conn = connect(path)
        conn.execute("CREATE TABLE IF NOT EXISTS t (v INTEGER)")
        return conn

    return path, opener, opened_on


def _values(path: str) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [v for (v,) in conn.execute("SELECT v FROM t ORDER BY v")]
    finally:
        conn.close()


async def test_the_connection_opens_once_at_the_first_call_on_its_own_thread(
    tmp_path: Path,
) -> None:
    _, opener, opened_on = _db(tmp_path)
    db = SqliteThread("imgw-test-sqlite", opener)
    assert db.conn is None
    name = await db.call(lambda conn: threading.current_thread().name)
    await db.open()
    await db.call(lambda conn: conn.execute("SELECT 1").fetchone())
    assert opened_on == [name] and name.startswith("imgw-test-sqlite")
    assert name != threading.current_thread().name
    await db.close()
    assert db.conn is None
    with pytest.raises(RuntimeError):  # closed for good
        await db.call(lambda conn: None)


async def test_tx_commits_or_rolls_back_whole(tmp_path: Path) -> None:
    path, opener, _ = _db(tmp_path)
    db = SqliteThread("imgw-test-sqlite", opener)
    await db.open()

    def insert(v: int) -> Callable[[sqlite3.Connection], int]:
        def body(conn: sqlite3.Connection) -> int:
            assert conn.in_transaction
            conn.execute("INSERT INTO t VALUES (?)", (v,))
            return v

        return body

    def insert_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (2)")
        raise ValueError("no")

    def insert_then_give_up(conn: sqlite3.Connection) -> bool:
        conn.execute("INSERT INTO t VALUES (3)")
        conn.execute("ROLLBACK")  # a check failed: nothing to write
        return False

    assert await db.tx(insert(1)) == 1
    with pytest.raises(ValueError):
        await db.tx(insert_then_fail)
    assert await db.tx(insert_then_give_up) is False
    assert await db.tx(insert(4)) == 4
    assert _values(path) == [1, 4]
    assert await db.call(lambda conn: conn.in_transaction) is False
    await db.close()


async def test_sqlite_errors_are_store_unavailable(tmp_path: Path) -> None:
    _, opener, _ = _db(tmp_path)
    db = SqliteThread("imgw-test-sqlite", opener)
    with pytest.raises(StoreUnavailable, match=r"^sqlite: ") as raised:
        await db.call(lambda conn: conn.execute("SELECT nope FROM t"))
    assert isinstance(raised.value.__cause__, sqlite3.Error)
    with pytest.raises(StoreUnavailable):
        await db.tx(lambda conn: conn.execute("INSERT INTO missing VALUES (1)"))
    assert await db.call(lambda conn: conn.in_transaction) is False  # rolled back
    await db.close()

    def broken() -> sqlite3.Connection:
        return connect(str(tmp_path / "no" / "such" / "dir" / "x.db"))

    with pytest.raises(StoreUnavailable):
        await SqliteThread("imgw-test-sqlite", broken).open()


async def test_tx_runs_through_the_owners_transaction(tmp_path: Path) -> None:
    """An owner may wrap `transaction` to keep its memory in step with the commit."""
    _, opener, _ = _db(tmp_path)
    seen: list[str] = []

    def tracked(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
        try:
            result = transaction(conn, body)
        except BaseException:
            seen.append("rolled back")
            raise
        seen.append("committed")
        return result

    db = SqliteThread("imgw-test-sqlite", opener, transaction=tracked)
    await db.tx(lambda conn: conn.execute("INSERT INTO t VALUES (1)"))
    with pytest.raises(StoreUnavailable):
        await db.tx(lambda conn: conn.execute("INSERT INTO missing VALUES (1)"))
    await db.call(lambda conn: None)  # not a transaction
    assert seen == ["committed", "rolled back"]
    await db.close()


async def test_submit_runs_without_waiting(tmp_path: Path) -> None:
    _, opener, _ = _db(tmp_path)
    db = SqliteThread("imgw-test-sqlite", opener)
    ran = threading.Event()
    await db.open()
    db.submit(lambda conn: ran.set())
    await db.call(lambda conn: None)  # queued behind it
    assert ran.is_set()
    await db.close()
    with pytest.raises(RuntimeError):
        db.submit(lambda conn: None)
