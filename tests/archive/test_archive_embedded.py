"""`imgw archive` on the embedded store: the move, the pages across the boundary, the
retried sends, failures that keep the hot rows, file:// and s3:// (moto's server)."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.cli import archive as archive_cli
from gateway.cli import main as imgw
from protocol.ops import MsgType
from storage.archive import objects
from storage.archive.index_sqlite import SqliteIndex
from storage.archive.run import BATCH_MAX, archive_run, batch_size
from storage.embedded import EmbeddedStore
from storage.embedded.schema import SCHEMA_VERSION
from storage.errors import StoreUnavailable
from storage.models import AppendStatus, NewMessage, RecallStatus
from tests.archive.common import DAY, T0, Clock, History, all_pages, diff_pages, fill
from tests.support.archive import file_exists
from tests.support.s3 import moto_s3


@pytest.fixture
async def filled(tmp_path: Path) -> AsyncIterator[tuple[str, History, Clock]]:
    path = str(tmp_path / "imgw.db")
    clock = Clock()
    store = EmbeddedStore(path, clock=clock)
    await store.start()
    try:
        h = await fill(store, clock)
    finally:
        await store.close()
    yield path, h, clock


async def run(path: str, url: str, clock: Clock, older_than_ms: int, **kw: object) -> object:
    index = SqliteIndex(path, clock=clock)
    await index.open()
    try:
        return await archive_run(index, url, older_than_ms=older_than_ms, **kw)  # type: ignore[arg-type]
    finally:
        await index.close()


def db_rows(path: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT conv_id, seq, id, sender_uid, msg_type, content, send_ms, client_msg_id, "
            "recall_seq FROM im_message ORDER BY conv_id, seq"
        ).fetchall()
    finally:
        conn.close()


def index_rows(path: str) -> list[tuple[int, int, int, str, str, int]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT conv_id, seq_lo, seq_hi, root, file_key, n_rows FROM im_archive "
            "ORDER BY conv_id, seq_lo"
        ).fetchall()
    finally:
        conn.close()


def archived_rows(path: str) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for _conv, lo, hi, root, key, n in index_rows(path):
        rows = objects.read_file(objects.open_location(root), key)
        assert [r.msg.seq for r in rows] == list(range(lo, hi + 1)) and len(rows) == n
        out += [
            (m.conv_id, m.seq, m.msg_id, m.sender_uid, m.msg_type, m.content, m.server_ms,
             m.client_msg_id, r.recall_seq)
            for r in rows
            for m in [r.msg]
        ]  # fmt: skip
    return out


async def pages_of(path: str, h: History, clock: Clock) -> dict:  # type: ignore[type-arg]
    store = EmbeddedStore(path, clock=clock)
    await store.start()
    try:
        return await all_pages(store, h)
    finally:
        await store.close()


async def test_archive_moves_old_messages_and_pages_read_across(
    filled: tuple[str, History, Clock], tmp_path: Path
) -> None:
    path, h, clock = filled
    before_rows = db_rows(path)
    before_pages = await pages_of(path, h, clock)
    url = (tmp_path / "arch").as_uri()
    clock.ms = T0 + 20 * DAY
    report = await run(path, url, clock, 15 * DAY)  # messages of days 0..4
    assert report.rows > 0 and not report.failures  # type: ignore[attr-defined]
    hot = db_rows(path)
    cold = archived_rows(path)
    assert sorted(hot + cold) == before_rows  # nothing lost, nothing twice
    assert all(r[6] <= T0 + 5 * DAY for r in cold) and all(r[6] > T0 + 5 * DAY for r in hot)
    # one contiguous run from seq 1 per conversation, in the prescribed layout
    for conv in h.convs:
        ranges = [(lo, hi) for c, lo, hi, *_ in index_rows(path) if c == conv]
        assert ranges and ranges[0][0] == 1
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
        for lo, hi in ranges:
            assert (tmp_path / "arch" / f"conv_id={conv}" / f"{lo}-{hi}.parquet").is_file()
    # the recalled message is archived as recalled
    conv, seq = h.recalled
    (rec,) = [r for r in cold if r[0] == conv and r[1] == seq]
    assert rec[4] == MsgType.RECALL and rec[5] == b"" and rec[8] > seq
    # every PULL and HISTORY page is what it was
    assert diff_pages(before_pages, await pages_of(path, h, clock)) == []

    # everything else too; a second run has nothing left to do
    report = await run(path, url, clock, 0)
    assert db_rows(path) == []
    assert sorted(archived_rows(path)) == before_rows
    assert diff_pages(before_pages, await pages_of(path, h, clock)) == []
    report = await run(path, url, clock, 0)
    assert report.rows == 0  # type: ignore[attr-defined]


async def test_seqs_go_on_and_archived_messages_cannot_be_recalled(
    filled: tuple[str, History, Clock], tmp_path: Path
) -> None:
    path, h, clock = filled
    store = EmbeddedStore(path, clock=clock)
    await store.start()
    try:
        conv = h.convs[0]
        msgs, _ = await store.read_before(conv, 0, 1, min_seq=0, max_seq=None)
        top = msgs[-1]
        # a fresh send, archived at once (--older-than 0s) with everything else
        clock.ms += 1000
        (sent,) = await store.append([NewMessage(conv, 1, "fresh", MsgType.TEXT, b"hi")])
        assert sent.message is not None and sent.message.seq == top.seq + 1
        report = await run(path, (tmp_path / "a").as_uri(), clock, 0)
        assert report.rows > 0  # type: ignore[attr-defined]
        # the conversation's seq counter is untouched: the next send follows on
        (nxt,) = await store.append([NewMessage(conv, 2, "next", MsgType.TEXT, b"yo")])
        assert nxt.message is not None and nxt.message.seq == top.seq + 2
        # a retried SEND of the archived message still gets its original ack...
        (again,) = await store.append([NewMessage(conv, 1, "fresh", MsgType.TEXT, b"hi")])
        assert again.status is AppendStatus.DUPLICATE and again.message == sent.message
        (other,) = await store.append([NewMessage(conv, 1, "fresh", MsgType.TEXT, b"no")])
        assert other.status is AppendStatus.CONFLICT
        rec = await store.find_sent(1, "fresh")
        assert rec is not None and rec.seq == sent.message.seq
        # ... within the idempotency window only: housekeeping drops it after 48 h
        clock.ms += 49 * 3600 * 1000
        await store.maintain()
        assert await store.find_sent(1, "fresh") is None
        # the archived message is not there to recall
        got = await store.recall(conv, sent.message.seq, 1, window_ms=10**12, min_seq=0)
        assert got.status is RecallStatus.NO_SUCH_MESSAGE
        # and its pages read from the archive and the hot store together
        msgs, more = await store.read_after(conv, top.seq - 1, 10, min_seq=0, max_seq=None)
        assert [m.seq for m in msgs] == [top.seq, top.seq + 1, top.seq + 2] and not more
        assert msgs[1] == sent.message
    finally:
        await store.close()


async def test_batches_are_bounded_and_rate_limited(
    filled: tuple[str, History, Clock], tmp_path: Path
) -> None:
    path, _h, clock = filled
    assert batch_size(None) == BATCH_MAX == 5000 and batch_size(50.5) == 50
    clock.ms = T0 + 20 * DAY
    started = time.monotonic()
    report = await run(path, (tmp_path / "a").as_uri(), clock, 0, rate=100)
    took = time.monotonic() - started
    rows = report.rows  # type: ignore[attr-defined]
    assert rows > 300
    assert took >= (rows - 100) / 100 * 0.9  # the first batch goes at once
    assert max(n for *_, n in index_rows(path)) <= 100


async def test_a_failed_write_keeps_the_hot_rows_and_the_next_run_retries(
    filled: tuple[str, History, Clock], tmp_path: Path
) -> None:
    path, h, clock = filled
    before = db_rows(path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the archive's directory should be")
    report = await run(path, blocker.as_uri(), clock, 0)
    assert report.rows == 0 and len(report.failures) == len(h.convs)  # type: ignore[attr-defined]
    assert db_rows(path) == before and index_rows(path) == []
    # a file left by an interrupted run (never indexed) is ignored, then replaced
    url = (tmp_path / "arch").as_uri()
    loc = objects.open_location(url)
    junk = tmp_path / "arch" / f"conv_id={h.convs[0]}"
    junk.mkdir(parents=True)
    (junk / "1-99.parquet").write_bytes(b"not parquet")
    pages = await pages_of(path, h, clock)
    report = await run(path, url, clock, 0)
    assert not report.failures  # type: ignore[attr-defined]
    assert sorted(archived_rows(path)) == before
    assert diff_pages(pages, await pages_of(path, h, clock)) == []
    assert file_exists(loc, f"conv_id={h.convs[0]}/1-99.parquet")  # never read


async def test_read_back_mismatch_keeps_the_hot_rows(
    filled: tuple[str, History, Clock], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _h, clock = filled
    before = db_rows(path)
    real = objects.read_file

    def short(loc: objects.Location, key: str) -> list[objects.ArchivedMessage]:
        return real(loc, key)[:-1]  # as if the store had lost a row

    monkeypatch.setattr(objects, "read_file", short)
    report = await run(path, (tmp_path / "a").as_uri(), clock, 0)
    assert report.rows == 0 and report.failures  # type: ignore[attr-defined]
    assert "read back" in report.failures[0]  # type: ignore[attr-defined]
    assert db_rows(path) == before and index_rows(path) == []


def test_archive_urls() -> None:
    assert objects.open_location("file:///tmp/x").base == "/tmp/x"
    for bad in ("file://host/x", "file:///x?opt=1", "s3://", "s3://k:s@b/p", "gs://b/p", "x"):
        with pytest.raises(objects.ArchiveUrlError):
            objects.open_location(bad)
    assert objects.file_key(7, 1, 5000) == "conv_id=7/1-5000.parquet"


async def test_cli_run_and_status(filled: tuple[str, History, Clock], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path, h, _clock = filled
    data_dir = Path(path).parent
    assert await cli(["status", "--data-dir", str(data_dir), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    total = st["hot"]["rows"]
    assert total > 300 and st["archive"]["rows"] == 0 and st["last_run"] is None
    assert st["hot"]["oldest_ms"] == T0 - 0 or st["hot"]["oldest_ms"] <= T0
    assert await cli(["run", "--data-dir", str(data_dir), "--older-than", "0s"]) == 0
    assert "archived" in capsys.readouterr().out
    assert (data_dir / "archive" / f"conv_id={h.convs[0]}").is_dir()  # the default --to
    assert await cli(["status", "--data-dir", str(data_dir), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["hot"] == {"rows": 0, "bytes": st["hot"]["bytes"], "oldest_ms": None}
    assert st["archive"]["rows"] == total and st["archive"]["conversations"] == 3
    assert st["archive"]["bytes"] > 0 and st["archive"]["files"] >= 3
    assert st["last_run"]["rows"] == str(total) and st["last_run"]["failures"] == "0"
    assert await cli(["status", "--data-dir", str(data_dir)]) == 0
    assert "last run:" in capsys.readouterr().out
    assert archive_cli.parse_age("180d") == 180 * DAY
    assert await cli(["run", "--store", "mysql://r@h/db", "--older-than", "1d"]) == 2
    assert "--to is required" in capsys.readouterr().err


async def cli(argv: list[str]) -> int:
    """`imgw archive ARGV` (its own event loop: in a thread)."""
    return await asyncio.to_thread(imgw, ["archive", *argv])


# -- S3: moto's standalone server ------------------------------------------------------------


@pytest.fixture
def moto_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An S3-compatible server (moto) with a bucket `imgw`; its endpoint URL."""
    with moto_s3(monkeypatch) as endpoint:
        yield endpoint


