"""The send path's hand-built SQL (storage/mysql/sql.py): every byte of content and
client_msg_id survives, one multi-statement batch spanning shards commits or fails as a
whole, and values that are not int/bytes/None are refused rather than spliced in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import aiomysql
import pytest
from asyncmy import errors as db_errors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.models import AppendStatus, NewMessage, StoreUnavailable, SyncPage
from storage.mysql import MySQLSettings, MySQLStore, sql
from tests.support.services import drop_mysql, fresh_mysql


def test_literals() -> None:
    assert sql.lit(None) == "NULL"
    assert sql.lit(0) == "0"
    assert sql.lit(2**64 - 1) == "18446744073709551615"
    assert sql.lit(True) == "1"
    assert sql.lit(b"") == "X''"
    assert sql.lit(b"'\\\x00") == "X'275c00'"
    with pytest.raises(TypeError):
        sql.lit("1; DROP TABLE im_message_0000")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sql.ints([])


@pytest.fixture
async def store():  # type: ignore[no-untyped-def]
    url = await fresh_mysql(shards=4)
    s = MySQLStore(MySQLSettings.from_url(url))
    await s.start()
    yield s
    await s.close()
    await drop_mysql(url)


_contents = st.binary(max_size=300)
_cmids = st.text(min_size=1, max_size=40).filter(lambda t: len(t.encode()) <= 40)  # + tag <= 64


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    items=st.lists(st.tuples(_cmids, _contents), min_size=1, max_size=12, unique_by=lambda t: t[0])
)
async def test_any_bytes_round_trip_across_shards(
    store: MySQLStore, items: list[tuple[str, bytes]]
) -> None:
    convs = [await store.open_p2p(1, 2 + k) for k in range(4)]  # 4 shards
    tag = str(time.monotonic_ns())
    batch = [
        NewMessage(convs[i % 4], 1, f"{tag}{cmid}", 1, content)
        for i, (cmid, content) in enumerate(items)
    ]
    results = await store.append(batch)
    assert [r.status for r in results] == [AppendStatus.STORED] * len(batch)
    for m, r in zip(batch, results, strict=True):
        assert r.message is not None
        got, _ = await store.read_after(m.conv_id, r.message.seq - 1, 1, min_seq=0, max_seq=None)
        assert (got[0].content, got[0].client_msg_id) == (m.content, m.client_msg_id)
        sent = await store.find_sent(1, m.client_msg_id)
        assert sent is not None and sent.seq == r.message.seq


async def test_a_batch_that_fails_mid_way_stores_nothing(store: MySQLStore) -> None:
    """A message too large for its column fails its INSERT after the seq update and
    other shards' INSERTs ran: the whole transaction goes, seqs included."""
    a, b = await store.open_p2p(1, 2), await store.open_p2p(1, 3)
    good = NewMessage(a, 1, "good", 1, b"ok")
    huge = NewMessage(b, 1, "huge", 1, b"x" * 20_000)  # over VARBINARY(16384)
    with pytest.raises(db_errors.DataError):
        await store.append([good, huge])
    assert await store.find_sent(1, "good") is None
    assert await store.max_seq(a) == 0
    (r,) = await store.append([good])
    assert r.status is AppendStatus.STORED and r.message is not None and r.message.seq == 1


async def test_unread_counts_across_shards(store: MySQLStore) -> None:
    """SYNC's unread counts, one range count per shard sent in one round trip: only the
    peers' messages after the read position count."""
    convs = [await store.open_p2p(1, peer) for peer in range(2, 10)]  # all 4 shards
    assert len({c % 4 for c in convs}) == 4
    batch = []
    for k, (conv, peer) in enumerate(zip(convs, range(2, 10), strict=True)):
        batch += [NewMessage(conv, peer, f"p{peer}-{i}", 1, b"x") for i in range(k)]
        batch += [NewMessage(conv, 1, f"own{peer}-{i}", 1, b"y") for i in range(2)]
    await store.append(batch)
    await store.set_read(convs[5], 1, 3)  # 5 from the peer then 2 own: 2 unread remain
    page = await store.sync(1, "d", changed_since_ms=0, after=None, limit=50)
    unread = {row.conv_id: row.unread for row in page.rows}
    expected = {conv: k for k, conv in enumerate(convs)}
    expected[convs[5]] = 2
    assert unread == expected


