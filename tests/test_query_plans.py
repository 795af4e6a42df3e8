"""No hot-path statement scans a table that grows.

Each store is preloaded (bulk SQL) with about 6,000 messages across 400 conversations,
their members, delivered cursors and, on MariaDB, idempotency records, then ANALYZE TABLE
so InnoDB has real statistics. Then every request path runs through the store's public
API: the SYNC pages a login is followed by (first page, `after` cursor, changed_since,
two at once), SEND batches (with a resend of a stored message, an in-batch duplicate, a
sender no longer a member, and a full batcher-sized batch), PULL and HISTORY, recall,
read and delivered positions (and their flushes), p2p and group creation, membership
changes, member and seq lookups, and housekeeping; then an `imgw archive run` (its
statements planned too) and HISTORY and PULL pages read back through the archive index;
then every statement of the media index (storage/media: uploads, references, the orphan
sweep) on 2,000 preloaded uploads, and of the revocation log (storage/revocations.py: a
revocation, the node's load and its reads of changes, pruning) on 2,000 preloaded
revocations; the push registrations and mutes (storage/push.py) on 2,000 of each; and
the hook rows (storage/hooks.py: written by every message-storing call of the workload,
read, adopted, deleted and counted) on 2,000 preloaded rows of three nodes.
(LOGIN itself only touches the route store and the node's copy of the revocations, which
run no SQL.)

Every statement the store executed is captured (SQLite: the trace callback of both
connections, parameters bound; MariaDB: the text asyncmy sent, parameters interpolated
client-side, multi-statement queries split) and planned again on the same data:
`EXPLAIN QUERY PLAN` on SQLite, `EXPLAIN` on MariaDB. A table that grows with users or
traffic (every table of the schema but im_meta) read by a full scan fails the test with
each offending query shape, the store method that issued it, and its plan: SQLite
`SCAN t` (`SCAN t USING [COVERING] INDEX i` walks a whole index: as bad) or an automatic
index, MariaDB type `ALL`, `index` (or their hash_ forms). Scans of a subquery's result
(`SCAN r`, `SCAN (subquery-2)`, `<derived2>`, `<subquery2>`) are not table scans. One
walk is bounded and allowed (`BOUNDED_SCANS`): the hook backlog's count, which reads at
most HOOK_BACKLOG_CAP index entries.

So that it cannot pass by capturing nothing, the test also requires every public
coroutine of the store class to have been called, every growing table to have been
planned, and each reading store method to have issued a planned statement.

What it was written for: `_find_sent` on SQLite matched `client_msg_id=?`, but the dedup
index is partial (`WHERE client_msg_id <> ''`), so every SEND scanned im_message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import random
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomysql
import asyncmy.connection
import pytest

from gateway.config import Config
from protocol.mediakeys import media_key
from protocol.ops import ConvKind, MsgType
from storage.archive.index_mysql import MySQLIndex
from storage.archive.index_sqlite import SqliteIndex
from storage.embedded import EmbeddedStore
from storage.embedded import schema as sqlite_schema
from storage.embedded.revocations import SqliteRevocationLog
from storage.hooks import HOOK_BACKLOG_CAP
from storage.media.index_mysql import MySQLMediaIndex
from storage.media.index_sqlite import SqliteMediaIndex
from storage.models import AppendStatus, NewMessage, RecallStatus
from storage.mysql import MySQLSettings, MySQLStore
from storage.mysql.changes import COLOCATED, ChangeLog, trigger_names, triggers
from storage.mysql.move import BATCH, CAUGHT_UP
from storage.mysql.schema import message_table
from storage.push import token_digest
from storage.revocations import ALL_DEVICES, Revocation, RevocationLog
from tests.support.services import drop_mysql, fresh_mysql, mysql_rows

HOUR = 3600 * 1000
SHARDS = 4
HEAVY_UID = 1  # a member of ~80 conversations: SYNC pages through them
# the send batcher's default batch size: a full batch is what SEND commits under load
_BATCH_MAX = next(f for f in dataclasses.fields(Config) if f.name == "batch_max")
FULL_BATCH: int = _BATCH_MAX.default  # type: ignore[assignment]

# -- statements: splitting, classifying, naming the tables they read ----------------------

_QUOTED = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`")
_KEYWORDS = frozenset({
    "where", "join", "left", "right", "inner", "outer", "cross", "on", "set", "order",
    "group", "limit", "having", "using", "values", "select", "from", "union", "as", "and",
    "or", "not", "natural", "straight_join", "for", "lock", "window",
})  # fmt: skip
_TABLE_REF = re.compile(
    r"\b(?:FROM|JOIN|UPDATE|INTO)\s+([A-Za-z_]\w*)(?:\s+(?:AS\s+)?(\w+))?", re.I
)
_SUBQUERY_ALIAS = re.compile(r"\)\s*(?:AS\s+)?([A-Za-z_]\w*)", re.I)
# Scans allowed because a LIMIT bounds them: by store method, the statement's pattern
# and the most rows its LIMIT may name.
BOUNDED_SCANS = {
    "hooks_backlog": (re.compile(r"\(SELECT 1 FROM im_hook LIMIT (\d+)\)"), HOOK_BACKLOG_CAP),
    # a shard move's catch-up reads its change log a batch at a time, oldest first, and
    # counts what is left up to the lag it freezes at (storage/mysql/move.py)
    "move_catch_up": (
        re.compile(r"FROM im_shard_change (?:ORDER BY id )?LIMIT (\d+)"),
        max(BATCH, CAUGHT_UP + 1),
    ),
}


def bounded(label: str, stmt: str) -> bool:
    """Whether `stmt`, issued by store method `label`, is a scan BOUNDED_SCANS allows."""
    allowed = BOUNDED_SCANS.get(label)
    if allowed is None:
        return False
    m = allowed[0].search(stmt)
    return m is not None and int(m.group(1)) <= allowed[1]


def _blank_literals(text: str) -> str:
    """`text` with every quoted literal replaced by '' (same statement structure)."""
    return _QUOTED.sub("''", text)


def split_statements(text: str) -> list[str]:
    """The statements of a multi-statement query (`;` inside quotes does not split)."""
    out: list[str] = []
    start = 0
    pos = 0
    while pos < len(text):
        m = _QUOTED.match(text, pos)
        if m:
            pos = m.end()
            continue
        if text[pos] == ";":
            out.append(text[start:pos])
            start = pos + 1
        pos += 1
    out.append(text[start:])
    return [s.strip() for s in out if s.strip()]


def plannable(stmt: str, *, mysql: bool) -> bool:
    """Whether the statement reads tables the planner chooses how to read: SELECT, UPDATE,
    DELETE, and INSERT/REPLACE … SELECT. (An INSERT … VALUES, with or without its upsert
    clause, only probes the unique keys of the rows it writes.)"""
    bare = _blank_literals(stmt).lstrip("( \n\t").upper()
    head = bare.split(None, 1)[0] if bare else ""
    if head in ("SELECT", "UPDATE", "DELETE", "WITH"):
        return True
    if head in ("INSERT", "REPLACE"):
        if not mysql:
            return True  # EXPLAIN QUERY PLAN of a plain INSERT is empty: harmless
        return re.search(r"\bVALUES\b", bare) is None
    return False


@dataclass
class Names:
    """What each name in a plan stands for: table aliases, and subquery results."""

    tables: dict[str, str]
    derived: set[str]

    @classmethod
    def of(cls, stmt: str) -> Names:
        bare = _blank_literals(stmt)
        tables: dict[str, str] = {}
        for m in _TABLE_REF.finditer(bare):
            table, alias = m.group(1), m.group(2)
            tables[table] = table
            if alias and alias.lower() not in _KEYWORDS:
                tables[alias] = table
        derived = {
            m.group(1)
            for m in _SUBQUERY_ALIAS.finditer(bare)
            if m.group(1).lower() not in _KEYWORDS
        }
        return cls(tables, derived - set(tables))


@dataclass
class Captured:
    """Statements the store executed, each with the store method that issued it."""

    statements: list[tuple[str, str]] = field(default_factory=list)
    current: str = "(outside the workload)"

    def add(self, text: str) -> None:
        for stmt in split_statements(text):
            self.statements.append((self.current, stmt))


class Calls:
    """The store, with each coroutine call recorded and labelling what it executes."""

    def __init__(self, store: Any, captured: Captured) -> None:
        self._store = store
        self._captured = captured
        self.called: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.called.add(name)
            before, self._captured.current = self._captured.current, name
            try:
                return await attr(*args, **kwargs)
            finally:
                self._captured.current = before

        return call


def public_coroutines(cls: type) -> set[str]:
    return {
        name
        for name, _ in inspect.getmembers(cls, inspect.iscoroutinefunction)
        if not name.startswith("_")
    } - {"start", "close"}


def family(table: str) -> str:
    """Message shards count as one table for coverage."""
    return re.sub(r"^im_message_\d+$", "im_message_NNNN", table)


def shape(stmt: str) -> str:
    """The statement with its literals (and lists of them) as `?`: one line per query
    shape in a failure, however many times the workload ran it."""
    text = re.sub(r"\b\d+\b", "?", _blank_literals(stmt).replace("''", "?"))
    text = re.sub(r"\?(?:\s*,\s*\?)+", "?", text)
    text = re.sub(r"\(\?\)(?:\s*,\s*\(\?\))+", "(?)", text)
    return re.sub(r"\s+", " ", text).strip()


@dataclass
class Scan:
    """Statements of one shape whose plan scans a growing table."""

    tables: set[str]
    labels: set[str]
    example: str
    plan: list[str]
    count: int = 0

    def __str__(self) -> str:
        text = re.sub(r"\s+", " ", self.example)
        if len(text) > 600:
            text = text[:600] + " …"
        calls = ", ".join(f"store.{x}()" for x in sorted(self.labels))
        plan = "\n".join(f"      {p}" for p in self.plan)
        return (
            f"full scan of {', '.join(sorted(self.tables))} by {calls} "
            f"({self.count} statement(s) of this shape), e.g.:\n    {text}\n  plan:\n{plan}"
        )


@dataclass
class Verdict:
    scans: dict[str, Scan] = field(default_factory=dict)  # by statement shape
    planned_tables: set[str] = field(default_factory=set)  # families
    planned_by: set[str] = field(default_factory=set)  # store methods
    unique_planned: int = 0


def check(
    captured: Captured,
    growing: set[str],
    explain: Callable[[str], list[tuple[str, str, str]]],
    *,
    mysql: bool,
) -> Verdict:
    """Plan every plannable captured statement; `explain` gives (name, access, line) per
    plan line: name "" for lines naming no table, access "scan" for a full scan."""
    verdict = Verdict()
    seen: dict[str, list[tuple[str, str, str]]] = {}
    for label, stmt in captured.statements:
        if not plannable(stmt, mysql=mysql):
            continue
        plan = seen.get(stmt)
        if plan is None:
            plan = seen[stmt] = explain(stmt)
        names = Names.of(stmt)
        verdict.planned_by.add(label)
        bad: list[str] = []
        for name, access, _ in plan:
            if not name:
                continue
            table = names.tables.get(name)
            if table is None:
                if name in names.derived:
                    continue  # a subquery's result
                bad.append(f"{name} (not a table or subquery of the statement)")
                continue
            if table in growing:
                verdict.planned_tables.add(family(table))
                if access == "scan" and not bounded(label, stmt):
                    bad.append(table)
        if bad:
            scan = verdict.scans.setdefault(
                shape(stmt), Scan(set(), set(), stmt, [shown for _, _, shown in plan])
            )
            scan.tables.update(bad)
            scan.labels.add(label)
            scan.count += 1
    verdict.unique_planned = len(seen)
    return verdict


def assert_no_scans(
    verdict: Verdict, growing: set[str], must_read: set[str], calls: Calls, cls: type
) -> None:
    problems: list[str] = []
    if verdict.scans:
        problems.append(
            f"{len(verdict.scans)} hot-path query shape(s) scan a growing table:\n\n"
            + "\n\n".join(map(str, verdict.scans.values()))
        )
    # coverage: so that the test cannot pass by capturing or planning nothing
    if missing := public_coroutines(cls) - calls.called:
        problems.append(f"the workload must call every store coroutine; add {sorted(missing)}")
    if unplanned := {family(t) for t in growing} - verdict.planned_tables:
        problems.append(f"no planned statement read {sorted(unplanned)}: is capture broken?")
    if silent := must_read - verdict.planned_by:
        problems.append(f"nothing planned from store.{sorted(silent)}: is capture broken?")
    if verdict.unique_planned < 20:
        problems.append(f"only {verdict.unique_planned} statements planned: is capture broken?")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


# -- the data: a store as it looks with some traffic behind it ---------------------------


@dataclass
class Msg:
    conv_id: int
    seq: int
    msg_id: int
    sender: int
    msg_type: int
    content: bytes
    send_ms: int
    cmid: str  # "" for server-written messages


@dataclass
class Data:
    now: int
    # conv_id, kind, p2p_lo, p2p_hi, title, owner, created_ms
    convs: list[tuple[int, int, int | None, int | None, str, int, int]]
    # conv_id, uid, pos, joined_seq, left_seq, left_ms, read_seq, updated_ms
    members: list[tuple[int, int, int, int, int | None, int | None, int, int]]
    seqs: dict[int, tuple[int, int]]  # conv_id -> (max_seq, last_active_ms)
    messages: list[Msg]
    delivered: list[tuple[int, str, int, int, int]]  # uid, device, conv_id, seq, ms
    group: int  # a preloaded group
    group_member: int  # a current member of it
    p2p: int  # a preloaded p2p conversation of HEAVY_UID
    resend: Msg  # a preloaded client message, sent again by the workload


def make_data(now: int, p2p_count: int = 300, groups: int = 100) -> Data:
    rng = random.Random(20240601)
    convs: list[tuple[int, int, int | None, int | None, str, int, int]] = []
    members: list[tuple[int, int, int, int, int | None, int | None, int, int]] = []
    seqs: dict[int, tuple[int, int]] = {}
    messages: list[Msg] = []
    delivered: list[tuple[int, str, int, int, int]] = []
    pairs: set[tuple[int, int]] = {(HEAVY_UID, 2 + k) for k in range(60)}
    while len(pairs) < p2p_count:
        a, b = rng.sample(range(2, 600), 2)
        pairs.add((min(a, b), max(a, b)))
    rosters: list[tuple[int, list[int], int]] = []  # kind, uids in join order, owner
    for lo, hi in sorted(pairs):
        rosters.append((ConvKind.P2P, [lo, hi], 0))
    for g in range(groups):
        uids = rng.sample(range(2, 600), 15)
        if g % 5 == 0:
            uids[rng.randrange(1, 15)] = HEAVY_UID
        rosters.append((ConvKind.GROUP, uids, uids[0]))
    msg_id = 0
    for conv_id, (kind, uids, owner) in enumerate(rosters, start=1):
        # A few conversations went quiet over 48 h ago: their idempotency records are due
        # for pruning. The rest were active within the last 47 h.
        if conv_id % 50 == 0:
            last_active = now - rng.randrange(49 * HOUR, 60 * HOUR)
        else:
            last_active = now - rng.randrange(60_000, 47 * HOUR)
        n = rng.randrange(5, 26)
        created = last_active - n * 60_000
        p2p_lo, p2p_hi = (uids[0], uids[1]) if kind == ConvKind.P2P else (None, None)
        title = "" if kind == ConvKind.P2P else f"group {conv_id}"
        convs.append((conv_id, kind, p2p_lo, p2p_hi, title, owner, created))
        left: dict[int, int] = {}
        if kind == ConvKind.GROUP:
            for uid in rng.sample(uids[1:], 2):  # two members left along the way
                left[uid] = rng.randrange(2, n + 1)
        for seq in range(1, n + 1):
            msg_id += 1
            send_ms = last_active - (n - seq) * 60_000
            if kind == ConvKind.GROUP and seq == 1:
                messages.append(
                    Msg(conv_id, seq, msg_id, 0, MsgType.SYSTEM, b"\x81\xa5event", send_ms, "")
                )
                continue
            senders = [u for u in uids if left.get(u, n + 1) > seq]
            sender = rng.choice(senders)
            content = b"m" * rng.randrange(5, 60)
            messages.append(
                Msg(conv_id, seq, msg_id, sender, MsgType.TEXT, content, send_ms, f"c{msg_id}")
            )
        seqs[conv_id] = (n, last_active)
        joined = 1
        for pos, uid in enumerate(uids):
            left_seq = left.get(uid)
            left_ms = None if left_seq is None else created + left_seq * 60_000
            read = rng.randrange(0, (left_seq or n) + 1)
            members.append((conv_id, uid, pos, joined, left_seq, left_ms, read, last_active))
            if left_seq is None:
                delivered.append((uid, "phone", conv_id, rng.randrange(read, n + 1), last_active))
                if rng.random() < 0.3:
                    delivered.append((uid, "pc", conv_id, rng.randrange(0, n + 1), last_active))
    group = p2p_count + 1
    group_member = next(m[1] for m in members if m[0] == group and m[4] is None and m[2] > 0)
    resend = next(m for m in messages if m.cmid and m.conv_id == group + 3)
    return Data(now, convs, members, seqs, messages, delivered, group, group_member, 1, resend)


# -- the workload: every store call the gateway makes per request -------------------------


async def workload(api: Calls, data: Data) -> dict[str, Any]:
    """Run every hot path once against preloaded `data`; what the MySQL extras need."""
    a, b, c, d, e, f = range(10_001, 10_007)
    now = data.now

    # GROUP / P2P requests
    p2p = await api.open_p2p(a, b)
    assert await api.open_p2p(b, a) == p2p  # the existing conversation
    assert await api.open_p2p(HEAVY_UID, 2) == data.p2p
    assert await api.find_p2p(2, HEAVY_UID) == data.p2p
    assert await api.find_p2p(a, 99_999) is None
    group, _ = await api.create_group(a, "plans", [b, c, d])
    await api.change_members(group, a, [e, f], [])
    await api.change_members(group, a, [], [f])
    await api.change_members(group, e, [], [e])  # leaves
    assert await api.set_title(group, a, "plans v2") is not None  # the server API
    assert await api.set_title(group, b, "not the owner's") is None
    # membership checks of conversations nobody has looked at yet (no member cache)
    assert await api.get_conversation(data.group) is not None
    assert await api.get_membership(data.group, data.group_member) is not None
    assert data.group_member in await api.member_uids(data.group)
    assert await api.member_uids(data.group + 1)
    counts = await api.conversation_counts([a, b, HEAVY_UID, data.group_member])
    assert counts[a] >= 2 and counts[HEAVY_UID] >= 1

    # SEND: one batch across conversations, with a resend of a preloaded message, an
    # in-batch duplicate and a sender that is no longer a member
    r = data.resend
    batch = [
        NewMessage(p2p, a, "w-1", MsgType.TEXT, b"hi"),
        NewMessage(group, b, "w-2", MsgType.TEXT, b"hello"),
        NewMessage(data.group, data.group_member, "w-3", MsgType.TEXT, b"x"),
        NewMessage(r.conv_id, r.sender, r.cmid, r.msg_type, r.content),
        NewMessage(p2p, a, "w-1", MsgType.TEXT, b"hi"),
        NewMessage(group, f, "w-4", MsgType.TEXT, b"gone"),
    ]
    results = await api.append(batch)
    S, D, N = AppendStatus.STORED, AppendStatus.DUPLICATE, AppendStatus.NOT_MEMBER
    assert [x.status for x in results] == [S, S, S, D, D, N]
    sent = results[0].message
    assert sent is not None
    # a full batch, as the batcher commits them under load: its key list is long enough
    # for MariaDB to plan the idempotency lookup differently (a materialised key table)
    current: dict[int, list[int]] = {}  # of the first FULL_BATCH // 4 (p2p) conversations
    for m in data.members:
        if m[0] <= FULL_BATCH // 4 and m[4] is None:
            current.setdefault(m[0], []).append(m[1])
    convs = sorted(current)
    full: list[NewMessage] = []
    for i in range(FULL_BATCH):
        conv = convs[i % len(convs)]
        full.append(NewMessage(conv, current[conv][i % 2], f"full-{i}", MsgType.TEXT, b"load"))
    assert {x.status for x in await api.append(full)} == {S}
    assert await api.find_sent(a, "w-1") is not None
    assert await api.find_sent(r.sender, r.cmid) is not None
    assert await api.find_sent(a, "never-sent") is None

    # PULL and HISTORY
    top = data.seqs[data.group][0] + 1  # + w-3
    msgs, _ = await api.read_after(data.group, 0, 10, min_seq=0, max_seq=None)
    assert msgs
    await api.read_after(data.group, 4, 10, min_seq=2, max_seq=top)
    msgs, _ = await api.read_before(data.group, 0, 10, min_seq=0, max_seq=None)
    assert msgs[-1].seq == top
    await api.read_before(data.group, top - 2, 5, min_seq=1, max_seq=top)

    # RECALL
    got = await api.recall(p2p, sent.seq, a, window_ms=120_000, min_seq=0)
    assert got.status is RecallStatus.RECALLED
    got = await api.recall(p2p, sent.seq, a, window_ms=120_000, min_seq=0)
    assert got.status is RecallStatus.ALREADY

    # READ and DELIVERED
    await api.set_read(data.group, data.group_member, top)
    await api.set_delivered(data.group, data.group_member, "phone", top)
    await api.set_delivered(group, b, "phone", 2)

    # SYNC (login's first page, the next page, then an incremental one)
    page = await api.sync(HEAVY_UID, "phone", changed_since_ms=0, after=None, limit=20)
    assert page.has_more and len(page.rows) == 20
    last = page.rows[-1]
    after = (last.last_active_ms, last.conv_id)
    page = await api.sync(HEAVY_UID, "phone", changed_since_ms=0, after=after, limit=20)
    assert page.rows
    # asked together: MySQL answers SYNCs of one loop iteration in one round trip
    await asyncio.gather(
        api.sync(HEAVY_UID, "pc", changed_since_ms=now - 6 * HOUR, after=None, limit=50),
        api.sync(b, "phone", changed_since_ms=0, after=None, limit=20),
    )

    # presence visibility (receipts), housekeeping
    await api.set_read(group, c, 2)  # c shows up in the group; b has not
    # a owns the group (seen by its members); c read in it
    assert await api.shared_with(b, [a, c, f, 99_999]) == {a, c}
    assert await api.shared_with(a, [b, c, f, 99_999]) == {c}
    await api.maintain()
    return {"p2p": p2p, "group": group, "b": b}


async def archive_and_read(api: Calls, index: Any, captured: Captured, url: str) -> None:
    """`imgw archive run` moves the conversations quiet for over 48 h (conv_id % 50 == 0)
    to the archive; HISTORY and PULL then read them through the archive index."""
    from storage.archive.run import archive_run

    captured.current = "archive_run"
    try:
        report = await archive_run(index, url, older_than_ms=48 * HOUR + HOUR // 2)
    finally:
        captured.current = "(outside the workload)"
    assert report.rows > 0 and not report.failures and report.conversations == 8
    msgs, more = await api.read_before(50, 0, 3, min_seq=0, max_seq=None)
    assert len(msgs) == 3 and more
    msgs, _ = await api.read_after(50, 0, 3, min_seq=1, max_seq=None)
    assert [m.seq for m in msgs] == [1, 2, 3]


MEDIA_UPLOADS = 2000  # preloaded uploads, every other one referenced by a conversation


def media_rows(data: Data) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Preloaded im_media_upload rows (key, uid, size, type, created_ms, referenced) and
    im_media_ref rows (key, conv_id, created_ms): a day of uploads, half referenced."""
    uploads, refs = [], []
    for i in range(MEDIA_UPLOADS):
        key = media_key(1 + i % 50, f"{i:064x}")
        ms = data.now - 30 * HOUR + i * 40_000
        uploads.append((key, 1 + i % 50, 1000 + i, "image/png", ms, i % 2))
        if i % 2:
            refs.append((key, data.convs[i % len(data.convs)][0], ms))
    return uploads, refs


