"""Unread counts do not change when messages move tiers: SYNC counts the archived ones
from what each batch left in `im_archive_unread`, on the embedded store and on MySQL
(one server, and shards over two): after archiving part of the history and then all of
it, with read positions landing inside archived files, across a member who left, with
new hot messages, and after retention rewrote a file."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protocol.ops import MsgType
from storage.archive import run as archive_module
from storage.archive.index_mysql import MySQLIndex
from storage.archive.index_sqlite import ArchiveIndex, SqliteIndex
from storage.archive.run import archive_run
from storage.embedded import EmbeddedStore
from storage.models import NewMessage, StoredMessage
from storage.mysql import MySQLSettings, MySQLStore
from storage.rules import counts_as_unread
from tests.archive.common import DAY, T0, Clock, History, fill
from tests.support.services import drop_mysql, fresh_mysql

UIDS = (1, 2, 3, 4)
Counts = dict[tuple[int, int], tuple[int, int, int]]  # (uid, conv) -> read, max, unread


@dataclass
class Tiers:
    store: Any
    index: Callable[[], ArchiveIndex]
    clock: Clock


@pytest.fixture(params=["embedded", "mysql", "sharded"])
async def tiers(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Tiers]:
    clock = Clock()
    if request.param == "embedded":
        path = str(tmp_path / "imgw.db")
        store: Any = EmbeddedStore(path, clock=clock)
        await store.start()
        try:
            yield Tiers(store, lambda: SqliteIndex(path, clock=clock), clock)
        finally:
            await store.close()
        return
    url = await fresh_mysql(shards=2, sharded=request.param == "sharded")
    settings = MySQLSettings.from_url(url)
    store = MySQLStore(settings, clock=clock)
    await store.start()
    try:
        yield Tiers(store, lambda: MySQLIndex(settings, clock=clock), clock)
    finally:
        await store.close()
        await drop_mysql(url)


async def archive(t: Tiers, to: str, **kw: Any) -> None:
    index = t.index()
    await index.open()
    try:
        report = await archive_run(index, to, **kw)
    finally:
        await index.close()
    assert not report.failures


async def counts(t: Tiers) -> Counts:
    out: Counts = {}
    for uid in UIDS:
        page = await t.store.sync(uid, "d", changed_since_ms=0, after=None, limit=100)
        assert not page.has_more
        out |= {(uid, r.conv_id): (r.read_seq, r.max_seq, r.unread) for r in page.rows}
    return out


async def messages(t: Tiers, conv: int) -> list[StoredMessage]:
    """Every message of `conv` still kept, through the archive's files."""
    out: list[StoredMessage] = []
    while True:
        after = out[-1].seq if out else 0
        page, more = await t.store.read_after(conv, after, 100, min_seq=0, max_seq=None)
        out += page
        if not more:
            return out


async def expected(t: Tiers, got: Counts) -> Counts:
    """What each row's unread count should be, counted from the messages themselves."""
    msgs = {conv: await messages(t, conv) for conv in {c for _, c in got}}
    return {
        (uid, conv): (read, top, sum(
            read < m.seq <= top and counts_as_unread(m.msg_type) and m.sender_uid != uid
            for m in msgs[conv]
        ))
        for (uid, conv), (read, top, _) in got.items()
    }  # fmt: skip


async def test_archiving_changes_no_unread_count(
    tiers: Tiers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive_module, "BATCH_MAX", 5)  # many files: reads land inside
    t, store, clock = tiers, tiers.store, tiers.clock
    h: History = await fill(store, clock, days=4, per_day=12)
    p1, _, group = h.convs
    await store.set_read(p1, 2, 7)
    await store.set_read(group, 3, 15)
    await store.change_members(group, 3, [], [3])  # 3 leaves: counted up to its leaving
    await store.set_read(group, 4, h.late_joined_seq + 3)
    before = await counts(t)
    assert before == await expected(t, before)
    assert before[(1, p1)][0] == 0 and before[(1, p1)][2] > 0  # unread from the start

    url = (tmp_path / "arch").as_uri()
    clock.ms = T0 + 20 * DAY
    await archive(t, url, older_than_ms=18 * DAY)  # the first two days of four
    assert await counts(t) == before
    await archive(t, url, older_than_ms=0)  # everything
    assert await counts(t) == before

    # reading moves through archived files: counted from each position
    top = before[(2, group)][1]
    for seq in range(before[(2, group)][0] + 1, top + 1, 4):
        await store.set_read(group, 2, seq)
        now = await counts(t)
        assert now[(2, group)] == (await expected(t, now))[(2, group)], seq
    # new hot messages add to the archived ones
    sent = [NewMessage(p1, 1, f"new{i}", MsgType.TEXT, b"x") for i in range(3)]
    await store.append(sent)
    now = await counts(t)
    assert now == await expected(t, now) and now[(2, p1)][2] == before[(2, p1)][2] + 3

    # retention rewrites a file partly past it: what is left keeps counting
    clock.ms = T0 + 20 * DAY
    await archive(t, url, older_than_ms=None, retention_ms=17 * DAY + DAY // 2)
    now = await counts(t)
    assert now == await expected(t, now)
    assert 0 < now[(1, p1)][2] < before[(1, p1)][2]  # 1 read nothing: some went for good
