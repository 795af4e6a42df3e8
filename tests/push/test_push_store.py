"""Push registrations and mutes (storage/push.py) on every store: embedded (SQLite),
MySQL on one server and with shards over two, and the production store (MySQL + Redis),
which hands them to MySQL. Registering, updating, a token moving between devices and
uids, the per-uid limit, unregistering, a token reported invalid, batched reads, and
mutes; then the migrations that add the tables."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomysql
import pytest

from protocol.ops import MsgType
from storage.embedded import EmbeddedStore
from storage.embedded.schema import SCHEMA_VERSION as SQLITE_VERSION
from storage.models import NewMessage, PushDevice
from storage.mysql import MySQLSettings
from storage.mysql.schema import ddl
from storage.push import MUTE_FOREVER_MS
from tests.support.services import (
    downgrade_then_migrate,
    drop_mysql,
    fresh_mysql,
)
from tests.support.stores import T0, Clock, muted_uids, open_store

BIG = 2**64 - 1  # uids are u64: the stores keep the top bit
PUSH_TABLES = {"im_push_device", "im_conv_mute"}


@dataclass
class Store:
    store: Any  # EmbeddedStore | MySQLStore | MySQLRedisStore
    clock: Clock

    async def register(
        self, uid: int, device: str, token: str, provider: str = "fcm", **kw: Any
    ) -> list[tuple[int, str]]:
        removed: list[tuple[int, str]] = await self.store.push_register(
            uid, device, provider, token, preview=kw.pop("preview", False),
            locale=kw.pop("locale", ""), max_devices=kw.pop("max_devices", 10),
        )  # fmt: skip
        return removed

    async def devices(self, uid: int) -> list[str]:
        """The uid's registered devices, newest first."""
        found = await self.store.push_devices([uid])
        return [d.device for d in found.get(uid, [])]


