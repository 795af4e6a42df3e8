"""Message shards over two MySQL servers (a shard map, storage/mysql/shardmap.py): where
migrate puts each table, what `imgw db status` prints, and that a send batch spanning
both servers is answered per server: each message after its own server's commit, and a
server that is down fails its own messages only."""

from __future__ import annotations

import asyncio
import contextlib
import io
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiomysql
import pytest

from gateway.cli import main
from gateway.server import Server
from protocol.frames import (
    ConvOk,
    Error,
    Opaque,
    OpenP2P,
    Send,
    SendAck,
    Sync,
    SyncPartial,
    SyncResult,
)
from protocol.ops import ErrorCode
from storage.errors import StoreUnavailable
from storage.models import AppendStatus, NewMessage
from storage.mysql import MySQLSettings, MySQLStore, migrate
from tests.conftest import make_config as config_for
from tests.support.services import (
    MYSQL2_PORT,
    MYSQL_PORT,
    drop_mysql,
    fresh_mysql,
    require_port,
    second_mysql,
)
from tests.support.services import (
    mysql_rows as rows,
)
from tests.support.tcpproxy import TcpProxy
from tests.support.waiting import wait_until
from tests.support.wire import Wire


async def tables(port: int, database: str) -> set[str]:
    conn = await aiomysql.connect(host="127.0.0.1", port=port, user="root", password="")
    try:
        async with conn.cursor() as cur:
            await cur.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema=%s",
                (database,),
            )
            return {str(t) for (t,) in await cur.fetchall()}
    finally:
        conn.close()


async def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(argv))

    rc = await asyncio.to_thread(run)
    return rc, out.getvalue(), err.getvalue()


async def test_migrate_puts_each_shard_on_its_server_and_status_prints_the_map() -> None:
    url = await fresh_mysql(4, sharded=True)
    name = MySQLSettings.from_url(url).database
    try:
        first, second = await tables(MYSQL_PORT, name), await tables(MYSQL2_PORT, name)
        assert {"im_message_0000", "im_message_0001", "im_shard_map", "im_node_lease"} <= first
        assert not {"im_message_0002", "im_message_0003"} & first
        assert {"im_message_0002", "im_message_0003", "im_conv_seq", "im_conv_member"} <= second
        assert {"im_send_dedup", "im_outbox", "im_delivered", "im_conversation"} <= second
        assert not {"im_message_0000", "im_shard_map", "im_node_lease"} & second

        rc, out, _ = await cli("db", "status", "--store", url)
        assert rc == 0, out
        assert f"0000-0001  mysql://root@127.0.0.1:{MYSQL_PORT}/{name} (metadata database)" in out
        assert f"0002-0003  mysql://root@127.0.0.1:{MYSQL2_PORT}/{name}  ok, 2 shard" in out

        # Idempotent; the map is fixed once written.
        rc, out, err = await cli("db", "migrate", "--store", url)
        assert rc == 0, err
        other = f"mysql://root@127.0.0.1:{MYSQL2_PORT}/{name}"
        rc, _, err = await cli("db", "migrate", "--store", url, "--servers", other)
        assert rc == 1 and "already set" in err

        # A server that lost its tables is reported.
        await rows(MYSQL2_PORT, name, "DROP TABLE im_message_0003")
        rc, out, _ = await cli("db", "status", "--store", url)
        assert rc == 1 and "MISSING 1 of 2 shard tables" in out
    finally:
        await drop_mysql(url)
    assert name not in {d for (d,) in await rows(MYSQL2_PORT, "mysql", "SHOW DATABASES")}


async def test_a_single_server_store_has_an_empty_map() -> None:
    url = await fresh_mysql(4)
    try:
        rc, out, _ = await cli("db", "status", "--store", url)
        assert rc == 0 and "shard map: none" in out and "0000-0003" in out
        store = MySQLStore(MySQLSettings.from_url(url))
        await store.start()
        assert store.shard_map == []
        await store.close()
    finally:
        await drop_mysql(url)


