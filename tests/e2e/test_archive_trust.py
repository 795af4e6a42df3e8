"""The archive reader believes a file only when it holds what its index row says: a
file of another conversation, or one missing rows, in place of a conversation's file
answers HISTORY and PULL `unavailable`, never another conversation's messages or a
short page."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.server import Server
from protocol.frames import (
    ConvOk,
    Error,
    History,
    HistoryResult,
    OpenP2P,
    Pull,
    PullResult,
    Send,
    SendAck,
)
from protocol.ops import ErrorCode
from storage.archive import objects
from storage.archive.run import archive_run
from tests.conftest import StartGateway
from tests.e2e.test_archive_reads import index_of
from tests.support.wire import Wire

# Both stores. Each conversation has more messages than the production store's Redis
# recent cache keeps (200), and the pages asked reach below it: they come from files.
pytestmark = pytest.mark.backends("embedded", "production")

MANY = 250


async def p2p(w: Wire, peer: int) -> int:
    reply = await w.request(OpenP2P(0, peer))
    assert isinstance(reply, ConvOk), reply
    return reply.conv_id


async def send_many(w: Wire, conv: int, n: int, tag: str) -> None:
    """`n` messages, pipelined 50 at a time."""
    for lo in range(0, n, 50):
        batch = range(lo, min(n, lo + 50))
        for i in batch:
            await w.send(Send(w.rid(), conv, f"{tag}{i}", 1, f"{tag}{i}".encode()))
        for _ in batch:
            await w.wait_for(SendAck)


async def archive_all(gw: Server, tmp_path: Path) -> str:
    """`imgw archive run --older-than 0s`; the archive's URL."""
    url = (tmp_path / "arch").as_uri()
    index = index_of(gw)
    await index.open()
    try:
        report = await archive_run(index, url, older_than_ms=0)
    finally:
        await index.close()
    assert report.rows and not report.failures
    return url


async def the_file(gw: Server, conv: int) -> tuple[objects.Location, str]:
    index = index_of(gw)
    await index.open()
    try:
        [f] = await index.files(conv, 1, 1 << 62)
    finally:
        await index.close()
    return objects.open_location(f.root), f.key


async def refused(w: Wire, frame: Pull | History) -> bool:
    reply = await w.request(frame)
    if isinstance(reply, Error):
        assert reply.code == ErrorCode.UNAVAILABLE, reply
        return True
    assert isinstance(reply, PullResult | HistoryResult)
    return False


async def test_a_file_of_another_conversation_is_not_served(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = await start_gateway(rate_burst=10_000, rate_per_s=10_000.0)
    alice = await Wire.login(gw.port, 1)
    a = await p2p(alice, 2)
    b = await p2p(alice, 3)
    await send_many(alice, a, MANY, "a")
    await send_many(alice, b, 40, "b")
    await archive_all(gw, tmp_path)
    loc_a, key_a = await the_file(gw, a)
    loc_b, key_b = await the_file(gw, b)
    good = await alice.request(Pull(0, a, 0, 5))
    assert isinstance(good, PullResult) and good.msgs[0].client_msg_id == "a0"

    shutil.copyfile(loc_b.path(key_b), loc_a.path(key_a))  # a valid file, of b
    assert await refused(alice, Pull(0, a, 0, 10))
    assert await refused(alice, History(0, a, 20, 10))
    # b's own file is still served
    page = await alice.request(Pull(0, b, 0, 5))
    assert isinstance(page, PullResult) and page.msgs[0].client_msg_id == "b0"


async def test_a_file_missing_rows_is_not_served(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = await start_gateway(rate_burst=10_000, rate_per_s=10_000.0)
    alice = await Wire.login(gw.port, 1)
    a = await p2p(alice, 2)
    await send_many(alice, a, 300, "a")
    await archive_all(gw, tmp_path)
    loc, key = await the_file(gw, a)
    rows = objects.read_file(loc, key)
    assert len(rows) == 300
    objects.write_file(loc, key, rows[150:])  # a valid file with 150 of its 300 rows
    assert await refused(alice, Pull(0, a, 0, 100))
    assert await refused(alice, History(0, a, 50, 20))