async def media_workload(index: Any, captured: Captured, data: Data) -> None:
    """Every statement of the media index (storage/media): MEDIA_UPLOAD, a media SEND's
    reference, MEDIA_GET, and the orphan sweep."""
    key = media_key(7, "f" * 64)
    steps: list[tuple[str, Any]] = [
        ("record_upload", lambda: index.record_upload(key, 7, 10, "image/png", data.now)),
        ("record_upload", lambda: index.record_upload(key, 7, 10, "image/png", data.now)),
        ("get_upload", lambda: index.get_upload(key)),
        ("add_reference", lambda: index.add_reference(key, data.p2p, data.now)),
        ("add_reference", lambda: index.add_reference(media_key(7, "e" * 64), 1, data.now)),
        ("referencing", lambda: index.referencing(key, 100)),
        ("orphans", lambda: index.orphans(data.now - 24 * HOUR, 200)),
        ("claim", lambda: index.claim(media_key(1, f"{0:064x}"), data.now - 24 * HOUR)),
        ("forget", lambda: index.forget(media_key(1, f"{0:064x}"), data.now - 24 * HOUR)),
    ]
    for label, step in steps:
        before, captured.current = captured.current, f"media.{label}"
        try:
            await step()
        finally:
            captured.current = before
    assert await index.referencing(key, 100) == [data.p2p]


