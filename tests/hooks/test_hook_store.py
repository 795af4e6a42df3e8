"""Hook rows (storage/hooks.py) on every store: embedded (SQLite), MySQL on one server and
with shards over two, and the production store (MySQL + Redis), which hands them to
MySQL. A row per message stored by a send batch, a group's system messages and a recall,
in the same transaction (none for a resend or a refused send, none from a commit rolled
back, none with hooks off); `hooks_of` order and limit, `hooks_done`, `hooks_adopt`,
`hooks_backlog`; on two servers, each row beside its message and the reads merged; then
the migrations that add the table."""

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
from storage.models import AppendStatus, HookRow, NewMessage, RecallStatus
from storage.mysql import MySQLSettings, MySQLStore
from storage.mysql.schema import ddl
from tests.support.services import (
    downgrade_then_migrate,
    drop_mysql,
    fresh_mysql,
)
from tests.support.stores import T0, Clock, open_store

STORES = ("embedded", "mysql", "sharded", "production")


@dataclass
class Store:
    store: Any  # EmbeddedStore | MySQLStore | MySQLRedisStore
    clock: Clock
    kind: str

    @property
    def mysql(self) -> MySQLStore:
        return self.store.mysql if self.kind == "production" else self.store

    async def send(self, conv_id: int, sender: int, cmid: str) -> tuple[AppendStatus, int]:
        [r] = await self.store.append([NewMessage(conv_id, sender, cmid, MsgType.TEXT, b"x")])
        return r.status, r.message.seq if r.message is not None else 0

    async def hooks(self, node: str = "n1") -> list[tuple[int, int]]:
        return [(r.conv_id, r.seq) for r in await self.store.hooks_of(node, 1000)]

    async def on_servers(self, stmt: str) -> None:
        """Run `stmt` on every MySQL server of the store."""

        async def q(cur: Any) -> None:
            await cur.execute(stmt)

        for server in self.mysql._servers:
            await server.db.run(q, tx=False)