async def test_archive_to_s3(
    filled: tuple[str, History, Clock], tmp_path: Path, moto_server: str
) -> None:
    import boto3

    path, h, clock = filled
    before = db_rows(path)
    pages = await pages_of(path, h, clock)
    url = f"s3://imgw/cold/msgs?endpoint={moto_server}&region=us-east-1"
    clock.ms = T0 + 20 * DAY
    report = await run(path, url, clock, 15 * DAY)
    assert report.rows > 0 and not report.failures  # type: ignore[attr-defined]
    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    listed = s3.list_objects_v2(Bucket="imgw", Prefix="cold/msgs/")
    keys = sorted(o["Key"] for o in listed.get("Contents", []))
    assert keys == sorted(f"cold/msgs/{k}" for *_, k, _n in index_rows(path))
    assert sorted(db_rows(path) + archived_rows(path)) == before
    assert diff_pages(pages, await pages_of(path, h, clock)) == []


async def test_an_unreadable_archive_refuses_the_page(
    filled: tuple[str, History, Clock], tmp_path: Path
) -> None:
    """A page that needs a file the archive cannot give is refused (StoreUnavailable:
    the client is told `unavailable`), never answered short."""
    path, h, clock = filled
    await run(path, (tmp_path / "arch").as_uri(), clock, 0)
    conv = h.convs[0]
    _, lo, hi, _root, key, _n = index_rows(path)[0]
    (tmp_path / "arch" / key).unlink()
    store = EmbeddedStore(path, clock=clock)
    await store.start()
    try:
        with pytest.raises(StoreUnavailable, match="archive"):
            await store.read_after(conv, lo - 1, 10, min_seq=0, max_seq=None)
        with pytest.raises(StoreUnavailable, match="archive"):
            await store.read_before(conv, hi + 1, 10, min_seq=0, max_seq=None)
    finally:
        await store.close()


async def test_an_embedded_store_of_schema_1_gets_the_archive_tables(
    filled: tuple[str, History, Clock],
) -> None:
    path, _h, clock = filled
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        "DROP TABLE im_archive; DROP TABLE im_archive_sent; DROP TABLE im_meta; "
        "PRAGMA user_version=1;"
    )
    conn.close()
    store = EmbeddedStore(path, clock=clock)
    await store.start()
    await store.close()
    conn = sqlite3.connect(path)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"im_archive", "im_archive_sent", "im_meta"} <= names
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


async def test_a_gap_below_the_hot_rows_is_reported_not_archived_over(
    filled: tuple[str, History, Clock], tmp_path: Path
) -> None:
    path, h, clock = filled
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DELETE FROM im_message WHERE conv_id=? AND seq=1", (h.convs[0],))
    conn.close()
    report = await run(path, (tmp_path / "a").as_uri(), clock, 0)
    assert len(report.failures) == 1 and "gap" in report.failures[0]  # type: ignore[attr-defined]
    assert [c for c, *_ in index_rows(path)].count(h.convs[0]) == 0
    assert {c for c, *_ in index_rows(path)} == set(h.convs[1:])