async def convs_on_both(store: MySQLStore, sender: int) -> tuple[int, int]:
    """A p2p conversation of `sender` on the first server (shards 0-1), one on the
    second (shards 2-3)."""
    found: dict[bool, int] = {}
    peer = 1000
    while len(found) < 2:
        peer += 1
        conv = await store.open_p2p(sender, peer)
        found.setdefault(conv % 4 >= 2, conv)
    return found[False], found[True]


@pytest.fixture
async def sharded_store() -> AsyncIterator[MySQLStore]:
    url = await fresh_mysql(4, sharded=True)
    store = MySQLStore(MySQLSettings.from_url(url))
    await store.start()
    yield store
    await store.close()
    await drop_mysql(url)


async def test_a_batch_spanning_servers_stores_each_message_on_its_server(
    sharded_store: MySQLStore,
) -> None:
    store = sharded_store
    name = store.settings.database
    a, b = await convs_on_both(store, 1)
    batch = [NewMessage(c, 1, f"m{i}-{c}", 1, b"x%d" % i) for i in range(3) for c in (a, b)]
    results = await store.append(batch)
    assert [r.status for r in results] == [AppendStatus.STORED] * 6
    # Committed by the time append returned (the acks follow it): read from outside.
    on_first = await rows(MYSQL_PORT, name, "SELECT conv_id, seq FROM im_message_0000 "
                          "UNION ALL SELECT conv_id, seq FROM im_message_0001")  # fmt: skip
    on_second = await rows(MYSQL2_PORT, name, "SELECT conv_id, seq FROM im_message_0002 "
                           "UNION ALL SELECT conv_id, seq FROM im_message_0003")  # fmt: skip
    assert sorted(s for c, s in on_first if c == a) == [1, 2, 3]
    assert sorted(s for c, s in on_second if c == b) == [1, 2, 3]
    # The seq row, member rows and idempotency records live with the messages.
    assert await rows(MYSQL2_PORT, name, f"SELECT max_seq FROM im_conv_seq WHERE conv_id={b}") == [
        (3,)
    ]
    assert await rows(MYSQL_PORT, name, f"SELECT 1 FROM im_conv_seq WHERE conv_id={b}") == []
    dedup = await rows(MYSQL2_PORT, name, "SELECT conv_id FROM im_send_dedup")
    assert {c for (c,) in dedup} == {b}
    # A resend finds its record on its own server; the user's SYNC merges both.
    again = await store.append([NewMessage(b, 1, f"m0-{b}", 1, b"x0")])
    assert again[0].status is AppendStatus.DUPLICATE
    found = await store.find_sent(1, f"m2-{b}")
    assert found is not None and found.conv_id == b
    page = await store.sync(1, "d", changed_since_ms=0, after=None, limit=50)
    assert {r.conv_id: r.max_seq for r in page.rows if r.conv_id in (a, b)} == {a: 3, b: 3}
    assert (await store.conversation_counts([1]))[1] >= 2


async def test_a_key_reused_on_another_server_is_a_conflict(sharded_store: MySQLStore) -> None:
    """Each server's commit sees only its own idempotency records: a key used before
    for a conversation on the other server, or earlier in the same batch, is CONFLICT
    (and not stored), as with one server; a resend of the same send is DUPLICATE."""
    store = sharded_store
    name = store.settings.database
    a, b = await convs_on_both(store, 1)
    first = await store.append([NewMessage(a, 1, "k1", 1, b"x")])
    assert first[0].status is AppendStatus.STORED
    results = await store.append(
        [
            NewMessage(b, 1, "k1", 1, b"x"),  # used before, for a
            NewMessage(a, 1, "k1", 1, b"x"),  # the same send again
            NewMessage(b, 1, "k2", 1, b"y"),
            NewMessage(a, 1, "k2", 1, b"y"),  # k2 just used in this batch, for b
        ]
    )
    assert [r.status for r in results] == [
        AppendStatus.CONFLICT,
        AppendStatus.DUPLICATE,
        AppendStatus.STORED,
        AppendStatus.CONFLICT,
    ]
    assert await rows(MYSQL2_PORT, name, f"SELECT seq FROM im_message_{b % 4:04d} "
                      f"WHERE conv_id={b}") == [(1,)]  # fmt: skip
    assert await rows(MYSQL_PORT, name, f"SELECT seq FROM im_message_{a % 4:04d} "
                      f"WHERE conv_id={a}") == [(1,)]  # fmt: skip
    assert store.reuse_check_failures == 0


