"""A shard server that dies, and its replica promoted in its place (`imgw db promote`),
on real semi-synchronous replication (scripts/mariadb-replica): the primary is killed
with SIGKILL under traffic, the replica promoted, and a history check shows that no
acked message was lost, that no seq was handed out twice, and how long the sends of the
dead server's conversations went unanswered."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import os
import secrets
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.cli import main
from storage.errors import StoreUnavailable
from storage.models import AppendStatus, NewMessage
from storage.mysql import MySQLSettings, MySQLStore, migrate
from tests.support.services import (
    MYSQL2_PORT,
    MYSQL_PORT,
    REPLICA_PORT,
    REPLICA_PRIMARY_PORT,
    REPLICA_SCRIPT,
    drop_mysql,
    fresh_mysql,
    mysql_rows,
    replicated_mysql,
)

pytestmark = pytest.mark.slow


@dataclass
class History:
    """What one conversation's sender saw: each client_msg_id acked at a seq, and when."""

    acked: dict[str, int] = field(default_factory=dict)
    acked_at: list[float] = field(default_factory=list)
    refused: int = 0  # sends answered unavailable (retried with the same client_msg_id)

    def longest_gap_s(self) -> float:
        times = sorted(self.acked_at)
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def primary_pid() -> int:
    return int(Path(f"/tmp/imgw-mariadb-{REPLICA_PRIMARY_PORT}/mariadbd.pid").read_text())


def promote(meta_url: str, to_url: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["db", "promote", "--store", meta_url, "--server", "1", "--to", to_url])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
async def split() -> AsyncIterator[tuple[str, str]]:
    """A map of two servers: shard 0 in the metadata database (3306), shard 1 on the
    replicated primary; the metadata URL and the database name. Both replica servers are
    made anew afterwards (the test promotes one and kills the other)."""
    replicated_mysql()
    name = f"imgw_t_{secrets.token_hex(6)}"
    meta_url = f"mysql://root@127.0.0.1:{MYSQL_PORT}/{name}?shards=2&timeout=2"
    servers = [
        f"mysql://root@127.0.0.1:{MYSQL_PORT}/{name}",
        f"mysql://root@127.0.0.1:{REPLICA_PRIMARY_PORT}/{name}",
    ]
    await migrate(MySQLSettings.from_url(meta_url), servers)
    try:
        yield meta_url, name
    finally:
        await asyncio.to_thread(
            subprocess.run, [str(REPLICA_SCRIPT), "reset"], capture_output=True, timeout=120
        )
        await mysql_rows(MYSQL_PORT, None, f"DROP DATABASE IF EXISTS {name}")


async def test_a_dead_shard_server_is_replaced_by_its_promoted_replica(
    split: tuple[str, str],
) -> None:
    meta_url, name = split
    store = MySQLStore(MySQLSettings.from_url(meta_url))
    await store.start()
    histories: dict[int, History] = {}
    stop = asyncio.Event()

    async def send(conv: int) -> None:
        h = histories[conv] = History()
        k = 0
        while not stop.is_set():
            cmid = f"c{conv}-{k}"  # (sender, client_msg_id) is unique across conversations
            while not stop.is_set():  # a client retries with the same client_msg_id
                try:
                    (r,) = await store.append([NewMessage(conv, 1, cmid, 1, cmid.encode())])
                except StoreUnavailable:
                    h.refused += 1
                    await asyncio.sleep(0.1)
                    continue
                assert r.status in (AppendStatus.STORED, AppendStatus.DUPLICATE), r
                assert r.message is not None
                h.acked[cmid] = r.message.seq
                h.acked_at.append(time.monotonic())
                break
            k += 1
            await asyncio.sleep(0.02)

    try:
        convs = [await store.open_p2p(1, 2 + k) for k in range(4)]
        dying = [c for c in convs if c % 2 == 1]  # shard 1: the replicated primary
        assert dying and len(dying) < len(convs)
        tasks = [asyncio.create_task(send(c)) for c in convs]
        await asyncio.sleep(1.5)
        killed_at = time.monotonic()
        os.kill(primary_pid(), signal.SIGKILL)
        await asyncio.sleep(1.0)  # the sends of shard 1 are answered unavailable
        rc, out, err = await asyncio.to_thread(
            promote, meta_url, f"mysql://root@127.0.0.1:{REPLICA_PORT}/{name}"
        )
        assert rc == 0, err
        assert "server 1" in out and "replaced by" in out
        promoted_at = time.monotonic()
        await asyncio.sleep(3.0)
        stop.set()
        await asyncio.gather(*tasks)

        # The history: every acked message is there, once, at its acked seq; the seqs of
        # each conversation are 1..n, none handed out twice.
        for conv, h in histories.items():
            got, more = await store.read_after(conv, 0, 10_000, min_seq=0, max_seq=None)
            assert not more
            stored = {m.client_msg_id: m.seq for m in got}
            assert stored == h.acked, f"conversation {conv}: acked and stored differ"
            assert sorted(stored.values()) == list(range(1, len(stored) + 1))
        for conv in dying:
            after = [t for t in histories[conv].acked_at if t > promoted_at]
            assert after, "no send acked on the promoted replica"
        gaps = {c: round(h.longest_gap_s(), 2) for c, h in histories.items()}
        print(
            f"kill to promoted {promoted_at - killed_at:.2f} s; longest gap between acks, "
            f"by conversation (odd: the dead server's): {gaps}; refused sends: "
            f"{ {c: h.refused for c, h in histories.items()} }"
        )
        assert all(gaps[c] < 15 for c in dying)
        rows = await mysql_rows(
            MYSQL_PORT, name, "SELECT DISTINCT url FROM im_shard_map ORDER BY url"
        )
        assert (f"mysql://root@127.0.0.1:{REPLICA_PORT}/{name}",) in rows
    finally:
        stop.set()
        await store.close()


async def test_promote_refuses_what_it_cannot_promote() -> None:
    url = await fresh_mysql(2, sharded=True)  # server 0: 3306 (metadata), 1: the second
    name = MySQLSettings.from_url(url).database
    try:
        for server, to, says in [
            ("5", f"mysql://root@127.0.0.1:{REPLICA_PORT}/{name}", "no server 5"),
            ("0", f"mysql://root@127.0.0.1:{REPLICA_PORT}/{name}", "metadata database"),
            ("1", f"mysql://root@127.0.0.1:{MYSQL2_PORT}/{name}", "is server 1 itself"),
        ]:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = await asyncio.to_thread(
                    main, ["db", "promote", "--store", url, "--server", server, "--to", to]
                )
            assert rc == 1 and says in err.getvalue(), err.getvalue()
        rows = await mysql_rows(MYSQL_PORT, name, "SELECT DISTINCT url FROM im_shard_map")
        assert len(rows) == 2  # the map unchanged
    finally:
        await drop_mysql(url)