PUSH_DEVICES = 2000  # preloaded registrations: 1,000 uids with two devices each
MUTES = 2000  # preloaded mutes, a third of them expired


def push_rows(data: Data) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Preloaded im_push_device rows (uid, device, provider, token, preview, locale,
    updated_ms) and im_conv_mute rows (conv_id, uid, until_ms)."""
    devices = [
        (20_000 + i // 2, f"d{i % 2}", "fcm", f"token-{i:06d}", i % 2, "en", data.now - i * 1000)
        for i in range(PUSH_DEVICES)
    ]
    mutes = [
        (data.convs[i % len(data.convs)][0], 100 + i, data.now + (i % 3 - 1) * HOUR)
        for i in range(MUTES)
    ]
    return devices, mutes


async def push_workload(api: Calls, data: Data) -> None:
    """Every push call of the store (storage/push.py): PUSH_REGISTER (anew, again, moving a
    token, past the uid's limit), the delivery path's reads for a conversation's offline
    members, PUSH_UNREGISTER, a token the push service reported invalid, MUTE."""
    uid = 20_000  # preloaded: d0 and d1
    removed = await api.push_register(
        uid, "d2", "fcm", "new", preview=True, locale="pt-BR", max_devices=2
    )
    assert removed == [(uid, "d1")]  # the least recently registered
    await api.push_register(uid, "d2", "apns", "newer", preview=False, locale="", max_devices=10)
    moved = await api.push_register(
        uid + 1, "d7", "fcm", "token-000004", preview=False, locale="", max_devices=10
    )
    assert moved == [(20_002, "d0")]
    found = await api.push_devices([20_000 + k for k in range(0, 400, 2)])
    assert len(found[uid]) == 2 and len(found[20_002]) == 1
    assert await api.push_unregister(uid, "d2")
    assert await api.push_delete("fcm", "token-000010")
    await api.set_mute(data.group, data.group_member, data.now + HOUR)
    await api.set_mute(data.group, data.group_member, 0)
    conv = data.convs[0][0]  # preloaded mutes: uids 100, 500, 900, 1300 and 1700
    asked = [(conv, u) for u in (100, 500, 900, 1300, 1700, 5)] + [(data.group, 900)]
    assert await api.muted(asked, data.now) == {(conv, 900)}
    heavy = [m for m in data.members if m[1] == HEAVY_UID and m[6] < data.seqs[m[0]][0]]
    badges = await api.unread_badges([HEAVY_UID, data.group_member, 5])
    assert heavy and badges[HEAVY_UID] > 0  # its conversations have unread


HOOKS = 2000  # preloaded hook rows: three nodes', a dead one's among them


def hook_rows(data: Data) -> list[tuple[int, int, str, int]]:
    """Preloaded im_hook rows (conv_id, seq, node, created_ms): the messages of the
    preload, owed by three nodes, the oldest a minute old."""
    nodes = ("plans-node", "other-node", "dead-node")
    return [
        (m.conv_id, m.seq, nodes[i % 3], data.now - 60_000 + i)
        for i, m in enumerate(data.messages[:HOOKS])
    ]


async def hook_workload(api: Calls, data: Data) -> None:
    """Every hook call of the store (storage/hooks.py) as the node's dispatcher makes
    them: a page of its rows, the delivered ones deleted, a dead node's rows adopted,
    the backlog for metrics. (The message-storing calls of `workload` wrote rows too.)"""
    page = await api.hooks_of("plans-node", 100)
    assert len(page) == 100 and page == sorted(page, key=lambda r: (r.created_ms, r.conv_id, r.seq))
    await api.hooks_done([(r.conv_id, r.seq) for r in page])
    assert await api.hooks_adopt("dead-node", "plans-node") == HOOKS // 3
    count, oldest = await api.hooks_backlog()
    assert count > HOOKS - 100 and 0 < oldest <= data.now


REVOCATIONS = 2000  # preloaded revocations: a day of them, half expired


def revocation_rows(data: Data) -> list[tuple[int, str, int, int, int]]:
    """Preloaded im_revocation rows (uid, device, revoked_s, expires_s, updated_ms)."""
    now_s = data.now // 1000
    rows = []
    for i in range(REVOCATIONS):
        at_ms = data.now - 24 * HOUR + i * 43_200
        at_s = at_ms // 1000
        device = ALL_DEVICES if i % 3 else f"d{i % 7}"
        rows.append((10_000 + i, device, at_s, at_s + 12 * 3600 + (now_s - at_s) // 2, at_ms))
    return rows


async def revocation_workload(log: RevocationLog, captured: Captured, data: Data) -> None:
    """Every statement of the revocation log (storage/revocations.py): a revocation, a
    node's load at start, its read of the changes each second, pruning."""
    now_s = data.now // 1000
    steps: list[tuple[str, Any]] = [
        ("record", lambda: log.record(Revocation(7, "ios", now_s, now_s + 3600))),
        ("record", lambda: log.record(Revocation(7, "ios", now_s + 1, now_s + 3601))),
        ("changed_since", lambda: log.changed_since(None)),
        ("changed_since", lambda: log.changed_since(data.now - 10_000)),
        ("prune", lambda: log.prune(now_s)),
    ]
    for label, step in steps:
        before, captured.current = captured.current, f"revocations.{label}"
        try:
            await step()
        finally:
            captured.current = before
    rows, _ = await log.changed_since(data.now - 10_000)
    assert Revocation(7, "ios", now_s + 1, now_s + 3601) in rows


# -- SQLite ---------------------------------------------------------------------------------


def preload_sqlite(path: str, data: Data) -> None:
    conn = sqlite_schema.connect(path)
    try:
        sqlite_schema.migrate(conn)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO im_conversation (conv_id, kind, p2p_lo, p2p_hi, title, owner_uid, "
            "created_ms) VALUES (?,?,?,?,?,?,?)",
            data.convs,
        )
        conn.executemany(
            "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, left_seq, left_ms, "
            "read_seq, updated_ms) VALUES (?,?,?,?,?,?,?,?)",
            data.members,
        )
        conn.executemany(
            "INSERT INTO im_conv_seq (conv_id, max_seq, last_active_ms) VALUES (?,?,?)",
            [(c, s, ms) for c, (s, ms) in data.seqs.items()],
        )
        conn.executemany(
            "INSERT INTO im_message (id, conv_id, seq, sender_uid, msg_type, content, "
            "client_msg_id, send_ms) VALUES (?,?,?,?,?,?,?,?)",
            [
                (m.msg_id, m.conv_id, m.seq, m.sender, m.msg_type, m.content, m.cmid, m.send_ms)
                for m in data.messages
            ],
        )
        conn.executemany(
            "INSERT INTO im_delivered (uid, device, conv_id, seq, updated_ms) VALUES (?,?,?,?,?)",
            data.delivered,
        )
        uploads, refs = media_rows(data)
        conn.executemany(
            "INSERT INTO im_media_upload (media_key, uid, size, content_type, created_ms, "
            "referenced) VALUES (?,?,?,?,?,?)",
            uploads,
        )
        conn.executemany(
            "INSERT INTO im_media_ref (media_key, conv_id, created_ms) VALUES (?,?,?)", refs
        )
        conn.executemany(
            "INSERT INTO im_revocation (uid, device, revoked_s, expires_s, updated_ms) "
            "VALUES (?,?,?,?,?)",
            revocation_rows(data),
        )
        devices, mutes = push_rows(data)
        conn.executemany(
            "INSERT INTO im_push_device (uid, device, provider, token, preview, locale, "
            "updated_ms) VALUES (?,?,?,?,?,?,?)",
            devices,
        )
        conn.executemany("INSERT INTO im_conv_mute (conv_id, uid, until_ms) VALUES (?,?,?)", mutes)
        conn.executemany(
            "INSERT INTO im_hook (conv_id, seq, node, created_ms) VALUES (?,?,?,?)", hook_rows(data)
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def sqlite_plan(conn: sqlite3.Connection, stmt: str) -> list[tuple[str, str, str]]:
    """(name, "scan" or "search", line) per line of the statement's EXPLAIN QUERY PLAN."""
    # The trace has the parameters bound; should SQLite not expand one, bind NULLs.
    marks = _blank_literals(stmt).count("?")
    out: list[tuple[str, str, str]] = []
    for row in conn.execute(f"EXPLAIN QUERY PLAN {stmt}", [None] * marks).fetchall():
        detail: str = row[3]
        m = re.match(r"(SCAN|SEARCH) (\S+)", detail)
        if m is None or m.group(2) == "CONSTANT" or re.match(r"SCAN \d+ CONSTANT ROWS", detail):
            # a VALUES list: "SCAN CONSTANT ROW", or "SCAN 5 CONSTANT ROWS" since 3.40
            out.append(("", "", detail))
        elif re.fullmatch(r"\(subquery-\d+\)", m.group(2)):
            out.append(("", "", detail))  # the result of a subquery SQLite did not name
        elif m.group(1) == "SCAN" or "AUTOMATIC" in detail:
            # an automatic index is built by reading the whole table, every time
            out.append((m.group(2), "scan", detail))
        else:
            out.append((m.group(2), "search", detail))
    return out


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedStore, str, Data]]:
    path = str(tmp_path / "plans.db")
    data = make_data(int(time.time() * 1000))
    preload_sqlite(path, data)
    store = EmbeddedStore(path)
    await store.start()
    try:
        yield store, path, data
    finally:
        await store.close()