async def proxied_second_server() -> tuple[TcpProxy, str]:
    """A fresh database with 4 shards over 3306 and the second MariaDB, the second reached
    through a proxy the test can cut; migrated. The store URL (2 s timeouts) and proxy."""
    second_mysql()
    proxy = TcpProxy("127.0.0.1", MYSQL2_PORT)
    await proxy.start()
    name = f"imgw_t_{secrets.token_hex(6)}"
    url = f"mysql://root:@127.0.0.1:{MYSQL_PORT}/{name}?shards=4&timeout=2"
    servers = [
        f"mysql://root@127.0.0.1:{MYSQL_PORT}/{name}",
        f"mysql://root@127.0.0.1:{proxy.port}/{name}",
    ]
    await migrate(MySQLSettings.from_url(url), servers)
    return proxy, url


async def test_a_server_down_fails_its_own_messages_only(tmp_path: Path) -> None:
    """Over the wire: one SEND to each server in one batch while the second is cut off.
    The first is acked (and stored); the second is answered `unavailable` and is not
    stored; once the server is back, its retry with the same id is stored as seq 1."""
    require_port(MYSQL_PORT, "MariaDB")
    proxy, url = await proxied_second_server()
    name = MySQLSettings.from_url(url).database
    server = Server(config_for(tmp_path, store=url, cache="memory://", batch_delay_ms=50.0,
                                batch_wait_ms=50.0))  # fmt: skip
    await server.start()
    try:
        alice = await Wire.login(server.port, 1)
        convs: dict[bool, int] = {}
        peer = 1000
        while len(convs) < 2:
            peer += 1
            ok = await alice.request(OpenP2P(0, peer))
            assert isinstance(ok, ConvOk)
            convs.setdefault(ok.conv_id % 4 >= 2, ok.conv_id)
        a, b = convs[False], convs[True]
        proxy.cut()
        await alice.send(Send(10, a, "to-a", 1, b"a"))
        await alice.send(Send(11, b, "to-b", 1, b"b"))
        ack = await alice.wait_for(SendAck, rid=10, timeout=10)
        assert (ack.conv_id, ack.seq) == (a, 1)
        err = await alice.wait_for(Error, rid=11, timeout=10)
        assert err.code == ErrorCode.UNAVAILABLE
        assert await rows(
            MYSQL_PORT, name, f"SELECT max_seq FROM im_conv_seq WHERE conv_id={a}"
        ) == [(1,)]
        proxy.restore()
        # Answered `unavailable` until the store's probe finds the server back (0.1 s).
        deadline = time.monotonic() + 5
        while True:
            again = await alice.request(Send(0, b, "to-b", 1, b"b"), timeout=10)
            if isinstance(again, SendAck) or time.monotonic() > deadline:
                break
            assert isinstance(again, Error) and again.code == ErrorCode.UNAVAILABLE
            await asyncio.sleep(0.05)
        assert isinstance(again, SendAck) and (again.conv_id, again.seq) == (b, 1)
        assert await rows(MYSQL2_PORT, name, f"SELECT seq FROM im_message_{b % 4:04d} "
                          f"WHERE conv_id={b}") == [(1,)]  # fmt: skip
    finally:
        await server.shutdown()
        proxy.restore()
        await drop_mysql(url)
        await proxy.close()


async def test_a_store_starts_while_a_shard_server_is_down() -> None:
    """A shard server that does not answer at start makes its conversations
    unavailable, not the gateway: the other server's work goes on (a SYNC lists its
    conversations and counts the other server missing), and it is used as soon as it
    answers."""
    proxy, url = await proxied_second_server()
    store = MySQLStore(MySQLSettings.from_url(url))
    try:
        await store.start()
        a, b = await convs_on_both(store, 1)
        await store.close()
        proxy.cut()
        store = MySQLStore(MySQLSettings.from_url(url))
        await store.start()
        with pytest.raises(StoreUnavailable):
            await store.max_seq(b)
        page = await store.sync(1, "d", changed_since_ms=0, after=None, limit=10)
        assert ([r.conv_id for r in page.rows], page.missing, page.servers) == ([a], 1, 2)
        (r,) = await store.append([NewMessage(a, 1, "x", 1, b"x")])
        assert r.status is AppendStatus.STORED
        proxy.restore()
        await wait_until(lambda: not store.servers_down(), 5, "the probe finds it back")
        (r,) = await store.append([NewMessage(b, 1, "y", 1, b"y")])
        assert r.status is AppendStatus.STORED
        page = await store.sync(1, "d", changed_since_ms=0, after=None, limit=10)
        assert (sorted(r.conv_id for r in page.rows), page.missing) == (sorted([a, b]), 0)
    finally:
        await store.close()
        proxy.restore()
        await drop_mysql(url)
        await proxy.close()