async def test_a_send_answered_unavailable_never_commits_later() -> None:
    """The batch's writes wait on a lock past the store timeout: the senders are told
    `unavailable`, and the batch must not commit once the lock is released (a COMMIT
    queued behind the waiting INSERT would run although the client had given up)."""
    url = (await fresh_mysql()).replace("timeout=3", "timeout=1")
    s = MySQLSettings.from_url(url)
    store = MySQLStore(s)
    await store.start()
    blocker = await aiomysql.connect(
        host=s.host, port=s.port, user=s.user, password=s.password, db=s.database
    )
    try:
        conv = await store.open_p2p(1, 2)
        async with blocker.cursor() as cur:
            await cur.execute("BEGIN")
            # a gap lock where (1, 'k1') would go: the batch's dedup INSERT waits on it
            await cur.execute(
                "SELECT * FROM im_send_dedup WHERE sender_uid=1 AND client_msg_id=X'6b31' "
                "FOR UPDATE"
            )
            with pytest.raises(StoreUnavailable):
                await store.append([NewMessage(conv, 1, "k1", 1, b"hello")])
            await blocker.rollback()
        await asyncio.sleep(1.0)  # time for a queued COMMIT to have run
        assert await store.find_sent(1, "k1") is None
        assert await store.max_seq(conv) == 0
        (r,) = await store.append([NewMessage(conv, 1, "k1", 1, b"hello")])  # the retry
        assert r.status is AppendStatus.STORED and r.message is not None and r.message.seq == 1
    finally:
        blocker.close()
        await store.close()
        await drop_mysql(url)


async def test_a_batch_larger_than_the_packet_limit(store: MySQLStore) -> None:
    """520 messages of 16 KB: over 16 MiB of SQL as hex, sent as several queries of
    one transaction."""
    convs = [await store.open_p2p(1, peer) for peer in range(2, 6)]
    big = bytes(range(256)) * 64  # 16,384 bytes, the column's limit
    batch = [NewMessage(convs[i % 4], 1, f"big-{i}", 1, big) for i in range(520)]
    results = await store.append(batch)
    assert all(r.status is AppendStatus.STORED for r in results)
    msgs, _ = await store.read_after(convs[3], 0, 200, min_seq=0, max_seq=None)
    assert len(msgs) == 130 and all(m.content == big for m in msgs)


async def test_concurrent_syncs_share_round_trips_and_each_gets_its_own_page(
    store: MySQLStore,
) -> None:
    """SYNCs asked together go out together (up to 64 a query): each still gets exactly
    the page it would have got alone, unread counts included."""
    batch = []
    for u in range(1, 41):
        for k in range(u % 4):
            conv = await store.open_p2p(u, 1000 + u * 10 + k)
            batch += [
                NewMessage(conv, 1000 + u * 10 + k, f"u{u}k{k}m{i}", 1, b"x") for i in range(k + 1)
            ]
    await store.append(batch)

    def ask(u: int) -> Awaitable[SyncPage]:
        return store.sync(u, "d", changed_since_ms=0, after=None, limit=2)

    alone = [await ask(u) for u in range(1, 41)]
    together = await asyncio.gather(*(ask(u) for u in range(1, 41)))
    assert together == alone
    assert [len(p.rows) for p in together[:4]] == [1, 2, 2, 0]
    assert together[2].has_more and not together[1].has_more
    assert sorted(r.unread for r in together[2].rows) == [2, 3]  # its newest two
    last = together[2].rows[-1]
    rest = await store.sync(
        3, "d", changed_since_ms=0, after=(last.last_active_ms, last.conv_id), limit=2
    )
    assert [r.unread for r in rest.rows] == [1] and not rest.has_more


async def test_syncs_asked_together_skip_only_the_users_with_nothing_changed(
    store: MySQLStore,
) -> None:
    """A batch first asks which users have anything changed since their `since`; the
    others get an empty page without a statement of their own. Every kind of change
    still lists: a new message, a read position, a delivered position of the asking
    device (not another device's), leaving; and a since of 0 lists every conversation."""
    convs = {u: await store.open_p2p(u, 500 + u) for u in range(1, 9)}
    convs[5], _ = await store.create_group(505, "g", [505, 5])
    await store.append([NewMessage(convs[u], 500 + u, f"m{u}", 1, b"x") for u in convs])
    await asyncio.sleep(0.01)
    since = store.now_ms()
    await asyncio.sleep(0.01)
    await store.append([NewMessage(convs[1], 501, "new", 1, b"y")])  # 1: a message
    await store.set_read(convs[2], 2, 1)  # 2: read
    await store.set_delivered(convs[3], 3, "d", 1)  # 3: delivered, this device
    await store.set_delivered(convs[4], 4, "other", 1)  # 4: another device only
    await store.change_members(convs[5], 5, add=[], remove=[5])  # 5: left

    def ask(u: int, since_ms: int) -> Awaitable[SyncPage]:
        return store.sync(u, "d", changed_since_ms=since_ms, after=None, limit=10)

    asks = [(u, since) for u in range(1, 9)] + [(6, 0), (99, 0)]  # 99: no conversation
    alone = [await ask(u, s) for u, s in asks]
    together = await asyncio.gather(*(ask(u, s) for u, s in asks))
    assert together == alone
    listed = [bool(p.rows) for p in together]
    assert listed == [True, True, True, False, True, False, False, False, True, False]
