"""A user's unread count through a gateway is the same before and after `imgw archive
run --older-than 0s` moves the conversation to the archive (the store-level cases:
tests/archive/test_archive_unread.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.server import Server
from protocol.frames import ConvOk, ConvRecord, OpenP2P, Read, Sync, SyncResult
from storage.archive.run import archive_run
from tests.e2e.test_archive_reads import index_of
from tests.e2e.test_messaging import send
from tests.support.wire import Wire

pytestmark = pytest.mark.backends("embedded", "production")


async def row(w: Wire, conv: int) -> ConvRecord:
    res = await w.request(Sync(0, 0, 0, 0))
    assert isinstance(res, SyncResult)
    [found] = [r for r in res.convs if r.conv_id == conv]
    return found


async def test_archiving_keeps_the_unread_count(gw: Server, tmp_path: Path) -> None:
    alice = await Wire.login(gw.port, 1)
    bob = await Wire.login(gw.port, 2)
    opened = await alice.request(OpenP2P(0, 2))
    assert isinstance(opened, ConvOk)
    conv = opened.conv_id
    for i in range(6):
        await send(alice, conv, f"m{i}")
    before = await row(bob, conv)
    assert (before.read_seq, before.max_seq, before.unread) == (0, 6, 6)

    index = index_of(gw)
    await index.open()
    try:
        report = await archive_run(index, (tmp_path / "arch").as_uri(), older_than_ms=0)
    finally:
        await index.close()
    assert report.rows == 6 and not report.failures
    after = await row(bob, conv)
    assert (after.read_seq, after.max_seq, after.unread) == (0, 6, 6)
    await bob.send(Read(conv, 4))  # a read inside the archived range
    for _ in range(50):
        after = await row(bob, conv)
        if after.read_seq == 4:
            break
    assert (after.read_seq, after.unread) == (4, 2)
    assert (await row(alice, conv)).unread == 0  # her own messages