async def test_pages_come_from_a_caught_up_replica_else_from_the_primary() -> None:
    """`?replica=`: a PULL/HISTORY page comes from the replica only when it has applied
    every commit of the conversation the primary had; a lagging replica, or one that
    does not answer, leaves the page to the primary. The "replica" here is a database on
    the second server that the test fills by hand (marked content shows where a page
    came from)."""
    second_mysql()
    proxy = TcpProxy("127.0.0.1", MYSQL2_PORT)
    await proxy.start()
    primary = await fresh_mysql(2)
    name = MySQLSettings.from_url(primary).database
    await migrate(MySQLSettings.from_url(f"mysql://root@127.0.0.1:{MYSQL2_PORT}/{name}?shards=2"))
    store = MySQLStore(
        MySQLSettings.from_url(f"{primary}&replica=mysql://root@127.0.0.1:{proxy.port}/{name}")
    )
    await store.start()
    try:
        conv = await store.open_p2p(1, 2)
        table = f"im_message_{conv % 2:04d}"
        await store.append([NewMessage(conv, 1, f"c{i}", 1, b"primary") for i in range(5)])
        # The replica catches up (by hand), with content that tells the pages apart.
        copied = await rows(
            MYSQL_PORT,
            name,
            f"SELECT max_seq, last_active_ms FROM im_conv_seq WHERE conv_id={conv}",
        )
        await rows(MYSQL2_PORT, name, "INSERT INTO im_conv_seq (conv_id, max_seq, last_active_ms) "
                   f"VALUES ({conv}, {copied[0][0]}, {copied[0][1]})")  # fmt: skip
        msgs = await rows(
            MYSQL_PORT,
            name,
            f"SELECT id, conv_id, seq, sender_uid, msg_type, send_ms, client_msg_id FROM {table}",
        )
        for mid, c, seq, sender, mtype, ms, cmid in msgs:
            values = (
                f"{mid}, {c}, {seq}, {sender}, {mtype}, 'replica', {ms}, X'{bytes(cmid).hex()}'"
            )
            await rows(
                MYSQL2_PORT,
                name,
                f"INSERT INTO {table} (id, conv_id, seq, sender_uid, msg_type, content, "
                f"send_ms, client_msg_id) VALUES ({values})",
            )

        got, more = await store.read_after(conv, 0, 10, min_seq=0, max_seq=None)
        assert [m.content for m in got] == [b"replica"] * 5 and not more
        got, _ = await store.read_before(conv, 0, 2, min_seq=0, max_seq=None)
        assert [m.content for m in got] == [b"replica"] * 2
        assert store.replica_reads == 2

        # The primary moves on: the replica lags for this conversation.
        await store.append([NewMessage(conv, 1, "c5", 1, b"primary")])
        got, _ = await store.read_after(conv, 0, 10, min_seq=0, max_seq=None)
        assert [m.content for m in got] == [b"primary"] * 6
        assert store.replica_lagging == 1

        # A replica that does not answer: the primary, and the replica is left alone.
        await rows(MYSQL2_PORT, name, f"UPDATE im_conv_seq SET max_seq=6 WHERE conv_id={conv}")
        proxy.cut()
        got, _ = await store.read_after(conv, 0, 10, min_seq=0, max_seq=None)
        assert len(got) == 6 and store.replica_failures == 1
        proxy.restore()
        got, _ = await store.read_after(conv, 0, 10, min_seq=0, max_seq=None)
        assert len(got) == 6 and store.replica_failures == 1 and store.replica_reads == 2
    finally:
        await store.close()
        proxy.restore()
        await proxy.close()
        await drop_mysql(primary)
        conn = await aiomysql.connect(host="127.0.0.1", port=MYSQL2_PORT, user="root", password="")
        try:
            async with conn.cursor() as cur:
                await cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        finally:
            conn.close()