@pytest.fixture(params=STORES)
async def s(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    clock = Clock()
    async with open_store(request.param, clock, tmp_path) as store:
        yield Store(store, clock, request.param)


async def test_a_send_batch_writes_a_row_per_stored_message(s: Store) -> None:
    s.store.set_hook_node("n1")
    p2p = await s.store.open_p2p(1, 2)
    other = await s.store.open_p2p(1, 3)
    batch = [
        NewMessage(p2p, 1, "a", MsgType.TEXT, b"1"),
        NewMessage(other, 3, "b", MsgType.TEXT, b"2"),
        NewMessage(p2p, 2, "c", MsgType.TEXT, b"3"),
    ]
    assert [r.status for r in await s.store.append(batch)] == [AppendStatus.STORED] * 3
    assert await s.store.hooks_of("n1", 10) == [
        HookRow(p2p, 1, "n1", T0), HookRow(p2p, 2, "n1", T0), HookRow(other, 1, "n1", T0),
    ] if p2p < other else [
        HookRow(other, 1, "n1", T0), HookRow(p2p, 1, "n1", T0), HookRow(p2p, 2, "n1", T0),
    ]  # fmt: skip
    assert await s.store.hooks_of("n2", 10) == []


async def test_system_messages_and_recalls_write_rows(s: Store) -> None:
    s.store.set_hook_node("n1")
    group, created = await s.store.create_group(1, "g", [2, 3])
    change = await s.store.change_members(group, 1, [4], [3])  # "added", "removed"
    titled = await s.store.set_title(group, 1, "g2")
    assert titled is not None
    _, sent = await s.send(group, 2, "m")
    recalled = await s.store.recall(group, sent, 2, window_ms=60_000, min_seq=0)
    assert recalled.status is RecallStatus.RECALLED
    seqs = [created.seq, *(m.seq for m in change.messages), titled.seq, sent, recalled.recall_seq]
    assert seqs == [1, 2, 3, 4, 5, 6]
    assert await s.hooks() == [(group, q) for q in seqs]
    # refused: nothing stored, no row
    assert await s.store.set_title(group, 2, "not the owner's") is None
    again = await s.store.recall(group, sent, 2, window_ms=60_000, min_seq=0)
    assert again.status is RecallStatus.ALREADY
    assert len(await s.hooks()) == 6


async def test_hooks_off_write_no_row(s: Store) -> None:
    group, _ = await s.store.create_group(1, "g", [2])
    await s.store.change_members(group, 1, [3], [])
    await s.store.set_title(group, 1, "t")
    _, seq = await s.send(group, 2, "m")
    await s.store.recall(group, seq, 2, window_ms=60_000, min_seq=0)
    s.store.set_hook_node("n1")
    s.store.set_hook_node("")  # turned off again
    await s.send(group, 2, "m2")
    await s.store.create_group(1, "g2", [2])
    assert await s.hooks() == []
    assert await s.store.hooks_backlog() == (0, 0)


async def test_a_resend_or_a_refused_send_writes_no_row(s: Store) -> None:
    s.store.set_hook_node("n1")
    p2p = await s.store.open_p2p(1, 2)
    assert await s.send(p2p, 1, "a") == (AppendStatus.STORED, 1)
    assert await s.send(p2p, 1, "a") == (AppendStatus.DUPLICATE, 1)  # stored nothing
    assert (await s.send(p2p, 9, "b"))[0] is AppendStatus.NOT_MEMBER
    assert await s.hooks() == [(p2p, 1)]


async def test_a_commit_rolled_back_writes_no_row(s: Store) -> None:
    """A commit that fails after its hook rows were written leaves none of them."""
    s.store.set_hook_node("n1")
    p2p = await s.store.open_p2p(1, 2)
    assert await s.send(p2p, 1, "a") == (AppendStatus.STORED, 1)
    if s.kind == "embedded":  # the max_seq upsert follows the hook rows in _write
        conn = sqlite3.connect(str(s.store._path), isolation_level=None)
        conn.executescript(
            "CREATE TRIGGER fail_u BEFORE UPDATE ON im_conv_seq BEGIN "
            "SELECT RAISE(ABORT, 'injected'); END;"
        )
        conn.close()
    else:  # the idempotency records follow the hook rows in the group commit
        await s.on_servers(
            "CREATE TRIGGER fail_i BEFORE INSERT ON im_send_dedup FOR EACH ROW "
            "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'injected'"
        )
    with pytest.raises(Exception, match="injected"):
        await s.store.append([NewMessage(p2p, 1, "b", MsgType.TEXT, b"x")])
    assert await s.hooks() == [(p2p, 1)]
    msgs, _ = await s.store.read_after(p2p, 0, 10, min_seq=0, max_seq=None)
    assert [m.seq for m in msgs] == [1]


async def test_hooks_of_is_oldest_first_per_node_and_limited(s: Store) -> None:
    a = await s.store.open_p2p(1, 2)
    b = await s.store.open_p2p(1, 3)
    hi, lo = max(a, b), min(a, b)
    s.store.set_hook_node("n1")
    await s.send(hi, 1, "1")  # T0
    s.clock.ms += 5
    s.store.set_hook_node("n2")
    await s.send(lo, 1, "2")  # T0 + 5, another node's
    s.clock.ms -= 3  # the clock stepped back: created_ms orders, not the seq
    s.store.set_hook_node("n1")
    await s.send(lo, 1, "3")  # T0 + 2
    await s.send(hi, 1, "4")  # T0 + 2
    rows = await s.store.hooks_of("n1", 10)
    assert rows == [
        HookRow(hi, 1, "n1", T0), HookRow(lo, 2, "n1", T0 + 2), HookRow(hi, 2, "n1", T0 + 2),
    ]  # fmt: skip
    assert await s.store.hooks_of("n1", 2) == rows[:2]
    assert await s.store.hooks_of("n1", 0) == []
    assert await s.store.hooks_of("n2", 10) == [HookRow(lo, 1, "n2", T0 + 5)]
    assert await s.store.hooks_of("n3", 10) == []


async def test_hooks_done_deletes_the_keys_in_batches(
    s: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("storage.embedded.store.DONE_KEYS_PER_QUERY", 2)
    monkeypatch.setattr("storage.mysql.store.DONE_KEYS_PER_QUERY", 2)
    s.store.set_hook_node("n1")
    p2p = await s.store.open_p2p(1, 2)
    for i in range(6):
        await s.send(p2p, 1, f"m{i}")
    await s.store.hooks_done([])
    await s.store.hooks_done([(p2p, 1), (p2p, 3), (p2p, 3), (p2p, 4), (p2p, 99), (2**64 - 1, 1)])
    assert await s.hooks() == [(p2p, 2), (p2p, 5), (p2p, 6)]
    await s.store.hooks_done([(p2p, 2), (p2p, 5), (p2p, 6)])
    assert await s.hooks() == []
    assert await s.store.hooks_backlog() == (0, 0)


async def test_hooks_adopt_retags_a_dead_nodes_rows(
    s: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("storage.mysql.store.ADOPT_ROWS_PER_QUERY", 2)
    a = await s.store.open_p2p(1, 2)
    b = await s.store.open_p2p(1, 3)
    s.store.set_hook_node("dead")
    for i in range(3):
        await s.send(a, 1, f"a{i}")
        await s.send(b, 1, f"b{i}")
    s.store.set_hook_node("alive")
    await s.send(a, 1, "mine")
    assert await s.store.hooks_adopt("dead", "alive") == 6
    assert await s.store.hooks_of("dead", 10) == []
    rows = await s.store.hooks_of("alive", 10)
    assert len(rows) == 7 and {r.node for r in rows} == {"alive"}
    assert sorted((r.conv_id, r.seq) for r in rows) == sorted(
        [(a, 1), (a, 2), (a, 3), (a, 4), (b, 1), (b, 2), (b, 3)]
    )
    assert await s.store.hooks_adopt("dead", "alive") == 0
    assert await s.store.hooks_adopt("alive", "alive") == 0
    assert len(await s.store.hooks_of("alive", 10)) == 7


async def test_hooks_backlog_counts_every_node_and_finds_the_oldest(
    s: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await s.store.hooks_backlog() == (0, 0)
    a = await s.store.open_p2p(1, 2)
    b = await s.store.open_p2p(1, 3)
    s.clock.ms = T0 + 100
    s.store.set_hook_node("n1")
    await s.send(a, 1, "1")
    await s.send(b, 1, "2")
    s.clock.ms = T0 + 50
    s.store.set_hook_node("n2")
    await s.send(b, 1, "3")
    s.clock.ms = T0 + 70
    s.store.set_hook_node("n0")
    await s.send(a, 1, "4")
    assert await s.store.hooks_backlog() == (4, T0 + 50)
    monkeypatch.setattr("storage.embedded.store.HOOK_BACKLOG_CAP", 3)
    monkeypatch.setattr("storage.mysql.store.HOOK_BACKLOG_CAP", 3)
    assert await s.store.hooks_backlog() == (3, T0 + 50)  # counted up to the cap
    await s.store.hooks_done([(b, 2)])
    assert await s.store.hooks_backlog() == (3, T0 + 70)


@pytest.mark.parametrize("kind", ["sharded"])
async def test_on_two_servers_each_row_is_beside_its_message(kind: str) -> None:
    url = await fresh_mysql(shards=2, sharded=True)
    clock = Clock()
    store = MySQLStore(MySQLSettings.from_url(url), clock=clock)
    await store.start()
    try:
        s = Store(store, clock, kind)
        s.store.set_hook_node("n1")
        convs = [await store.open_p2p(1, 2 + i) for i in range(4)]
        assert len({id(store._at(c)) for c in convs}) == 2  # both servers hold some
        group, _ = await store.create_group(1, "g", [2])
        batch = []
        for i, c in enumerate(convs):
            clock.ms = T0 + 10 * (len(convs) - i)  # the later servers' rows are older
            batch.append(NewMessage(c, 1, f"m{i}", MsgType.TEXT, b"x"))
            [r] = await store.append(batch[-1:])
            assert r.status is AppendStatus.STORED
        clock.ms = T0 + 1
        # one batch spanning both servers: one transaction on each
        spread = [NewMessage(c, 1, f"s{i}", MsgType.TEXT, b"y") for i, c in enumerate(convs)]
        assert {r.status for r in await store.append(spread)} == {AppendStatus.STORED}
        for server in store._servers:

            async def q(cur: Any) -> list[tuple[int, int]]:
                await cur.execute("SELECT conv_id, seq FROM im_hook ORDER BY conv_id, seq")
                return [(int(c), int(seq)) for c, seq in await cur.fetchall()]

            here = await server.db.run(q, tx=False)
            mine = [c for c in [*convs, group] if store._at(c) is server]
            assert here and {c for c, _ in here} == set(mine)
        rows = await store.hooks_of("n1", 100)
        want = sorted(
            [(T0, group, 1)]
            + [(T0 + 10 * (len(convs) - i), c, 1) for i, c in enumerate(convs)]
            + [(T0 + 1, c, 2) for c in convs]
        )
        assert [(r.created_ms, r.conv_id, r.seq) for r in rows] == want
        assert await store.hooks_of("n1", 3) == rows[:3]
        assert await store.hooks_backlog() == (9, T0)
        assert await store.hooks_adopt("n1", "n2") == 9
        await store.hooks_done([(r.conv_id, r.seq) for r in rows[:5]])
        assert await store.hooks_of("n2", 100) == [
            HookRow(r.conv_id, r.seq, "n2", r.created_ms) for r in rows[5:]
        ]
    finally:
        await store.close()
        await drop_mysql(url)


# -- the migrations ---------------------------------------------------------------------------


async def test_an_embedded_store_of_schema_7_gets_the_hook_table(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    store = EmbeddedStore(path)
    await store.start()
    p2p = await store.open_p2p(1, 2)
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("DROP TABLE im_hook; PRAGMA user_version=7;")
    conn.close()
    store = EmbeddedStore(path)
    await store.start()
    try:
        store.set_hook_node("n1")
        await store.append([NewMessage(p2p, 1, "a", MsgType.TEXT, b"x")])
        assert [(r.conv_id, r.seq) for r in await store.hooks_of("n1", 10)] == [(p2p, 1)]
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SQLITE_VERSION >= 8
    finally:
        conn.close()


def test_the_hook_table_is_on_every_server() -> None:
    def has(statements: list[str]) -> bool:
        return any("EXISTS im_hook " in s for s in statements)

    assert has(ddl(4, meta=True)) and has(ddl([0, 1], meta=False))


async def test_migrate_adds_the_hook_table_to_schema_11() -> None:
    url = await fresh_mysql()
    try:
        assert await downgrade_then_migrate(url, 11, "DROP TABLE im_hook")
        s = MySQLSettings.from_url(url)
        conn = await aiomysql.connect(host=s.host, port=s.port, user=s.user,
                                      password=s.password, db=s.database)  # fmt: skip
        try:
            async with conn.cursor() as cur:
                await cur.execute("SHOW INDEX FROM im_hook")
                keys = {(str(r[2]), int(r[3]), str(r[4])) for r in await cur.fetchall()}
                assert keys == {
                    ("PRIMARY", 1, "conv_id"), ("PRIMARY", 2, "seq"),
                    ("k_node", 1, "node"), ("k_node", 2, "created_ms"),
                }  # fmt: skip
        finally:
            conn.close()
    finally:
        await drop_mysql(url)
