"""Revocations kept in the authoritative store (storage/revocations.py): the node's copy
and its rules, the route store wrapped in front of it, and the SQLite log (the MySQL
log's tests are in tests/test_revocations_mysql.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from storage.embedded.revocations import SqliteRevocationLog
from storage.embedded.routes import MemoryRouteStore
from storage.embedded.schema import SCHEMA_VERSION as SQLITE_VERSION
from storage.errors import Revoked, StoreUnavailable
from storage.models import Route
from storage.revocations import (
    ALL_DEVICES,
    PRUNE_EVERY_S,
    SYNC_OVERLAP_MS,
    DurableRevocations,
    Revocation,
    RevocationCopy,
    covers,
)

NOW = 1_800_000_000


class FakeLog:
    """A RevocationLog in memory, with its calls recorded and failures on demand."""

    def __init__(self, *, shared: bool = True) -> None:
        self.shared = shared
        self.rows: dict[tuple[int, str], tuple[Revocation, int]] = {}
        self.now_ms = NOW * 1000
        self.reads: list[int | None] = []
        self.fail = False
        self.gate: asyncio.Event | None = None  # reads wait for it when set
        self.pruned: list[int] = []
        self.closed = False

    async def record(self, revocation: Revocation) -> None:
        if self.fail:
            raise StoreUnavailable("log down")
        self.rows[revocation.uid, revocation.device] = (revocation, self.now_ms)

    async def changed_since(self, since_ms: int | None) -> tuple[list[Revocation], int]:
        self.reads.append(since_ms)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise StoreUnavailable("log down")
        if since_ms is None:
            rows = [r for r, _ in self.rows.values() if r.expires_s >= self.now_ms // 1000]
        else:
            rows = [r for r, ms in self.rows.values() if ms >= since_ms]
        return rows, self.now_ms

    async def prune(self, now_s: int) -> int:
        self.pruned.append(now_s)
        return 0

    async def close(self) -> None:
        self.closed = True


def route(uid: int = 5, device: str = "a", conn_id: int = 1) -> Route:
    return Route(uid, device, "n1", conn_id, conn_id)


def guarded(log: FakeLog, clock: list[float] | None = None) -> DurableRevocations:
    t = clock if clock is not None else [float(NOW)]
    return DurableRevocations(MemoryRouteStore(), log, clock=lambda: t[0], monotonic=lambda: t[0])


# -- the rule and the copy ------------------------------------------------------------------


def test_a_revocation_covers_v1_tokens_and_those_minted_at_or_before_it() -> None:
    assert covers(100, None)  # v1: minting time unknown
    assert covers(100, 99) and covers(100, 100)
    assert not covers(100, 101)


def test_the_copy_answers_per_device_and_for_every_device() -> None:
    copy = RevocationCopy()
    copy.add(Revocation(5, "a", 100, 1000))
    copy.add(Revocation(5, ALL_DEVICES, 50, 1000))
    assert copy.covering(5, "a", 80, now_s=500) == 100
    assert copy.covering(5, "b", 80, now_s=500) is None  # b: only the uid-wide one, at 50
    assert copy.covering(5, "b", 40, now_s=500) == 50
    assert copy.covering(5, "b", None, now_s=500) == 50
    assert copy.covering(6, "a", None, now_s=500) is None
    # later revocations raise the times, older ones never lower them
    copy.add(Revocation(5, "a", 90, 900))
    assert copy.covering(5, "a", 95, now_s=950) == 100
    assert len(copy) == 2
    # expired: no longer covers, and pruned
    assert copy.covering(5, "a", None, now_s=1001) is None
    copy.prune(1001)
    assert len(copy) == 0


# -- the route store in front ---------------------------------------------------------------


async def test_a_revocation_is_written_to_the_log_first_and_outlives_the_route_store() -> None:
    log = FakeLog()
    routes = guarded(log)
    await routes.revoke(5, "a", NOW, 3600)
    assert log.rows[5, "a"][0] == Revocation(5, "a", NOW, NOW + 3600)
    with pytest.raises(Revoked):
        await routes.register(route(), iat=NOW - 1)
    # the route store forgot (a FLUSHDB, a restart): the node's copy still refuses
    routes.routes = MemoryRouteStore()
    with pytest.raises(Revoked):
        await routes.register(route(), iat=NOW)
    with pytest.raises(Revoked):
        await routes.register(route(), iat=None)
    assert await routes.register(route(), iat=NOW + 1) is None
    assert await routes.register(route(device="b"), iat=NOW - 1) is None  # another device
    # a node started afterwards loads it from the log
    fresh = guarded(log)
    with pytest.raises(Revoked):
        await fresh.register(route(), iat=NOW - 1)
    assert log.reads[-1] is None


async def test_a_revocation_the_log_refuses_is_not_made_at_all() -> None:
    log = FakeLog()
    routes = guarded(log)
    log.fail = True
    with pytest.raises(StoreUnavailable):
        await routes.revoke(5, None, NOW, 3600)
    log.fail = False
    assert len(routes.copy) == 0
    assert await routes.routes.register(route(), iat=NOW - 1) is None  # nor in the routes


async def test_logins_wait_for_one_load_and_are_unavailable_until_it_succeeds() -> None:
    log = FakeLog()
    log.rows[5, ALL_DEVICES] = (Revocation(5, ALL_DEVICES, NOW, NOW + 60), 0)
    routes = guarded(log)
    log.fail = True
    with pytest.raises(StoreUnavailable, match="revocations not loaded"):
        await routes.register(route(), iat=NOW + 5)
    assert not routes.loaded and await routes.get(5, "a") is None  # nothing installed
    log.fail = False
    log.gate = asyncio.Event()
    storm = [
        asyncio.create_task(routes.register(route(uid, "d", uid), iat=NOW - 1))
        for uid in range(1, 50)
    ]
    await asyncio.sleep(0)
    log.gate.set()
    results = await asyncio.gather(*storm, return_exceptions=True)
    assert log.reads == [None, None]  # the failed load, then one for the whole storm
    assert [type(r) for r in results] == [type(None)] * 4 + [Revoked] + [type(None)] * 44
    assert routes.loaded


async def test_each_route_check_reads_what_changed_since_the_last_read() -> None:
    log = FakeLog()
    routes = guarded(log)
    assert await routes.mark("n1")  # the first check of a node
    await routes.sync()
    assert log.reads == [None]
    # another node revokes; this node's next check reads it, with the overlap
    log.now_ms += 1000
    await log.record(Revocation(9, ALL_DEVICES, NOW, NOW + 60))
    await routes.mark("n1")
    await routes.sync_soon()
    assert log.reads == [None, NOW * 1000 - SYNC_OVERLAP_MS]
    with pytest.raises(Revoked):
        await routes.register(route(uid=9), iat=NOW)
    # a read that fails keeps the copy as it was, and is retried at the next check
    log.fail = True
    await routes.mark("n1")
    await asyncio.gather(routes.sync_soon(), return_exceptions=True)
    assert routes.sync_failures == 1
    with pytest.raises(Revoked):
        await routes.register(route(uid=9), iat=NOW)


async def test_a_log_only_this_process_writes_is_read_once() -> None:
    log = FakeLog(shared=False)
    routes = guarded(log)
    for _ in range(3):
        await routes.mark("n1")
        for _ in range(5):  # whatever the check started has run
            await asyncio.sleep(0)
    assert log.reads == [None] and routes.loaded


async def test_expired_revocations_are_pruned_from_the_copy_and_the_log() -> None:
    log = FakeLog()
    clock = [float(NOW)]
    routes = guarded(log, clock)
    await routes.revoke(5, None, NOW, 60)
    await routes.sync()
    assert log.pruned == []
    clock[0] += PRUNE_EVERY_S
    await routes.sync()
    assert log.pruned == [NOW + int(PRUNE_EVERY_S)] and len(routes.copy) == 0


async def test_close_closes_the_route_store_and_the_log() -> None:
    log = FakeLog()
    routes = guarded(log)
    log.gate = asyncio.Event()
    routes.sync_soon()  # a read in flight is cancelled
    await routes.close()
    assert log.closed


# -- the stores' logs -----------------------------------------------------------------------


async def test_the_sqlite_log_keeps_revocations_across_reopening(tmp_path: Path) -> None:
    path = str(tmp_path / "data" / "imgw.db")
    clock = [float(NOW)]
    log = SqliteRevocationLog(path, clock=lambda: clock[0])
    big = 2**64 - 1
    await log.record(Revocation(big, ALL_DEVICES, NOW, NOW + 60))
    await log.record(Revocation(5, "a", NOW, NOW + 60))
    await log.record(Revocation(5, "a", NOW - 10, NOW + 30))  # never lowers the times
    await log.close()
    log = SqliteRevocationLog(path, clock=lambda: clock[0])
    try:
        rows, now_ms = await log.changed_since(None)
        assert sorted(rows, key=lambda r: r.uid) == [
            Revocation(5, "a", NOW, NOW + 60),
            Revocation(big, ALL_DEVICES, NOW, NOW + 60),
        ]
        assert now_ms == NOW * 1000
        clock[0] += 5
        assert (await log.changed_since(now_ms + 1))[0] == []
        await log.record(Revocation(6, "b", NOW + 5, NOW + 65))
        assert (await log.changed_since(now_ms + 1))[0] == [Revocation(6, "b", NOW + 5, NOW + 65)]
        assert await log.prune(NOW + 61) == 2
        assert (await log.changed_since(None))[0] == [Revocation(6, "b", NOW + 5, NOW + 65)]
    finally:
        await log.close()


async def test_an_embedded_store_of_schema_4_gets_the_revocation_table(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    log = SqliteRevocationLog(path)
    await log.record(Revocation(5, "a", NOW, NOW + 60))
    await log.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("DROP TABLE im_revocation; PRAGMA user_version=4;")
    conn.close()
    log = SqliteRevocationLog(path)
    try:
        assert (await log.changed_since(None))[0] == []
    finally:
        await log.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION >= 5
    finally:
        conn.close()
