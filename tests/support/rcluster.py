"""Operating the tests' Redis Cluster (tests/support/services.py starts it): who owns a
slot, moving a slot from one master to another the way `redis-cli --cluster reshard`
does, and wiping one master's data (FLUSHALL, a restart without persistence, or a new
empty node in its place)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.support.services import CLUSTER_PORTS

HOST = "127.0.0.1"


@asynccontextmanager
async def node(port: int) -> AsyncIterator[aioredis.Redis]:
    """A plain (non-cluster) connection to one node, for CLUSTER commands."""
    client = aioredis.Redis(host=HOST, port=port, socket_timeout=10, retry=Retry(NoBackoff(), 0))
    try:
        yield client
    finally:
        await client.aclose()


def slot_of(tag: str | int) -> int:
    return int(key_slot(str(tag).encode()))


async def node_id(port: int) -> str:
    async with node(port) as c:
        raw = await c.execute_command("CLUSTER", "MYID")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def owner(slot: int) -> int:
    """The port of the master that serves `slot`, as the cluster says."""
    async with node(CLUSTER_PORTS[0]) as c:
        ranges = await c.execute_command("CLUSTER", "SLOTS")
    for r in ranges:
        if int(r[0]) <= slot <= int(r[1]):
            return int(r[2][1])
    raise AssertionError(f"slot {slot} is not served")


async def keys_in(port: int, slot: int) -> int:
    async with node(port) as c:
        return int(await c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))


async def migrate_slot(slot: int, to_port: int, *, asking_s: float = 0.2) -> int:
    """Move `slot` to the master on `to_port` while clients use it: IMPORTING on the
    target, MIGRATING on the source, then (after `asking_s`, while new keys of the slot
    are answered ASK) MIGRATE its keys in batches, then SETSLOT NODE on every master
    (from then on the source answers MOVED). Returns how many keys moved."""
    from_port = await owner(slot)
    if from_port == to_port:
        return 0
    src_id, dst_id = await node_id(from_port), await node_id(to_port)
    moved = 0
    async with node(from_port) as src, node(to_port) as dst:
        await dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        await src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        await asyncio.sleep(asking_s)
        while True:
            keys = await src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            await src.execute_command("MIGRATE", HOST, to_port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        await dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        await src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    for port in CLUSTER_PORTS:
        if port not in (from_port, to_port):
            async with node(port) as other:
                await other.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return moved


async def another_master(port: int) -> int:
    return next(p for p in CLUSTER_PORTS if p != port)


async def flush_master(port: int) -> None:
    """One master loses every key it holds (as a restart without persistence, or a
    failover to an empty replica, would); the others keep theirs."""
    async with node(port) as c:
        await c.flushall()


async def restart_empty(port: int, *, new_node: bool = False, down_s: float = 0.3) -> None:
    """The master on `port` dies (SHUTDOWN NOSAVE: its data is gone, its clients' connections
    reset) and `down_s` later an empty master serves its slots on the same port: itself
    again from its nodes.conf (same node id and slots: a master without persistence
    restarted by its supervisor), or with `new_node` a new node (new id, no nodes.conf)
    that the others forget the old one for and that takes over its slots, as an empty
    replacement would. Returns once the cluster answers ok again."""
    old_id = await node_id(port)
    async with node(CLUSTER_PORTS[0] if port != CLUSTER_PORTS[0] else CLUSTER_PORTS[1]) as c:
        ranges = [
            (int(r[0]), int(r[1]))
            for r in await c.execute_command("CLUSTER", "SLOTS")
            if int(r[2][1]) == port
        ]
    async with node(port) as c:
        directory = str((await c.config_get("dir"))["dir"])
        logfile = str((await c.config_get("logfile"))["logfile"])
        with contextlib.suppress(RedisConnectionError, OSError):  # it hangs up as it exits
            await c.execute_command("SHUTDOWN", "NOSAVE")
    deadline = time.monotonic() + 10
    while await _answers(port):
        assert time.monotonic() < deadline, f"node {port} did not stop"
        await asyncio.sleep(0.05)
    await asyncio.sleep(down_s)
    if new_node:
        (Path(directory) / "nodes.conf").unlink(missing_ok=True)
    args = ["--port", str(port), "--bind", HOST, "--cluster-enabled", "yes"]
    args += ["--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"]
    args += ["--save", "", "--appendonly", "no", "--dir", directory, "--daemonize", "yes"]
    if logfile:
        args += ["--logfile", logfile]
    server = await asyncio.create_subprocess_exec("redis-server", *args)
    assert await server.wait() == 0, f"redis-server on {port} did not start"
    while not await _answers(port):
        assert time.monotonic() < deadline + 10, f"node {port} did not come back"
        await asyncio.sleep(0.05)
    if new_node:
        assert await node_id(port) != old_id
        others = [p for p in CLUSTER_PORTS if p != port]
        for other in others:
            async with node(other) as c:
                await c.execute_command("CLUSTER", "FORGET", old_id)
        async with node(port) as c:
            for first, last in ranges:
                await c.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            await c.execute_command("CLUSTER", "BUMPEPOCH")
            await c.execute_command("CLUSTER", "MEET", HOST, others[0])
    while not await _cluster_ok():
        assert time.monotonic() < deadline + 20, f"the cluster is not ok after {port} came back"
        await asyncio.sleep(0.05)


async def _answers(port: int) -> bool:
    """Whether anything listens on `port` (no client retries: a refusal is an answer)."""
    try:
        _, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return False
    writer.close()
    return True


async def _cluster_ok() -> bool:
    for port in CLUSTER_PORTS:
        try:
            async with node(port) as c:
                info = await c.execute_command("CLUSTER", "INFO")
        except (RedisConnectionError, OSError):
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        known = f"cluster_known_nodes:{len(CLUSTER_PORTS)}"
        if "cluster_state:ok" not in text or known not in text:
            return False
    return True