@dataclass
class Sent:
    """One SEND of the traffic: its conversation, when it went out, and its answer."""

    conv: int
    cmid: str
    at: float
    took: float = 0.0
    seq: int = 0  # acked at this seq
    error: int = 0  # or refused with this code


async def sync_pass(
    port: int, since: Opaque, limit: int = 2
) -> tuple[SyncResult, list[SyncResult]]:
    """Every page of one SYNC pass of uid 1 from `since`: the last page, and all."""
    w = await Wire.login(port, 1, "syncer")
    try:
        pages: list[SyncResult] = []
        cursor: Opaque = 0
        while True:
            page = await w.request(Sync(0, since, cursor, limit), timeout=10)
            assert isinstance(page, SyncResult), page
            pages.append(page)
            if not page.has_more:
                return page, pages
            cursor = page.next_cursor
    finally:
        await w.close()


@pytest.mark.parametrize("fault", ["cut", "blackhole"])
async def test_one_server_down_is_not_everyone_down(tmp_path: Path, fault: str) -> None:
    """Traffic to three conversations on each server; the second server is cut off
    (connections reset and refused) or black-holed (nothing answers) for 4 s. Sends to
    the first server's conversations go on being acked; the second's are answered
    `unavailable` (never acked) and retried with the same id; a SYNC lists the first
    server's conversations and says one server of two is missing, without moving
    `next_since` past it; once the server is back, a SYNC from that `next_since` lists
    the second server's conversations, and every acked message is stored at its seq."""
    require_port(MYSQL_PORT, "MariaDB")
    proxy, url = await proxied_second_server()
    server = Server(config_for(tmp_path, store=url, cache="memory://"))
    await server.start()
    sent: list[Sent] = []
    stop = asyncio.Event()

    async def traffic(peer: int, conv: int) -> None:
        w = await Wire.login(server.port, peer, "d")
        k = 0
        try:
            while not stop.is_set():
                cmid = f"{conv}-{k}"
                while not stop.is_set():  # a client retries with the same client_msg_id
                    s = Sent(conv, cmid, time.monotonic())
                    sent.append(s)
                    reply = await w.request(Send(0, conv, cmid, 1, cmid.encode()), timeout=15)
                    s.took = time.monotonic() - s.at
                    if isinstance(reply, SendAck):
                        s.seq = reply.seq
                        break
                    assert isinstance(reply, Error), reply
                    s.error = reply.code
                    await asyncio.sleep(0.1)
                k += 1
                await asyncio.sleep(0.05)
        finally:
            await w.close()

    try:
        alice = await Wire.login(server.port, 1)
        convs: dict[int, bool] = {}  # conv -> on the second server
        peers: dict[int, int] = {}
        peer = 1000
        while sorted(convs.values()).count(False) < 3 or sorted(convs.values()).count(True) < 3:
            peer += 1
            ok = await alice.request(OpenP2P(0, peer))
            assert isinstance(ok, ConvOk)
            second = ok.conv_id % 4 >= 2
            if list(convs.values()).count(second) < 3:
                convs[ok.conv_id], peers[ok.conv_id] = second, peer
        await alice.close()
        healthy = {c for c, second in convs.items() if not second}
        downed = set(convs) - healthy
        for c in convs:  # a first message each: every conversation is listed from 0
            w = await Wire.login(server.port, peers[c], "first")
            assert isinstance(await w.request(Send(0, c, f"{c}-first", 1, b"x")), SendAck)
            await w.close()
        before, _ = await sync_pass(server.port, 0)
        assert before.partial is None

        tasks = [asyncio.create_task(traffic(peers[c], c)) for c in convs]
        await asyncio.sleep(1.5)
        began = time.monotonic()
        proxy.cut() if fault == "cut" else proxy.blackhole()
        await asyncio.sleep(2.0)
        t0 = time.monotonic()
        # One page (rows changing under the traffic do not move past a cursor), then a
        # pass of a page per row.
        whole, _ = await sync_pass(server.port, before.next_since, 0)
        sync_s = time.monotonic() - t0
        during, in_fault_pages = await sync_pass(server.port, before.next_since, 1)
        await asyncio.sleep(2.0)
        ended = time.monotonic()
        proxy.restore()

        # During the fault: the healthy server's conversations, one server of two missing,
        # and next_since not past what was missed.
        listed = {r.conv_id for r in whole.convs}
        assert healthy == listed, (listed, healthy)
        assert whole.partial == SyncPartial(1, 2) and whole.next_since == before.next_since
        assert not {r.conv_id for p in in_fault_pages for r in p.convs} & downed
        assert all(p.partial == SyncPartial(1, 2) for p in in_fault_pages)
        assert during.next_since == before.next_since

        await asyncio.sleep(1.0)  # the second server's sends are acked again
        stop.set()
        await asyncio.gather(*tasks)

        # After: a SYNC from that next_since brings the missed conversations, whole, at
        # their last acked seq (the traffic has stopped: no row moves during the pass).
        deadline = time.monotonic() + 10
        while True:
            _, pages = await sync_pass(server.port, during.next_since)
            if all(p.partial is None for p in pages) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert all(p.partial is None for p in pages)
        rows = {r.conv_id: r.max_seq for p in pages for r in p.convs}
        last = {c: max(s.seq for s in sent if s.conv == c) for c in convs}
        assert rows == last

        in_fault = [s for s in sent if began <= s.at < ended]
        ok_healthy = [s for s in in_fault if s.conv in healthy and s.seq]
        to_healthy = [s for s in in_fault if s.conv in healthy]
        to_downed = [s for s in in_fault if s.conv in downed]
        # A send to the downed server is never acked while it is down...
        assert to_downed and not [s for s in to_downed if s.seq and s.at > began + 0.05]
        assert all(s.seq or s.error == ErrorCode.UNAVAILABLE for s in to_downed)
        # ... and the healthy server's are.
        share = len(ok_healthy) / len(to_healthy)
        assert share >= 0.95, [s for s in to_healthy if not s.seq]
        assert all(s.seq for s in sent if s.at > ended + 1.0 and s.at < ended + 1.5)

        # Every acked message is stored, once, at its acked seq.
        acked = {(s.conv, s.cmid): s.seq for s in sent if s.seq}
        name = MySQLSettings.from_url(url).database
        for c in convs:
            port = MYSQL2_PORT if c in downed else MYSQL_PORT
            stored = await rows_of(port, name, c)
            mine = {cmid: seq for (conv, cmid), seq in acked.items() if conv == c}
            assert {m: stored[m] for m in mine} == mine
            assert len(set(stored.values())) == len(stored)
        took = sorted(s.took for s in ok_healthy)
        print(
            f"{fault}: {len(ok_healthy)}/{len(to_healthy)} sends to the healthy server acked "
            f"during the fault ({share:.1%}; p50 {took[len(took) // 2]:.3f} s, max "
            f"{took[-1]:.3f} s); {len(to_downed)} sends to the downed server, all "
            f"unavailable; SYNC during the fault: {len(listed)} conversations in "
            f"{len(in_fault_pages)} pages, partial {[p.partial for p in in_fault_pages]}, "
            f"next_since kept: {during.next_since == before.next_since}, {sync_s:.3f} s; "
            f"after: {len(rows)} conversations at their last acked seq, the {len(downed)} "
            "missed ones included"
        )
    finally:
        stop.set()
        await server.shutdown()
        proxy.restore()
        await drop_mysql(url)
        await proxy.close()


async def rows_of(port: int, database: str, conv: int) -> dict[str, int]:
    """client_msg_id -> seq of the messages stored for `conv` (on the server at `port`)."""
    got = await rows(
        port, database, f"SELECT client_msg_id, seq FROM im_message_{conv % 4:04d} "
        f"WHERE conv_id={conv}"
    )  # fmt: skip
    return {bytes(m).decode() if isinstance(m, bytes | bytearray) else str(m): int(s)
            for m, s in got}  # fmt: skip