# Store methods that read tables on every call (the rest may answer from memory or only
# write rows by key).
EMBEDDED_READS = {
    "get_conversation", "get_membership", "member_uids", "open_p2p", "create_group",
    "change_members", "append", "find_sent", "read_after", "read_before", "recall",
    "set_read", "sync", "shared_with", "set_title", "push_register", "push_unregister",
    "push_devices", "push_delete", "muted", "hooks_of", "hooks_done", "hooks_adopt",
    "hooks_backlog",
}  # fmt: skip


async def test_sqlite_hot_paths_search_indexes(
    embedded: tuple[EmbeddedStore, str, Data],
) -> None:
    store, path, data = embedded
    captured = Captured()
    assert store._writer.conn is not None and store._reader.conn is not None
    index = SqliteIndex(path, clock=store.now_ms)
    await index.open()
    media = SqliteMediaIndex(path)
    await media.open()
    revocations = SqliteRevocationLog(path)
    await revocations.changed_since(None)  # opens its connection
    conns = (
        store._writer.conn,
        store._reader.conn,
        index._thread.conn,
        media._thread.conn,
        revocations._thread.conn,
    )
    for conn in conns:
        assert conn is not None
        conn.set_trace_callback(captured.add)
    try:
        api = Calls(store, captured)
        api.set_hook_node("plans-node")  # every message-storing call writes hook rows
        await workload(api, data)
        await push_workload(api, data)
        await hook_workload(api, data)
        await archive_and_read(api, index, captured, (Path(path).parent / "arch").as_uri())
        await media_workload(media, captured, data)
        await revocation_workload(revocations, captured, data)
    finally:
        for conn in conns:
            assert conn is not None
            conn.set_trace_callback(None)
        await index.close()
        await media.close()
        await revocations.close()

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
        growing = {t for (t,) in tables} - {"im_meta"}
        verdict = check(captured, growing, lambda stmt: sqlite_plan(conn, stmt), mysql=False)
    finally:
        conn.close()
    assert growing >= {"im_message", "im_conv_member", "im_delivered", "im_conversation"}
    assert_no_scans(verdict, growing, EMBEDDED_READS, api, EmbeddedStore)


