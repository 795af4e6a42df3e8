"""HISTORY and PULL through a running gateway while `imgw archive run` moves the
conversation to the archive under it: the same pages for every member (order, recalled
messages, what a late joiner and a member who left may see), retried sends still get
their ack, an archived message cannot be recalled, new messages go on from the seq
counter."""

from __future__ import annotations

import time
from pathlib import Path

from gateway.server import Server
from protocol.frames import (
    ConvOk,
    GroupCreate,
    GroupMembers,
    History,
    HistoryResult,
    Ok,
    Pull,
    PullResult,
    Recall,
    RecallOk,
)
from protocol.ops import ErrorCode
from storage.archive.index_mysql import MySQLIndex
from storage.archive.index_sqlite import ArchiveIndex, SqliteIndex
from storage.archive.run import archive_run
from storage.factory import sqlite_path
from storage.mysql import MySQLSettings
from tests.e2e.test_messaging import send
from tests.support.wire import Wire


async def pages(w: Wire, conv: int, top: int) -> list[object]:
    out: list[object] = []
    for limit in (1, 4, 100):
        for cursor in (0, 1, 3, top // 2, top - 1, top, top + 2):
            pull = await w.request(Pull(0, conv, cursor, limit))
            hist = await w.request(History(0, conv, cursor, limit))
            assert isinstance(pull, PullResult) and isinstance(hist, HistoryResult)
            out.append(("pull", cursor, limit, pull.has_more, pull.msgs))
            out.append(("history", cursor, limit, hist.has_more, hist.msgs))
    return out


def index_of(gw: Server) -> ArchiveIndex:
    """The archive index of the gateway's store, as `imgw archive run` opens it."""
    url = gw.config.store_url()
    now = lambda: int(time.time() * 1000)  # noqa: E731
    if url.startswith("sqlite://"):
        return SqliteIndex(sqlite_path(url)[0], clock=now)
    return MySQLIndex(MySQLSettings.from_url(url), clock=now)


async def test_pages_are_the_same_across_the_archive(gw: Server, tmp_path: Path) -> None:
    alice = await Wire.login(gw.port, 1)
    bob = await Wire.login(gw.port, 2)
    created = await alice.request(GroupCreate(0, "g", (2,)))
    assert isinstance(created, ConvOk)
    conv = created.conv_id
    for i in range(6):
        await send(alice if i % 2 else bob, conv, f"a{i}", f"{i}".encode())
    ack = await send(alice, conv, "oops", b"typo")
    assert isinstance(await alice.request(Recall(0, conv, ack.seq)), RecallOk)
    assert isinstance(await alice.request(GroupMembers(0, conv, (3,), ())), Ok)
    carol = await Wire.login(gw.port, 3)
    for i in range(5):
        await send(carol, conv, f"c{i}", f"c{i}".encode())
    assert isinstance(await alice.request(GroupMembers(0, conv, (), (2,))), Ok)  # bob goes
    for i in range(3):
        await send(alice, conv, f"z{i}")
    top = (await send(alice, conv, "last")).seq
    members = {"alice": alice, "bob": bob, "carol": carol}
    before = {name: await pages(w, conv, top) for name, w in members.items()}

    index = index_of(gw)
    await index.open()
    try:
        report = await archive_run(index, (tmp_path / "arch").as_uri(), older_than_ms=0)
    finally:
        await index.close()
    assert report.rows == top and not report.failures

    for name, w in members.items():
        assert await pages(w, conv, top) == before[name], name
    again = await send(alice, conv, "last")  # a retried send of an archived message
    assert again.seq == top
    assert await alice.error(Recall(0, conv, top)) == ErrorCode.NO_SUCH_MESSAGE
    new = await send(carol, conv, "after")
    assert new.seq == top + 1
    page = await carol.request(History(0, conv, 0, 3))
    assert isinstance(page, HistoryResult) and page.has_more
    assert [m.seq for m in page.msgs] == [top - 1, top, top + 1]
