"""Retention (`imgw archive run --retention AGE`) on the embedded store: messages past it
leave the hot store and the archive (files deleted, or rewritten when partly past), and
no page returns them; file:// and s3://, the command's checks."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main as imgw
from storage.archive import objects
from storage.archive.index_sqlite import SqliteIndex
from storage.archive.run import archive_run
from storage.embedded import EmbeddedStore
from storage.models import StoredMessage
from tests.archive.common import DAY, T0, Clock, History, all_pages, fill
from tests.archive.test_archive_embedded import moto_server  # noqa: F401 (a fixture)
from tests.support.archive import file_exists

Row = tuple[int, int, int]  # conv_id, seq, server_ms


def hot_rows(path: str) -> list[Row]:
    conn = sqlite3.connect(path)
    try:
        return [
            (int(c), int(s), int(ms))
            for c, s, ms in conn.execute("SELECT conv_id, seq, send_ms FROM im_message")
        ]
    finally:
        conn.close()


def index_rows(path: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT conv_id, seq_lo, seq_hi, root, file_key, n_rows FROM im_archive "
            "ORDER BY conv_id, seq_lo"
        ).fetchall()
    finally:
        conn.close()


def tiers(index: list[tuple[Any, ...]], hot: list[Row]) -> tuple[list[Row], dict[int, int]]:
    """Every visible row (hot, and in an indexed file), checked once each, and each
    conversation's expired top (the index row without a file)."""
    cold: list[Row] = []
    expired: dict[int, int] = {}
    last: dict[int, int] = {}
    for conv, lo, hi, root, key, n in index:
        assert lo == last.get(conv, 0) + 1, f"conv {conv}: index not contiguous at {lo}"
        last[conv] = hi
        if not key:
            assert lo == 1 and n == 0
            expired[conv] = hi
            continue
        got = objects.read_file(objects.open_location(root), key)
        assert [a.msg.seq for a in got] == list(range(lo, hi + 1)) and len(got) == n
        cold += [(a.msg.conv_id, a.msg.seq, a.msg.server_ms) for a in got]
    rows = sorted(hot + cold)
    assert len(rows) == len(set(rows)), "a row both hot and archived"
    return rows, expired


def check_after(original: list[Row], visible: list[Row], expired: dict[int, int], cutoff: int):
    """Exactly the rows above each conversation's expired top are visible, and every row
    at or below it was past retention."""
    for conv, seq, ms in original:
        if seq <= expired.get(conv, 0):
            assert ms <= cutoff, f"conv {conv} seq {seq} deleted before its time"
    assert visible == sorted(r for r in original if r[1] > expired.get(r[0], 0))


def check_pages(pages: dict[Any, tuple[list[StoredMessage], bool]], cutoff: int) -> None:
    for q, (msgs, _more) in pages.items():
        assert all(m.server_ms > cutoff for m in msgs), f"{q}: a message past retention"
        seqs = [m.seq for m in msgs]
        assert seqs == sorted(set(seqs)), q


async def expire(path: str, clock: Clock, retention_ms: int, **kw: Any) -> Any:
    index = SqliteIndex(path, clock=clock)
    await index.open()
    try:
        return await archive_run(index, "", older_than_ms=None, retention_ms=retention_ms, **kw)
    finally:
        await index.close()


async def archive(path: str, url: str, clock: Clock, older_than_ms: int) -> None:
    index = SqliteIndex(path, clock=clock)
    await index.open()
    try:
        report = await archive_run(index, url, older_than_ms=older_than_ms)
        assert report.rows and not report.failures
    finally:
        await index.close()


async def pages_of(path: str, h: History, clock: Clock) -> dict[Any, Any]:
    store = EmbeddedStore(path, clock=clock)
    await store.start()
    try:
        return await all_pages(store, h)
    finally:
        await store.close()


@pytest.fixture
async def filled(tmp_path: Path) -> tuple[str, History, Clock]:
    path = str(tmp_path / "imgw.db")
    clock = Clock()
    store = EmbeddedStore(path, clock=clock)
    await store.start()
    try:
        h = await fill(store, clock)
    finally:
        await store.close()
    return path, h, clock


