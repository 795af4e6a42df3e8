"""The Redis Cluster rule: every command and script of the Redis adapters touches one
hash slot, so it runs on Redis Cluster (a command whose keys span slots is refused with
CROSSSLOT). Checked without a server: every adapter operation runs on a cluster client
that records each command it would send (through the adapters' real code: their key
builders, `raw.run`, the script runner) and refuses to send it; then the keys of each
recorded command are hashed with redis-py's CRC16 (`redis.crc.key_slot`).

tests/redis/test_cluster.py runs the same operations on a real 3-master cluster."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.commands.core import AsyncScript
from redis.crc import key_slot
from redis.exceptions import RedisError

from storage.errors import CacheUnavailable
from storage.models import Route, SentRecord, StoredMessage
from storage.redis import MemberSnapshot, RedisCache, RedisRouteStore
from storage.redis.budgets import RedisRateBudgets
from storage.redis.lease import WorkerIdLease
from storage.redis.recent import RecentCache

PREFIX = "imgw:t1:"  # a prefix goes before each key's tag
BIG = 2**63 - 1


class Refused(RedisError):
    """What the recording client answers instead of sending."""


class RecordingPipeline(ClusterPipeline):
    def __init__(self, client: Recorder) -> None:
        super().__init__(client)
        self._recorder = client

    async def initialize(self) -> RecordingPipeline:
        return self

    async def __aenter__(self) -> RecordingPipeline:
        return self

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self._recorder.sent.append((True, args))
        return self

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        raise Refused("recorded, not sent")


MASTERS = [ClusterNode("127.0.0.1", p) for p in (7101, 7102, 7103)]


def master_of(slot: int) -> ClusterNode:
    """The slot map of `redis-cli --cluster create` with three masters."""
    return MASTERS[0 if slot <= 5460 else 1 if slot <= 10922 else 2]


class Recorder(RedisCluster):
    """A cluster client that records what it would send: (in a pipeline?, args). Its
    slot map is three masters' (`master_of`)."""

    def __init__(self) -> None:
        super().__init__(host="127.0.0.1", port=1)  # never connected
        self.sent: list[tuple[bool, tuple[Any, ...]]] = []
        self.scripts: list[AsyncScript] = []
        self.nodes_manager.slots_cache = {s: [master_of(s)] for s in range(16384)}

    def get_primaries(self) -> list[ClusterNode]:
        return MASTERS

    def register_script(self, script: Any) -> AsyncScript:
        s = super().register_script(script)
        self.scripts.append(s)
        return s

    async def initialize(self, *args: Any, **kwargs: Any) -> Recorder:
        return self

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self.sent.append((False, args))
        raise Refused("recorded, not sent")

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> RecordingPipeline:
        return RecordingPipeline(self)


def _text(a: Any) -> str:
    return a.decode() if isinstance(a, bytes) else str(a)


def keys_of(args: Sequence[Any]) -> list[str]:
    """The keys of a command as Redis Cluster reads them."""
    name = _text(args[0]).upper()
    if name in ("EVALSHA", "EVAL"):
        n = int(args[2])
        return [_text(k) for k in args[3 : 3 + n]]
    if name in ("DEL", "UNLINK", "MGET", "EXISTS"):
        return [_text(k) for k in args[1:]]
    return [_text(args[1])]


ROUTE = Route(BIG, "ios:tablet{x}", "node-a|1", 77, 12)
MSGS = [StoredMessage(c, s, 1, 2, 1, b"x", 1, "m") for c in (1, 5, BIG) for s in (1, 2, 3)]

Stores = tuple[RedisRouteStore, RedisCache, RecentCache, WorkerIdLease, RedisRateBudgets]
Op = Callable[[RedisRouteStore, RedisCache, RecentCache, WorkerIdLease, RedisRateBudgets], Any]

