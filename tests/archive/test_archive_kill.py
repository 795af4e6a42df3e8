"""`imgw archive run` killed (SIGKILL) at random points loses and duplicates nothing: after
every kill, the hot rows and the archived rows (those the index names) are exactly the
rows there were, each once, and the archive is one contiguous run of seqs from 1 per
conversation; a last run, left alone, archives the rest."""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from protocol.ops import MsgType
from storage.archive import objects
from storage.embedded import EmbeddedStore
from storage.models import NewMessage
from storage.mysql import MySQLSettings, MySQLStore
from tests.archive.common import mysql_tables, run_killed_at
from tests.support.services import drop_mysql, fresh_mysql

CONVS = 30
PER_CONV = 100
KILLS = 8
REPO = Path(__file__).resolve().parents[2]

Row = tuple[object, ...]


async def fill(store: EmbeddedStore | MySQLStore) -> None:
    convs = [await store.open_p2p(1, 100 + i) for i in range(CONVS)]
    for k in range(PER_CONV):
        batch = [NewMessage(c, 1 + k % 2 * (99 + i), f"k{i}-{k}", MsgType.TEXT, b"x" * (k % 40))
                 for i, c in enumerate(convs)]  # fmt: skip
        await store.append(batch)


def _cold(index: list[tuple[int, int, int, str, str]]) -> list[Row]:
    cold: list[Row] = []
    last: dict[int, int] = {}
    for conv, lo, hi, root, key in index:
        assert lo == last.get(conv, 0) + 1, f"conv {conv}: archive not contiguous at {lo}"
        last[conv] = hi
        got = objects.read_file(objects.open_location(root), key)
        assert [a.msg.seq for a in got] == list(range(lo, hi + 1))
        cold += [(a.msg.conv_id, a.msg.seq, a.msg.msg_id, a.msg.content) for a in got]
    return cold


def sqlite_tiers(path: str) -> tuple[list[Row], list[Row]]:
    conn = sqlite3.connect(path, timeout=10)
    try:
        hot = conn.execute("SELECT conv_id, seq, id, content FROM im_message").fetchall()
        index = conn.execute(
            "SELECT conv_id, seq_lo, seq_hi, root, file_key FROM im_archive "
            "ORDER BY conv_id, seq_lo"
        ).fetchall()
    finally:
        conn.close()
    return [tuple(r) for r in hot], _cold(index)


async def mysql_tiers(url: str) -> tuple[list[Row], list[Row]]:
    hot, index = await mysql_tables(url)
    return [(r[0], r[1], r[2], r[5]) for r in hot], _cold([r[:5] for r in index])


@pytest.mark.parametrize("kind", ["embedded", "mysql", "mysql-two-servers"])
async def test_kill_9_at_random_points_loses_and_duplicates_nothing(
    kind: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("ARCHIVE_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    to = (tmp_path / "arch").as_uri()
    mysql_url = ""
    if kind == "embedded":
        store_url = f"sqlite:///{tmp_path / 'imgw.db'}"
        store: EmbeddedStore | MySQLStore = EmbeddedStore(str(tmp_path / "imgw.db"))
    else:
        mysql_url = await fresh_mysql(shards=2, sharded=kind == "mysql-two-servers")
        store_url = mysql_url
        store = MySQLStore(MySQLSettings.from_url(mysql_url))
    try:
        await store.start()
        try:
            await fill(store)
        finally:
            await store.close()

        async def tiers() -> tuple[list[Row], list[Row]]:
            if kind == "embedded":
                return sqlite_tiers(str(tmp_path / "imgw.db"))
            return await mysql_tiers(mysql_url)

        hot, cold = await tiers()
        original = sorted(hot)
        assert len(original) == CONVS * PER_CONV and cold == []

        argv = [sys.executable, "-m", "gateway.cli", "archive", "run", "--store", store_url,
                "--older-than", "0s", "--to", to, "--rate", "1000"]  # fmt: skip
        killed = 0
        progress = []
        for _ in range(KILLS):
            rc, was_killed = await run_killed_at(argv, REPO, rng.uniform(0.3, 3.0))
            killed += was_killed
            hot, cold = await tiers()
            assert len(cold) == len(set(cold)), f"seed {seed}: archived twice"
            assert not set(hot) & set(cold), f"seed {seed}: both hot and archived"
            assert sorted(hot + cold) == original, f"seed {seed}: rows lost"
            progress.append(len(cold))
            print(f"seed {seed}: run {len(progress)} rc {rc}: {len(cold)} archived")
            if not hot:
                break
        assert killed >= 1, f"seed {seed}: every run finished before its kill"
        # left alone, a run archives the rest
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        _, err_b = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err_b.decode()
        hot, cold = await tiers()
        assert hot == [] and sorted(cold) == original, f"seed {seed}"
        assert time.monotonic() - started < 120
    finally:
        if mysql_url:
            await drop_mysql(mysql_url)