async def _retention_across_tiers(path: str, h: History, clock: Clock, url: str) -> None:
    original = sorted(hot_rows(path))
    clock.ms = T0 + 20 * DAY
    await archive(path, url, clock, 15 * DAY)  # days 0..4 archived, one file each conv
    files_before = {r[4] for r in index_rows(path)}

    # 1. the cutoff falls inside the files: each is rewritten without its old rows
    cutoff = T0 + 2 * DAY + DAY // 2
    report = await expire(path, clock, clock.ms - cutoff)
    x = report.expired
    assert not report.failures and x.files_rewritten == len(h.convs) and x.files_deleted == 0
    assert x.hot_rows == 0 and x.rows == sum(r[2] <= cutoff for r in original)
    visible, expired = tiers(index_rows(path), hot_rows(path))
    check_after(original, visible, expired, cutoff)
    assert set(expired) == set(h.convs)
    check_pages(await pages_of(path, h, clock), cutoff)
    assert not {r[4] for r in index_rows(path)} & files_before  # the old files are gone
    for key in files_before:
        assert not file_exists(objects.open_location(url), key)

    # 2. the cutoff is past the files: they go, and hot rows too, in bounded batches
    cutoff = T0 + 7 * DAY + DAY // 2
    report = await expire(path, clock, clock.ms - cutoff, rate=10_000.0)
    x = report.expired
    assert x.files_deleted == len(h.convs) and x.hot_rows > 0
    visible, expired = tiers(index_rows(path), hot_rows(path))
    check_after(original, visible, expired, cutoff)
    assert all(k == "" for *_, k, _n in index_rows(path))  # only the expired ranges left
    pages = await pages_of(path, h, clock)
    check_pages(pages, cutoff)
    # PULL from the start gives exactly what is left
    for conv in h.convs:
        left = [r for r in visible if r[0] == conv]
        got, _ = pages[("after", conv, 0, 1000, 0, None)]
        assert [(m.conv_id, m.seq, m.server_ms) for m in got] == left

    # 3. again: nothing more to do; the archiver carries on above the expired range
    report = await expire(path, clock, clock.ms - cutoff)
    assert report.expired.rows == 0
    await archive(path, url, clock, 11 * DAY)
    visible2, expired2 = tiers(index_rows(path), hot_rows(path))
    assert visible2 == visible and expired2 == expired
    check_pages(await pages_of(path, h, clock), cutoff)


async def test_retention_across_tiers_file(
    filled: tuple[str, History, Clock], tmp_path: Path
) -> None:
    path, h, clock = filled
    await _retention_across_tiers(path, h, clock, (tmp_path / "arch").as_uri())


async def test_retention_across_tiers_s3(
    filled: tuple[str, History, Clock],
    moto_server: str,  # noqa: F811
) -> None:
    path, h, clock = filled
    url = f"s3://imgw/cold?endpoint={moto_server}&region=us-east-1"
    await _retention_across_tiers(path, h, clock, url)


async def test_retention_of_the_hot_store_only(filled: tuple[str, History, Clock]) -> None:
    path, h, clock = filled
    original = sorted(hot_rows(path))
    clock.ms = T0 + 20 * DAY
    cutoff = T0 + 4 * DAY
    report = await expire(path, clock, clock.ms - cutoff, rate=10.0 * 1000)
    assert report.expired.rows == sum(r[2] <= cutoff for r in original)
    visible, expired = tiers(index_rows(path), hot_rows(path))
    check_after(original, visible, expired, cutoff)
    check_pages(await pages_of(path, h, clock), cutoff)


async def cli(argv: list[str]) -> int:
    return await asyncio.to_thread(imgw, ["archive", *argv])


async def test_the_command(
    filled: tuple[str, History, Clock], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--retention` alone (the messages of `fill` are from 2025: all past 300 days)."""
    path, _h, _clock = filled
    store = ["--store", f"sqlite:///{path}"]
    assert await cli(["run", *store, "--retention", "1h"]) == 2
    assert "at least 48h" in capsys.readouterr().err
    assert await cli(["run", *store]) == 2
    assert await cli(["run", *store, "--retention", "300d"]) == 0
    out = capsys.readouterr().out
    assert "deleted 363 rows past retention (363 hot) of 3 conversations" in out
    assert "archived" not in out
    assert hot_rows(path) == []
    assert await cli(["status", *store]) == 0
    assert "archive: 0 rows, 0 bytes in 0 files of 0 conversations" in capsys.readouterr().out