OPS: list[tuple[str, Op]] = [
    ("route register", lambda r, c, rc, le, b: r.register(ROUTE, iat=5)),
    ("route renew", lambda r, c, rc, le, b: r.renew([ROUTE, Route(3, "web", "n", 1, 1)])),
    ("route remove", lambda r, c, rc, le, b: r.remove(ROUTE)),
    ("route get", lambda r, c, rc, le, b: r.get(BIG, "ios")),
    ("route ttl", lambda r, c, rc, le, b: r.ttl(BIG, "ios")),
    ("route online", lambda r, c, rc, le, b: r.online([1, 2, BIG])),
    ("revoke", lambda r, c, rc, le, b: r.revoke(BIG, None, 5, 60)),
    ("revoke device", lambda r, c, rc, le, b: r.revoke(BIG, "ios", 5, 60)),
    ("marker", lambda r, c, rc, le, b: r.mark("node-a")),
    ("dedup get", lambda r, c, rc, le, b: c.get_sent(BIG, "cm:{1}")),
    (
        "dedup put",
        lambda r, c, rc, le, b: c.put_sent(
            [SentRecord(u, "cm", 1, 1, 1, 1, 1, b"d") for u in (1, 2, BIG)]
        ),
    ),
    ("members get", lambda r, c, rc, le, b: c.get_members(BIG)),
    (
        "members put",
        lambda r, c, rc, le, b: c.put_members(MemberSnapshot(BIG, 3, {1: (1, None)}, [1])),
    ),
    ("members drop", lambda r, c, rc, le, b: c.drop_members(BIG)),
    ("read advance", lambda r, c, rc, le, b: c.advance_read(BIG, 4, 9)),
    ("read get", lambda r, c, rc, le, b: c.get_reads(4, [1, BIG])),
    ("delivered advance", lambda r, c, rc, le, b: c.advance_delivered(BIG, 4, "ios", 9)),
    ("delivered get", lambda r, c, rc, le, b: c.get_delivered(4, "ios", [1, BIG])),
    ("recent add", lambda r, c, rc, le, b: rc.add(MSGS)),
    ("recent range", lambda r, c, rc, le, b: rc.range(BIG, 1, 9)),
    ("recent forget", lambda r, c, rc, le, b: rc.forget_upto(BIG, 2)),
    ("lease acquire", lambda r, c, rc, le, b: le.acquire()),
    ("lease renew", lambda r, c, rc, le, b: le.renew()),
    ("lease release", lambda r, c, rc, le, b: le.release()),
    (
        "rate budget",
        lambda r, c, rc, le, b: b.spend("send", {1: 1, BIG: 2}, burst=5, rate=1.0, now_ms=1),
    ),
]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def stores(client: Recorder) -> Stores:
    lease = WorkerIdLease(client, prefix=PREFIX, owner="me")
    lease.worker_id = 5  # as after an acquire: renew and release send their scripts
    return (
        RedisRouteStore(client, prefix=PREFIX),
        RedisCache(client, prefix=PREFIX),
        RecentCache(client, prefix=PREFIX),
        lease,
        RedisRateBudgets(client, prefix=PREFIX),
    )


TAG = re.compile(r"\{([^}]+)\}")


@pytest.mark.parametrize(("what", "op"), OPS, ids=[what for what, _ in OPS])
async def test_each_command_touches_one_slot(recorder: Recorder, what: str, op: Op) -> None:
    with pytest.raises(CacheUnavailable):
        await op(*stores(recorder))
    commands = [args for _, args in recorder.sent if _text(args[0]).upper() != "SCRIPT"]
    assert commands, f"{what} sent nothing"
    for args in commands:
        keys = keys_of(args)
        assert keys, args
        for key in keys:
            assert key.startswith(PREFIX), key
            # the slot is the tag's (the first `{…}` of the key: never one in the prefix)
            tag = TAG.search(key)
            assert tag is not None and tag.start() >= len(PREFIX), f"{what}: {key} has no tag"
            assert key_slot(key.encode()) == key_slot(tag.group(1).encode())
        slots = {key_slot(k.encode()) for k in keys}
        assert len(slots) == 1, f"{what}: {args[0]!r} touches slots {sorted(slots)}: {keys}"


async def test_every_script_is_checked(recorder: Recorder) -> None:
    """The list above runs every script the adapters register (a new script must be added
    to it)."""
    s = stores(recorder)
    for _, op in OPS:
        with pytest.raises(CacheUnavailable):
            await op(*s)
    called = {_text(args[1]) for _, args in recorder.sent if _text(args[0]).upper() == "EVALSHA"}
    registered = {script.sha for script in recorder.scripts}
    assert registered - called == set()


def test_the_same_uid_shares_a_slot() -> None:
    """A uid's route, index and revocations share its slot (one script touches all three),
    whatever the prefix and device."""
    r = RedisRouteStore(Recorder(), prefix=PREFIX)
    for uid in (0, 1, 12345, BIG):
        keys = [r.route_key(uid, "a:{b}"), r.online_key(uid), r.revoked_key(uid)]
        assert len({key_slot(k.encode()) for k in keys}) == 1


async def test_one_marker_on_each_master(recorder: Recorder) -> None:
    """The node's loss marker: one key on each master (routes/markers are lost per
    master), each the same at every check while the slot map stays."""
    routes = RedisRouteStore(recorder, prefix=PREFIX)
    keys = routes.marker_keys(recorder, "node-a")
    assert keys == routes.marker_keys(recorder, "node-a")
    assert sorted(master_of(key_slot(k.encode())).port for k in keys) == [7101, 7102, 7103]