# -- MariaDB --------------------------------------------------------------------------------


# join types that read a whole table or a whole index (hash_*: the same, into a hash join)
_MARIADB_SCANS = frozenset({"ALL", "index", "hash_ALL", "hash_index"})


async def _connect(settings: MySQLSettings) -> aiomysql.Connection:
    return await aiomysql.connect(
        host=settings.host, port=settings.port, user=settings.user,
        password=settings.password, db=settings.database, autocommit=True, charset="utf8mb4",
    )  # fmt: skip


async def preload_mysql(settings: MySQLSettings, data: Data) -> None:
    conn = await _connect(settings)
    try:
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO im_conversation (conv_id, kind, p2p_lo, p2p_hi, title, owner_uid, "
                "created_ms) VALUES (%s,%s,%s,%s,%s,%s,%s)",
                data.convs,
            )
            await cur.executemany(
                "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, left_seq, left_ms, "
                "read_seq, updated_ms) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                data.members,
            )
            await cur.executemany(
                "INSERT INTO im_conv_seq (conv_id, reserved_seq, max_seq, last_active_ms) "
                "VALUES (%s,%s,%s,%s)",
                [(c, s, s, ms) for c, (s, ms) in data.seqs.items()],
            )
            for shard in range(SHARDS):
                await cur.executemany(
                    f"INSERT INTO {message_table(shard)} (conv_id, seq, id, sender_uid, "
                    "msg_type, content, send_ms, client_msg_id) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                    [
                        (m.conv_id, m.seq, m.msg_id, m.sender, m.msg_type, m.content, m.send_ms,
                         m.cmid.encode() if m.cmid else None)
                        for m in data.messages
                        if m.conv_id % SHARDS == shard
                    ],
                )  # fmt: skip
            await cur.executemany(
                "INSERT INTO im_send_dedup (sender_uid, client_msg_id, conv_id, seq, created_ms) "
                "VALUES (%s,%s,%s,%s,%s)",
                [
                    (m.sender, m.cmid.encode(), m.conv_id, m.seq, m.send_ms)
                    for m in data.messages
                    if m.cmid
                ],
            )
            await cur.executemany(
                "INSERT INTO im_delivered (uid, device, conv_id, seq, updated_ms) "
                "VALUES (%s,%s,%s,%s,%s)",
                data.delivered,
            )
            uploads, refs = media_rows(data)
            await cur.executemany(
                "INSERT INTO im_media_upload (media_key, uid, size, content_type, created_ms, "
                "referenced) VALUES (%s,%s,%s,%s,%s,%s)",
                uploads,
            )
            await cur.executemany(
                "INSERT INTO im_media_ref (media_key, conv_id, created_ms) VALUES (%s,%s,%s)",
                refs,
            )
            await cur.executemany(
                "INSERT INTO im_revocation (uid, device, revoked_s, expires_s, updated_ms) "
                "VALUES (%s,%s,%s,%s,%s)",
                revocation_rows(data),
            )
            devices, mutes = push_rows(data)
            await cur.executemany(
                "INSERT INTO im_push_device (uid, device, provider, token, token_sha, preview, "
                "locale, updated_ms) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                [(u, d, p, t.encode(), token_digest(t), *rest) for u, d, p, t, *rest in devices],
            )
            await cur.executemany(
                "INSERT INTO im_conv_mute (conv_id, uid, until_ms) VALUES (%s,%s,%s)", mutes
            )
            await cur.executemany(
                "INSERT INTO im_hook (conv_id, seq, node, created_ms) VALUES (%s,%s,%s,%s)",
                hook_rows(data),
            )
            await cur.execute("SHOW TABLES")
            tables = [r[0] for r in await cur.fetchall()]
            await cur.execute(f"ANALYZE TABLE {', '.join(tables)}")
            await cur.fetchall()
    finally:
        conn.close()


