"""`imgw archive run --retention` killed (SIGKILL) at random points deletes nothing that
is not past retention and brings nothing back: after every kill, each conversation's
visible rows (hot, and in indexed files) are exactly its rows above its expired top,
each once, and every row at or below it was past retention; a last run, left alone,
finishes. Half the conversations have archive files that the cutoff cuts through (they
are rewritten), the other half only hot rows (deleted in batches)."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from protocol.ops import MsgType
from storage.archive.index_mysql import MySQLIndex
from storage.archive.index_sqlite import SqliteIndex
from storage.archive.run import archive_run
from storage.embedded import EmbeddedStore
from storage.models import NewMessage
from storage.mysql import MySQLSettings, MySQLStore
from tests.archive.common import DAY, mysql_tables, run_killed_at
from tests.archive.test_retention import Row, check_after, hot_rows, index_rows, tiers
from tests.support.services import drop_mysql, fresh_mysql

CONVS = 20
PER_CONV = 100
KILLS = 8
RETENTION = 5 * DAY
REPO = Path(__file__).resolve().parents[2]


class _FirstHalf:
    """An archive index that lists only the first half of the conversations."""

    def __init__(self, index: Any, convs: list[int]) -> None:
        self._index = index
        self._convs = convs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)

    async def conversations(self, after: int, limit: int) -> list[int]:
        return [c for c in self._convs[: len(self._convs) // 2] if c > after][:limit]


async def fill(store: EmbeddedStore | MySQLStore, clock: list[int]) -> list[int]:
    """PER_CONV messages in each conversation, one every 2.4 h over the last 10 days (an
    hour off the retention boundary)."""
    convs = [await store.open_p2p(1, 100 + i) for i in range(CONVS)]
    start = clock[0] - 10 * DAY + 3_600_000
    for k in range(PER_CONV):
        clock[0] = start + k * (10 * DAY // PER_CONV)
        batch = [NewMessage(c, 1 + k % 2 * (99 + i), f"k{i}-{k}", MsgType.TEXT, b"x" * (k % 40))
                 for i, c in enumerate(convs)]  # fmt: skip
        await store.append(batch)
    return convs


@pytest.mark.parametrize("kind", ["embedded", "mysql", "mysql-two-servers"])
async def test_retention_killed_at_random_points(kind: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("ARCHIVE_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    to = (tmp_path / "arch").as_uri()
    now = int(time.time() * 1000)
    clock = [now]
    mysql_url = ""
    index: Any
    if kind == "embedded":
        path = str(tmp_path / "imgw.db")
        store_url = f"sqlite:///{path}"
        store: EmbeddedStore | MySQLStore = EmbeddedStore(path, clock=lambda: clock[0])
        index = SqliteIndex(path, clock=lambda: now)
    else:
        mysql_url = store_url = await fresh_mysql(shards=2, sharded=kind == "mysql-two-servers")
        store = MySQLStore(MySQLSettings.from_url(mysql_url), clock=lambda: clock[0])
        index = MySQLIndex(MySQLSettings.from_url(mysql_url), clock=lambda: now)
    try:
        await store.start()
        try:
            convs = await fill(store, clock)
        finally:
            await store.close()
        await index.open()  # the first half archived up to 3 days ago
        try:
            report = await archive_run(_FirstHalf(index, convs), to, older_than_ms=3 * DAY)
            assert report.conversations == CONVS // 2 and not report.failures
        finally:
            await index.close()

        async def visible() -> tuple[list[Row], dict[int, int]]:
            if kind == "embedded":
                return tiers(index_rows(path), hot_rows(path))
            hot, idx = await mysql_tables(mysql_url)
            return tiers(list(idx), [(int(r[0]), int(r[1]), int(r[6])) for r in hot])

        original, expired = await visible()
        assert len(original) == CONVS * PER_CONV and not expired
        cutoff = now - RETENTION  # rows up to it are past retention at every run
        due = sum(r[2] <= cutoff for r in original)
        argv = [sys.executable, "-m", "gateway.cli", "archive", "run", "--store", store_url,
                "--retention", "5d", "--rate", "400"]  # fmt: skip
        killed = 0
        for n in range(KILLS):
            rc, was_killed = await run_killed_at(argv, REPO, rng.uniform(0.3, 2.5))
            killed += was_killed
            rows, expired = await visible()
            # a row past retention later than the fill's clock: the run's own now
            check_after(original, rows, expired, int(time.time() * 1000) - RETENTION)
            gone = len(original) - len(rows)
            print(f"seed {seed}: run {n + 1} rc {rc}: {gone} of {due} deleted")
            if gone == due:
                break
        assert killed >= 1, f"seed {seed}: every run finished before its kill"
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        _, err_b = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err_b.decode()
        rows, expired = await visible()
        assert rows == sorted(r for r in original if r[2] > cutoff), f"seed {seed}"
    finally:
        if mysql_url:
            await drop_mysql(mysql_url)