@pytest.fixture(params=["embedded", "mysql", "sharded", "production"])
async def s(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    clock = Clock()
    async with open_store(request.param, clock, tmp_path) as store:
        yield Store(store, clock)


async def test_register_reads_back_and_registering_again_replaces(s: Store) -> None:
    assert await s.register(7, "phone", "tok-1", "apns", preview=True, locale="pt-BR") == []
    assert await s.store.push_devices([7]) == {
        7: [PushDevice(7, "phone", "apns", "tok-1", True, "pt-BR", T0)]
    }
    s.clock.ms += 5
    assert await s.register(7, "phone", "tok-2", "fcm") == []  # a new token, new opts
    assert await s.store.push_devices([7]) == {
        7: [PushDevice(7, "phone", "fcm", "tok-2", False, "", T0 + 5)]
    }
    assert await s.store.push_devices([8]) == {}
    assert await s.store.push_devices([]) == {}


async def test_a_token_moves_to_the_device_registering_it(s: Store) -> None:
    await s.register(1, "phone", "shared")
    await s.register(1, "tablet", "other")
    # another user logs in on the phone: the token is theirs now
    assert await s.register(2, "app", "shared") == [(1, "phone")]
    assert await s.devices(1) == ["tablet"]
    assert await s.devices(2) == ["app"]
    # the same uid on a new device id (the app reinstalled): moved again
    assert await s.register(2, "app2", "shared") == [(2, "app")]
    assert await s.devices(2) == ["app2"]
    # the same token at another provider is another address
    assert await s.register(3, "web", "shared", "webpush") == []
    assert await s.devices(2) == ["app2"]
    assert await s.store.push_delete("fcm", "shared")
    assert await s.devices(2) == [] and await s.devices(3) == ["web"]
    assert not await s.store.push_delete("fcm", "shared")


async def test_the_eleventh_device_replaces_the_least_recently_registered(s: Store) -> None:
    # One clock reading for all: the order of registration decides, not the clock.
    for i in range(10):
        await s.register(5, f"d{i}", f"t{i}")
    assert await s.devices(5) == [f"d{i}" for i in reversed(range(10))]
    await s.register(5, "d0", "t0")  # registering again makes d0 the newest
    assert await s.register(5, "d10", "t10") == [(5, "d1")]
    assert len(await s.devices(5)) == 10
    assert (await s.devices(5))[:2] == ["d10", "d0"]
    assert "d1" not in await s.devices(5)
    # moving a token of the uid's own makes room by itself: nothing else goes
    assert await s.register(5, "d11", "t2") == [(5, "d2")]
    assert len(await s.devices(5)) == 10
    # a smaller limit removes the oldest ones at once
    removed = await s.register(5, "d12", "t12", max_devices=3)
    assert sorted(removed) == sorted(
        (5, d) for d in ("d3", "d4", "d5", "d6", "d7", "d8", "d9", "d0")
    )
    assert await s.devices(5) == ["d12", "d11", "d10"]


async def test_a_clock_that_steps_back_keeps_the_order(s: Store) -> None:
    await s.register(5, "a", "ta")
    s.clock.ms -= 60_000
    await s.register(5, "b", "tb")
    assert await s.devices(5) == ["b", "a"]
    assert await s.register(5, "c", "tc", max_devices=2) == [(5, "a")]


async def test_unregister(s: Store) -> None:
    await s.register(9, "phone", "t")
    await s.register(9, "web", "w", "webpush")
    assert await s.store.push_unregister(9, "phone")
    assert not await s.store.push_unregister(9, "phone")
    assert not await s.store.push_unregister(10, "web")
    assert await s.devices(9) == ["web"]
    await s.register(10, "phone", "t")  # the token is free again
    assert await s.devices(10) == ["phone"]


async def test_long_tokens_big_uids_and_batched_reads(
    s: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    long = "é" * 1023 + "xy"  # 2,048 UTF-8 bytes
    twin = "é" * 1023 + "xz"  # differs in its last byte only
    await s.register(BIG, "d", long, "webpush", locale="zh-Hant-TW")
    await s.register(BIG - 1, "d", twin, "webpush")
    got = await s.store.push_devices([BIG, BIG - 1])
    assert got[BIG] == [PushDevice(BIG, "d", "webpush", long, False, "zh-Hant-TW", T0)]
    assert got[BIG - 1][0].token == twin
    assert await s.register(1, "d", long, "webpush") == [(BIG, "d")]
    monkeypatch.setattr("storage.push.UIDS_PER_QUERY", 2)
    for uid in range(100, 105):
        await s.register(uid, "d", f"t{uid}")
    uids = [*range(100, 106), 100, 1]
    got = await s.store.push_devices(uids)
    assert sorted(got) == [1, *range(100, 105)]
    assert all(len(v) == 1 for v in got.values())


async def test_mutes(s: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    now = T0
    await s.store.set_mute(1, 5, now + 1000)
    await s.store.set_mute(1, 6, 2**64 - 1)  # "for good": kept as the largest time
    await s.store.set_mute(1, BIG, now + 1)
    await s.store.set_mute(2, 7, now + 1000)
    assert await muted_uids(s.store, 1, [5, 6, 7, BIG, 8], now) == {5, 6, BIG}
    assert await muted_uids(s.store, 1, [5, 6, BIG], now + 1) == {5, 6}
    assert await muted_uids(s.store, 1, [5, 6], now + 1000) == {6}
    assert await muted_uids(s.store, 1, [6], MUTE_FOREVER_MS - 1) == {6}
    assert await muted_uids(s.store, 2, [5, 6, 7], now) == {7}
    assert await muted_uids(s.store, 1, [], now) == set()
    await s.store.set_mute(1, 5, now + 5000)  # a later end replaces the earlier one
    assert await muted_uids(s.store, 1, [5], now + 2000) == {5}
    await s.store.set_mute(1, 5, 0)  # unmute
    await s.store.set_mute(1, 6, now - 1)  # a time past unmutes too
    await s.store.set_mute(1, 8, 0)  # nothing to unmute
    assert await muted_uids(s.store, 1, [5, 6, 8], now) == set()
    monkeypatch.setattr("storage.push.PAIRS_PER_QUERY", 2)
    for uid in range(100, 105):
        await s.store.set_mute(3, uid, now + 10)
    assert await muted_uids(s.store, 3, [*range(99, 106), 101], now) == set(range(100, 105))
    # one call asks about several conversations at once
    await s.store.set_mute(2, 5, now + 10)
    asked = [(1, 6), (2, 6), (2, 7), (3, 7), (3, 101), (2, 5), (1, 5), (2**63 - 1, 6)]
    assert await s.store.muted(asked, now) == {(2, 7), (3, 101), (2, 5)}


async def test_badges(s: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A push event's badge: the messages from others that count as unread above the
    uid's read position, in the conversations it is still a member of, at most the latest
    BADGE_SCAN of each, over its BADGE_CONVS most recently active conversations."""
    a, b, c = 1, 2, BIG
    ab = await s.store.open_p2p(a, b)
    ac = await s.store.open_p2p(a, c)
    group, _ = await s.store.create_group(b, "g", [b, a, c])  # its system message: not unread

    async def send(conv: int, sender: int, n: int) -> int:
        seq = 0
        for _ in range(n):
            s.clock.ms += 1
            (res,) = await s.store.append(
                [NewMessage(conv, sender, f"m{s.clock.ms}", MsgType.TEXT, b"x")]
            )
            assert res.message is not None
            seq = res.message.seq
        return seq

    await send(ab, b, 3)
    last = await send(ab, a, 2)  # a's own: not unread for a
    await send(ac, c, 4)
    await send(group, c, 1)
    assert await s.store.unread_badges([a, b, c, 99]) == {a: 8, b: 3}
    await s.store.set_read(ab, a, last)
    await s.store.set_read(ab, b, last)
    await send(ac, a, 2)
    assert await s.store.unread_badges([a, b, c]) == {a: 5, b: 1, c: 2}
    s.clock.ms += 1
    await s.store.change_members(group, a, [], [a])  # a left: the group counts no more
    assert await s.store.unread_badges([a, b]) == {a: 4, b: 1}
    monkeypatch.setattr("storage.badges.BADGE_SCAN", 5)  # ac: a's 2 are the latest of 6
    assert await s.store.unread_badges([a]) == {a: 3}
    await send(ab, b, 1)  # ab the most recently active
    monkeypatch.setattr("storage.badges.BADGE_CONVS", 1)
    assert await s.store.unread_badges([a]) == {a: 1}
    assert await s.store.unread_badges([]) == {}


async def test_an_embedded_store_of_schema_6_gets_the_push_tables(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    store = EmbeddedStore(path)
    await store.start()
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("DROP TABLE im_push_device; DROP TABLE im_conv_mute; PRAGMA user_version=6;")
    conn.close()
    store = EmbeddedStore(path)
    await store.start()
    try:
        await store.push_register(1, "d", "fcm", "t", preview=False, locale="", max_devices=10)
        await store.set_mute(1, 1, 2**62)
        assert list(await store.push_devices([1])) == [1]
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION >= 7
    finally:
        conn.close()


def test_the_push_tables_live_in_the_metadata_database_only() -> None:
    def tables(statements: list[str]) -> set[str]:
        return {t for t in PUSH_TABLES for s in statements if f"EXISTS {t} " in s}

    assert tables(ddl(4, meta=True)) == PUSH_TABLES
    assert tables(ddl([0, 1], meta=False)) == set()


async def test_migrate_adds_the_push_tables_to_schema_10() -> None:
    url = await fresh_mysql()
    try:
        assert await downgrade_then_migrate(url, 10, "DROP TABLE im_push_device, im_conv_mute")
        s = MySQLSettings.from_url(url)
        conn = await aiomysql.connect(host=s.host, port=s.port, user=s.user,
                                      password=s.password, db=s.database)  # fmt: skip
        try:
            async with conn.cursor() as cur:
                await cur.execute("SHOW TABLES LIKE 'im\\_push\\_device'")
                assert await cur.fetchall()
                await cur.execute("SHOW TABLES LIKE 'im\\_conv\\_mute'")
                assert await cur.fetchall()
        finally:
            conn.close()
    finally:
        await drop_mysql(url)