@pytest.fixture
async def mysql_store() -> AsyncIterator[tuple[MySQLStore, Data]]:
    url = await fresh_mysql(shards=SHARDS)
    settings = MySQLSettings.from_url(url)
    try:
        data = make_data(int(time.time() * 1000))
        await preload_mysql(settings, data)
        store = MySQLStore(settings)
        await store.start()
        try:
            yield store, data
        finally:
            await store.close()
    finally:
        await drop_mysql(url)


def capture_mysql(monkeypatch: pytest.MonkeyPatch, captured: Captured) -> None:
    """Record the text of every query the store's driver (asyncmy) sends (parameters
    already interpolated: the driver does that client-side, so this is exactly what the
    server planned)."""
    send = asyncmy.connection.Connection.query

    async def query(self: Any, sql: str | bytes, unbuffered: bool = False) -> Any:
        text = sql if isinstance(sql, str) else bytes(sql).decode("utf-8", "surrogateescape")
        captured.add(text)
        return await send(self, sql, unbuffered)

    monkeypatch.setattr(asyncmy.connection.Connection, "query", query)


async def mariadb_plans(
    settings: MySQLSettings, captured: Captured
) -> tuple[set[str], dict[str, list[tuple[str, str, str]]]]:
    """The schema's growing tables, and (name, access, line) per EXPLAIN row of each
    plannable captured statement (name "" for `<derived2>`, `<subquery2>`: not tables)."""
    conn = await _connect(settings)
    try:
        async with conn.cursor() as cur:
            await cur.execute("SHOW TABLES")
            # im_shard_map: a row per shard range, read once a second, never growing;
            # im_node_lease: a row per node (a dead one's goes once swept), read whole
            # once a second by each node (OutboxKeeper: which nodes are dead)
            small = {"im_meta", "im_shard_map", "im_node_lease"}
            growing = {r[0] for r in await cur.fetchall()} - small
            plans: dict[str, list[tuple[str, str, str]]] = {}
            for _, stmt in captured.statements:
                if stmt in plans or not plannable(stmt, mysql=True):
                    continue
                await cur.execute(f"EXPLAIN {stmt}")
                cols = [col[0] for col in cur.description]
                out: list[tuple[str, str, str]] = []
                for row in await cur.fetchall():
                    r = dict(zip(cols, row, strict=True))
                    table = r["table"] or ""
                    shown = " ".join(f"{k}={v}" for k, v in r.items() if v is not None)
                    name = "" if table.startswith("<") else table
                    access = "scan" if r["type"] in _MARIADB_SCANS else str(r["type"])
                    out.append((name, access, shown))
                plans[stmt] = out
    finally:
        conn.close()
    return growing, plans


