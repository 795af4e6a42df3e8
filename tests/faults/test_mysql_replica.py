"""Read replicas (`?replica=`) on real MariaDB replication (scripts/mariadb-replica: a
primary with binary logs and a replica of it, GTID, semi-synchronous): a PULL/HISTORY
page comes from the replica only once it has applied every commit of the conversation
the primary had; while it lags (its SQL thread stopped) the primary answers; and a
replica killed under traffic, then restarted, costs no acked message and no page, and
serves pages again once it has caught up."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiomysql
import pytest

from storage.models import AppendStatus, NewMessage, StoredMessage
from storage.mysql import MySQLSettings, MySQLStore, migrate
from tests.support.services import (
    REPLICA_PORT,
    REPLICA_PRIMARY_PORT,
    REPLICA_SCRIPT,
    mysql_rows,
    replicated_mysql,
)

pytestmark = pytest.mark.slow


async def applied(name: str, conv: int, timeout_s: float = 20.0) -> None:
    """Wait until the replica has applied the primary's max seq of `conv`."""
    query = f"SELECT max_seq FROM im_conv_seq WHERE conv_id={conv}"
    want = await mysql_rows(REPLICA_PRIMARY_PORT, name, query)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if await mysql_rows(REPLICA_PORT, name, query) == want:
                return
        except aiomysql.Error:
            pass  # restarting, or not yet holding the database
        assert time.monotonic() < deadline, f"the replica did not apply {want} in {timeout_s} s"
        await asyncio.sleep(0.1)


def replica_pid() -> int:
    """The replica's mariadbd (scripts/mariadb-second's pid file)."""
    return int(Path(f"/tmp/imgw-mariadb-{REPLICA_PORT}/mariadbd.pid").read_text())


async def read_all(store: MySQLStore, conv: int) -> list[StoredMessage]:
    got, more = await store.read_after(conv, 0, 1000, min_seq=0, max_seq=None)
    assert not more
    return got


@pytest.fixture
async def replicated() -> AsyncIterator[tuple[MySQLStore, str]]:
    """A store on a fresh database of the primary, reading pages from the replica."""
    replicated_mysql()
    name = f"imgw_t_{secrets.token_hex(6)}"
    primary = f"mysql://root@127.0.0.1:{REPLICA_PRIMARY_PORT}/{name}?shards=2&timeout=3"
    await migrate(MySQLSettings.from_url(primary))
    store = MySQLStore(
        MySQLSettings.from_url(f"{primary}&replica=mysql://root@127.0.0.1:{REPLICA_PORT}/{name}")
    )
    await store.start()
    try:
        yield store, name
    finally:
        await store.close()
        replicated_mysql()  # running again for the next test, whatever this one did
        await mysql_rows(REPLICA_PRIMARY_PORT, None, f"DROP DATABASE IF EXISTS {name}")


async def test_pages_come_from_the_replica_once_it_applied_them(
    replicated: tuple[MySQLStore, str],
) -> None:
    store, name = replicated
    conv = await store.open_p2p(1, 2)
    await store.append([NewMessage(conv, 1, f"c{i}", 1, f"m{i}".encode()) for i in range(5)])
    await applied(name, conv)
    got = await read_all(store, conv)
    assert [m.content for m in got] == [f"m{i}".encode() for i in range(5)]
    got, _ = await store.read_before(conv, 0, 2, min_seq=0, max_seq=None)
    assert [m.seq for m in got] == [4, 5]
    assert (store.replica_reads, store.replica_lagging) == (2, 0)

    # The replica stops applying (its SQL thread stopped; it still receives): it lags,
    # and the primary answers with what the replica does not have yet.
    await mysql_rows(REPLICA_PORT, None, "STOP SLAVE SQL_THREAD")
    try:
        await store.append([NewMessage(conv, 2, "late", 1, b"late")])
        got = await read_all(store, conv)
        assert [m.seq for m in got] == [1, 2, 3, 4, 5, 6] and got[-1].content == b"late"
        assert (store.replica_reads, store.replica_lagging) == (2, 1)
    finally:
        await mysql_rows(REPLICA_PORT, None, "START SLAVE SQL_THREAD")
    await applied(name, conv)
    assert [m.seq for m in await read_all(store, conv)] == [1, 2, 3, 4, 5, 6]
    assert (store.replica_reads, store.replica_lagging, store.replica_failures) == (3, 1, 0)


async def test_a_replica_killed_under_traffic_costs_no_message_and_no_page(
    replicated: tuple[MySQLStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, name = replicated
    monkeypatch.setattr("storage.mysql.store.REPLICA_PAUSE_S", 0.5)
    conv = await store.open_p2p(1, 2)
    acked: list[int] = []
    pages: list[int] = []  # the length of every page read while the replica died
    stop = asyncio.Event()

    async def send() -> None:
        k = 0
        while not stop.is_set():
            (r,) = await store.append([NewMessage(conv, 1 + k % 2, f"t{k}", 1, b"x")])
            assert r.status is AppendStatus.STORED and r.message is not None
            acked.append(r.message.seq)
            k += 1
            await asyncio.sleep(0.02)

    async def read() -> None:
        while not stop.is_set():
            got = await read_all(store, conv)
            assert [m.seq for m in got] == list(range(1, len(got) + 1))
            pages.append(len(got))
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(send()), asyncio.create_task(read())]
    try:
        await asyncio.sleep(1.0)
        os.kill(replica_pid(), signal.SIGKILL)
        await asyncio.sleep(2.0)  # traffic with no replica: the primary answers
        failures = store.replica_failures
        assert failures >= 1
        restarted = await asyncio.to_thread(
            subprocess.run, [str(REPLICA_SCRIPT), "start"], capture_output=True, timeout=120
        )
        assert restarted.returncode == 0, restarted.stderr
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    await applied(name, conv)
    reads_before = store.replica_reads
    got = await read_all(store, conv)
    assert store.replica_reads == reads_before + 1  # caught up: the replica serves again
    assert [m.seq for m in got] == sorted(acked) == list(range(1, len(acked) + 1))
    assert len(acked) > 50 and len(pages) > 20  # traffic went on throughout
