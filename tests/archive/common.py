"""Helpers of the archive tests: a store filled with history, and every page of it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.ops import MsgType
from storage.models import AppendStatus, NewMessage, RecallStatus, StoredMessage

DAY = 86_400_000
T0 = 1_750_000_000_000  # the first message's time (snowflake ids count from 2024)


@dataclass
class Clock:
    ms: int = T0

    def __call__(self) -> int:
        return self.ms


@dataclass
class History:
    """What `fill` wrote: conversations, their members and the seq of each day's first
    message."""

    convs: list[int] = field(default_factory=list)
    group: int = 0
    late_joiner: int = 0
    late_joined_seq: int = 0
    recalled: tuple[int, int] = (0, 0)  # (conv, seq)


async def fill(store: Any, clock: Clock, *, days: int = 10, per_day: int = 12) -> History:
    """Two p2p conversations and a group, `per_day` messages a day in each for `days`
    days (one clock day apart), a member joining the group half way, a recall."""
    h = History()
    p1 = await store.open_p2p(1, 2)
    p2 = await store.open_p2p(1, 3)
    group, _ = await store.create_group(1, "g", [2, 3])
    h.convs = [p1, p2, group]
    h.group = group
    n = 0
    for day in range(days):
        for i in range(per_day):
            clock.ms = T0 + day * DAY + i * 1000
            batch = []
            for conv, sender in ((p1, 1 + i % 2), (p2, 1 if i % 3 else 3), (group, 1 + i % 3)):
                n += 1
                batch.append(NewMessage(conv, sender, f"m{n}", MsgType.TEXT, f"c{n}".encode()))
            res = await store.append(batch)
            assert {r.status for r in res} == {AppendStatus.STORED}
            if day == 1 and i == 0:
                stored = res[0].message
                assert stored is not None
                got = await store.recall(p1, stored.seq, stored.sender_uid, window_ms=10_000,
                                         min_seq=0)  # fmt: skip
                assert got.status is RecallStatus.RECALLED
                h.recalled = (p1, stored.seq)
        if day == days // 2:
            change = await store.change_members(group, 1, [4], [])
            h.late_joiner = 4
            h.late_joined_seq = change.messages[0].seq
    return h


async def max_seq_of(store: Any, conv: int) -> int:
    msgs, _ = await store.read_before(conv, 0, 1, min_seq=0, max_seq=None)
    return msgs[-1].seq if msgs else 0


Query = tuple[Any, ...]


async def all_pages(store: Any, h: History) -> dict[Query, tuple[list[StoredMessage], bool]]:
    """PULL and HISTORY pages of every conversation over a grid of cursors, limits and
    membership bounds."""
    out: dict[Query, tuple[list[StoredMessage], bool]] = {}
    for conv in h.convs:
        top = await max_seq_of(store, conv)
        bounds: list[tuple[int, int | None]] = [(0, None), (1, top - 5)]
        if conv == h.group:
            bounds.append((h.late_joined_seq, None))  # what the late joiner may see
            bounds.append((0, h.late_joined_seq - 1))  # a member who left then
        for min_seq, max_seq in bounds:
            for limit in (1, 7, 50, 1000):
                for after in sorted({0, 1, 13, top // 2, top - 3, top, top + 4}):
                    q = ("after", conv, after, limit, min_seq, max_seq)
                    out[q] = await store.read_after(
                        conv, after, limit, min_seq=min_seq, max_seq=max_seq
                    )
                for before in sorted({0, 1, 2, 14, top // 2, top - 2, top + 1, top + 9}):
                    q = ("before", conv, before, limit, min_seq, max_seq)
                    out[q] = await store.read_before(
                        conv, before, limit, min_seq=min_seq, max_seq=max_seq
                    )
    return out


def diff_pages(
    want: dict[Query, tuple[list[StoredMessage], bool]],
    got: dict[Query, tuple[list[StoredMessage], bool]],
) -> list[str]:
    bad = []
    for q, page in want.items():
        if got[q] != page:
            w = ([m.seq for m in page[0]], page[1])
            g = ([m.seq for m in got[q][0]], got[q][1])
            bad.append(f"{q}: want {w}, got {g}")
    return bad


async def mysql_tables(url: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every hot message row (conv_id, seq, id, sender, type, content, ms, cmid, status)
    and every archive index row (conv_id, seq_lo, seq_hi, root, key, n_rows) of a MySQL
    store, from each server of its shard map (only the shard tables a server holds)."""
    import re

    import aiomysql

    from storage.mysql import MySQLSettings
    from storage.mysql.shardmap import same_place, server_settings

    meta = MySQLSettings.from_url(url)

    async def connect(s: MySQLSettings) -> Any:
        return await aiomysql.connect(
            host=s.host, port=s.port, user=s.user, password=s.password, db=s.database,
            autocommit=True,
        )  # fmt: skip

    conn = await connect(meta)
    try:
        async with conn.cursor() as cur:
            await cur.execute("SELECT lo, hi, url FROM im_shard_map ORDER BY lo")
            ranges = list(await cur.fetchall())
    finally:
        conn.close()
    servers: list[tuple[MySQLSettings, set[int]]] = []
    if not ranges:
        servers.append((meta, set(range(meta.shards))))
    for lo, hi, server in ranges:
        s = server_settings(meta, server)
        for known, shards in servers:
            if same_place(known, s):
                shards.update(range(lo, hi + 1))
                break
        else:
            servers.append((s, set(range(lo, hi + 1))))
    hot: list[tuple[Any, ...]] = []
    index: list[tuple[Any, ...]] = []
    for s, shards in servers:
        conn = await connect(s)
        try:
            async with conn.cursor() as cur:
                await cur.execute("SHOW TABLES")
                tables = [
                    t
                    for (t,) in await cur.fetchall()
                    if re.fullmatch(r"im_message_\d{4}", t) and int(t[-4:]) in shards
                ]
                for table in tables:
                    await cur.execute(
                        "SELECT conv_id, seq, id, sender_uid, msg_type, content, send_ms, "
                        f"COALESCE(client_msg_id, ''), status FROM {table}"
                    )
                    hot += [(*r[:5], bytes(r[5]), r[6], bytes(r[7]).decode(), r[8])
                            for r in await cur.fetchall()]  # fmt: skip
                await cur.execute(
                    "SELECT conv_id, seq_lo, seq_hi, root, file_key, n_rows FROM im_archive"
                )
                index += [tuple(r) for r in await cur.fetchall()]
        finally:
            conn.close()
    return sorted(hot), sorted(index)


# asyncio reports 255 when its child watcher finds the child already reaped ("Unknown
# child process pid ..., will report returncode 255"): the exit status is lost, not an
# error of the run (which writes its reason to stderr and exits 1). Seen once in CI.
LOST_STATUS = 255


def ended_cleanly(rc: int, err: str) -> bool:
    """The run finished (0), was killed (SIGKILL), or its status was lost with nothing
    on stderr; the data checks after each run say whether anything went wrong."""
    return rc in (0, -9) or (rc == LOST_STATUS and not err.strip())


async def run_killed_at(argv: list[str], cwd: Path, after_s: float) -> tuple[int, bool]:
    """Run `argv` and SIGKILL it after `after_s` unless it finished first: (exit status,
    killed). Fails the test if the run ended any other way (its stderr says why)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    killed = False
    try:
        await asyncio.wait_for(proc.wait(), after_s)
    except TimeoutError:
        proc.send_signal(signal.SIGKILL)
        killed = True
    finally:
        if proc.returncode is None:
            proc.kill()  # only on a failure of this test: leave no process
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
        rc = await asyncio.wait_for(proc.wait(), 30)
    assert ended_cleanly(rc, err), err
    return rc, killed