async def move_catch_up(api: Calls, captured: Captured, data: Data, to: str) -> None:
    """A shard move's change log on shard 1 (storage/mysql/move.py): triggers log what
    the store writes there (a send, read and delivered positions) behind a backlog of
    logged rows of conversations no longer there, and the catch-up applies it all to
    the database at `to`, reading each logged row by its primary key."""
    src = api.settings
    dst = MySQLSettings.from_url(to)
    conv, uid = next((m[0], m[1]) for m in data.members if m[0] % SHARDS == 1 and m[4] is None)
    tables = [message_table(1), *COLOCATED]

    async def connect(s: MySQLSettings) -> asyncmy.connection.Connection:
        return await asyncmy.connect(
            host=s.host, port=s.port, user=s.user, password=s.password, db=s.database,
            autocommit=True,
        )  # fmt: skip

    sconn, dconn = await connect(src), await connect(dst)
    try:
        async with sconn.cursor() as s, dconn.cursor() as d:
            for table in tables:
                for stmt in triggers(table, [1], SHARDS):
                    await s.execute(stmt)
            try:
                sent = await api.append([NewMessage(conv, uid, "moving-1", MsgType.TEXT, b"m")])
                assert sent[0].message is not None
                seq = sent[0].message.seq
                await api.set_read(conv, uid, seq)
                await api.set_delivered(conv, uid, "phone", seq)
                # the backlog (what a move has yet to catch up with: left there, so that
                # the log is planned as a table of that size)
                here = [c for c in data.seqs if c % SHARDS == 1] + [10**12 + 1, 10**12 + 5]
                await s.executemany(
                    "INSERT INTO im_shard_change (tbl, k1) VALUES ('im_conv_seq', %s)",
                    [(here[i % len(here)],) for i in range(3 * BATCH)],
                )
                await s.execute("ANALYZE TABLE im_shard_change")
                await s.fetchall()
                before, captured.current = captured.current, "move_catch_up"
                try:
                    log = ChangeLog(s, d)
                    assert await log.apply(BATCH) == BATCH
                    assert await log.lag(CAUGHT_UP + 1) == CAUGHT_UP + 1
                finally:
                    captured.current = before
                # applied: the send, its seq row and idempotency record, the positions
                for table, where in (
                    (message_table(1), f"conv_id={conv} AND seq={seq}"),
                    ("im_conv_seq", f"conv_id={conv} AND max_seq={seq}"),
                    ("im_send_dedup", f"conv_id={conv} AND seq={seq}"),
                    ("im_conv_member", f"conv_id={conv} AND uid={uid} AND read_seq={seq}"),
                    ("im_delivered", f"conv_id={conv} AND uid={uid} AND seq={seq}"),
                ):
                    n = await mysql_rows(
                        dst.port, dst.database, f"SELECT COUNT(*) FROM {table} WHERE {where}"
                    )
                    assert n == [(1,)], table
            finally:
                for table in tables:
                    for name in trigger_names(table):
                        await s.execute(f"DROP TRIGGER IF EXISTS {name}")
    finally:
        sconn.close()
        dconn.close()


MYSQL_READS = EMBEDDED_READS - {"create_group"} | {
    "member_rows", "max_seq", "seq_bounds", "prune_dedup", "maintain", "set_delivered",
    "prune",
}  # fmt: skip


async def test_mariadb_hot_paths_search_indexes(
    mysql_store: tuple[MySQLStore, Data], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store, data = mysql_store
    captured = Captured()
    api = Calls(store, captured)
    moved_to = await fresh_mysql(shards=SHARDS)  # where the change log's catch-up writes
    outbox = store.outbox()
    outbox.record_for("plans-node")  # the send batch writes its outbox row
    api.set_hook_node("plans-node")  # every message-storing call writes hook rows
    with monkeypatch.context() as patch:
        capture_mysql(patch, captured)
        made = await workload(api, data)
        await push_workload(api, data)
        await hook_workload(api, data)
        # the outbox's upkeep (gateway.outbox): lease, takeover of a lapsed node, clear
        await outbox.keep_lease("plans-node", 5_000)
        await outbox.keep_lease("dead-node", -1_000)
        assert await outbox.claim_lapsed("plans-node", 5_000) == ["dead-node"]
        leases = await outbox.leases()
        assert [(n, lease.live) for n, lease in sorted(leases.items())] == [
            ("dead-node", False), ("plans-node", True),
        ]  # fmt: skip
        assert await outbox.owed("dead-node", 200) == []
        assert await outbox.release("dead-node", "plans-node")
        owed = await outbox.owed("plans-node", 200)
        assert owed
        await outbox.clear([r.id for r in owed])
        # what the production store (Redis in front) calls besides the ChatStore API
        await api.member_rows(made["group"])
        assert await api.max_seq(made["p2p"]) > 0
        await api.seq_bounds(made["p2p"])
        now = store.now_ms()
        await api.flush_reads(
            [(data.group, data.group_member, 3, now), (made["group"], made["b"], 2, now)]
        )
        await api.flush_delivered([(data.group, data.group_member, "pc", 3, now)])
        assert await api.prune_dedup() == 0  # maintain() pruned the 48 h old ones
        assert (await api.prune(pause_s=0, budget_s=None)).done  # `imgw db prune`
        index = MySQLIndex(store.settings, clock=store.now_ms)
        await index.open()
        try:
            await archive_and_read(api, index, captured, (tmp_path / "arch").as_uri())
        finally:
            await index.close()
        media = MySQLMediaIndex(store.settings)
        await media.open()
        try:
            await media_workload(media, captured, data)
        finally:
            await media.close()
        await revocation_workload(store.revocations, captured, data)
        try:
            await move_catch_up(api, captured, data, moved_to)
        finally:
            await drop_mysql(moved_to)

    growing, plans = await mariadb_plans(store.settings, captured)
    assert growing >= {"im_send_dedup", "im_conv_member", "im_delivered", message_table(0)}
    verdict = check(captured, growing, lambda stmt: plans[stmt], mysql=True)
    assert_no_scans(verdict, growing, MYSQL_READS, api, MySQLStore)
