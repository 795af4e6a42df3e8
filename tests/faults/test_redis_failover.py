"""Two gateways on MySQL + RabbitMQ + a replicated Redis, a sender on one and its
receiver on the other, under traffic, while the Redis master holding the receiver's
route fails over to its replica:

- Redis Cluster, 3 masters each with a replica (`scripts/redis-cluster --replicas 1`):
  the master killed with SIGKILL (the cluster promotes the replica by itself once
  `cluster-node-timeout`, 2 s, has passed), or a manual `CLUSTER FAILOVER`;
- one master and its replica watched by three Sentinels (`scripts/redis-sentinel`):
  the master killed (down after 1 s, then promoted by a quorum of 2), or `SENTINEL
  FAILOVER`.

The invariants: every acked message is stored once and reaches the online receiver
(pushed, or pulled after the SYNC_HINT the gateway sends when it may have missed a
push); the receiver's route is there after the failover; and pushes resume soon after
the promotion, which is measured."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.server import Server
from storage.errors import CacheUnavailable
from tests.conftest import make_config as gateway_config
from tests.faults.test_redis_cluster import RECEIVER, traffic_through
from tests.support import rcluster
from tests.support.services import (
    REPLICATED_CLUSTER_PORTS,
    REPLICATED_CLUSTER_URL,
    SENTINEL_PORTS,
    SENTINEL_URL,
    drop_mysql,
    drop_redis,
    fresh_mysql,
    require_port,
    start_replicated_cluster,
    start_sentinels,
    with_prefix,
)

# From the promotion (the surviving masters' slot map names the replica) to the first
# PUSH the receiver gets after it. The cluster client refreshes its slot map at most
# once a second after a connection error, so about one refresh interval, plus the
# route checks of a loaded 2-core machine.
RESUME_WITHIN_S = 2.5


@pytest.fixture
def replicated_cluster() -> Generator[str, None, None]:
    """The 3-master, 3-replica cluster, whole: started afresh when an earlier test left a
    master dead. Not stopped at the end (the next run reuses it; `scripts/redis-cluster
    --replicas 1 stop` stops it)."""
    try:
        start_replicated_cluster()
    except RuntimeError as e:
        pytest.fail(f"the replicated Redis Cluster did not start: {e}", pytrace=False)
    yield REPLICATED_CLUSTER_URL


AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


@asynccontextmanager
async def two_nodes(tmp_path: Path, cache_base: str) -> AsyncIterator[tuple[Server, Server]]:
    """Two gateways sharing a fresh MySQL database, a private prefix on the Redis of
    `cache_base`, and RabbitMQ."""
    require_port(5672, "RabbitMQ")
    mysql_url = await fresh_mysql()
    cache_url = with_prefix(cache_base)
    run = secrets.token_hex(3)
    servers = [
        Server(
            gateway_config(
                tmp_path / name,
                node_id=f"failover-{name}-{run}",
                store=mysql_url,
                cache=cache_url,
                bus=AMQP_URL,
                rate_burst=10_000,
                rate_per_s=10_000,
                sync_hint_spread_s=0.2,  # the hints reach the receiver within the test
            )
        )
        for name in ("a", "b")
    ]
    started: list[Server] = []
    try:
        for server in servers:
            await server.start()
            started.append(server)
        yield servers[0], servers[1]
    finally:
        for server in started:
            await server.shutdown()
        await drop_mysql(mysql_url)
        await drop_redis(cache_url)


@pytest.fixture
async def cluster_nodes(
    tmp_path: Path, replicated_cluster: str
) -> AsyncIterator[tuple[Server, Server]]:
    async with two_nodes(tmp_path, replicated_cluster) as servers:
        yield servers


@pytest.fixture
async def sentinel_nodes(tmp_path: Path) -> AsyncIterator[tuple[Server, Server]]:
    """Two gateways on the master that the Sentinels of scripts/redis-sentinel name
    (started afresh when an earlier test left its master dead)."""
    try:
        start_sentinels()
    except RuntimeError as e:
        pytest.fail(f"the Redis Sentinel setup did not start: {e}", pytrace=False)
    async with two_nodes(tmp_path, SENTINEL_URL) as servers:
        yield servers


async def _slots(port: int) -> list[tuple[int, int, int, list[int]]]:
    """CLUSTER SLOTS as (first, last, master port, replica ports)."""
    async with rcluster.node(port) as c:
        ranges = await c.execute_command("CLUSTER", "SLOTS")
    return [(int(r[0]), int(r[1]), int(r[2][1]), [int(n[1]) for n in r[3:]]) for r in ranges]


async def _master_and_replica(slot: int) -> tuple[int, int]:
    """The master of `slot` and its replica, once every node lists the replica (a
    cluster just created takes a moment to gossip its replicas)."""
    deadline = time.monotonic() + 10
    while True:
        views = set()
        for port in REPLICATED_CLUSTER_PORTS:
            for first, last, master, replicas in await _slots(port):
                if first <= slot <= last:
                    views.add((master, replicas[0] if replicas else 0))
        if len(views) == 1 and (view := views.pop())[1]:
            return view
        assert time.monotonic() < deadline, f"slot {slot}: no agreed master and replica"
        await asyncio.sleep(0.1)


async def _pid(port: int) -> int:
    async with rcluster.node(port) as c:
        info = await c.info("server")
    return int(info["process_id"])


async def _route_is_there(server: Server) -> bool:
    """Whether the receiver's route is in the cluster (waiting up to 5 s for it)."""
    node = server.node
    assert node is not None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if await node.routes.get(RECEIVER, "d") is not None:
                return True
        except CacheUnavailable:
            pass
        await asyncio.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["kill", "manual"])
async def test_pushes_resume_when_a_cluster_replica_takes_over(
    cluster_nodes: tuple[Server, Server], how: str
) -> None:
    """The master of the receiver's route slot fails over to its replica."""
    slot = rcluster.slot_of(RECEIVER)
    master, replica = await _master_and_replica(slot)
    survivor = next(p for p in REPLICATED_CLUSTER_PORTS if p not in (master, replica))

    async def fail_over() -> None:
        if how == "kill":
            os.kill(await _pid(master), signal.SIGKILL)
        else:
            async with rcluster.node(replica) as c:
                await c.execute_command("CLUSTER", "FAILOVER")

    async def promoted() -> bool:
        return any(f <= slot <= la and m == replica for f, la, m, _ in await _slots(survivor))

    await _check_failover(cluster_nodes, how, fail_over, promoted)


@pytest.mark.parametrize("how", ["kill", "manual"])
async def test_pushes_resume_when_sentinels_promote_the_replica(
    sentinel_nodes: tuple[Server, Server], how: str
) -> None:
    """The one Redis master fails over to its replica: killed (the Sentinels agree it is
    down after 1 s and promote the replica), or `SENTINEL FAILOVER` (the old master
    becomes a replica and answers writes READONLY)."""
    master = await _sentinel_master()

    async def fail_over() -> None:
        if how == "kill":
            os.kill(await _pid(master), signal.SIGKILL)
        else:
            async with rcluster.node(SENTINEL_PORTS[0]) as c:
                await c.execute_command("SENTINEL", "FAILOVER", "imgw")

    async def promoted() -> bool:
        return await _sentinel_master() != master

    await _check_failover(sentinel_nodes, how, fail_over, promoted)


async def _sentinel_master() -> int:
    async with rcluster.node(SENTINEL_PORTS[0]) as c:
        _, port = await c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "imgw")
    return int(port)


async def _check_failover(
    nodes: tuple[Server, Server],
    how: str,
    fail_over: Callable[[], Awaitable[None]],
    promoted: Callable[[], Awaitable[bool]],
) -> None:
    """Traffic from a sender on one node to a receiver on the other through
    `fail_over`; then: no acked message lost or pushed wrong (traffic_through), pushes
    resumed within RESUME_WITHIN_S of `promoted()` turning true, and the receiver's
    route there."""
    sending, receiving = nodes
    times: dict[str, float] = {}

    async def fault() -> None:
        times["fault"] = time.monotonic()
        await fail_over()
        deadline = time.monotonic() + 20
        while True:
            try:
                if await promoted():
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no replica was promoted in 20 s"
            await asyncio.sleep(0.02)
        times["promoted"] = time.monotonic()

    receiver, acked, _ = await traffic_through(sending, fault, receive_on=receiving)
    promoted_at, fault_at = times["promoted"], times["fault"]
    after = [t for t in receiver.pushed_at if t >= promoted_at]
    assert after, "no push reached the receiver after the promotion"
    resumed_s = after[0] - promoted_at
    before = [t for t in receiver.pushed_at if t <= fault_at]
    gap_s = after[0] - (before[-1] if before else fault_at)
    print(
        f"\n{how}: promoted {promoted_at - fault_at:.2f} s after the fault; pushes resumed "
        f"{resumed_s:.2f} s after the promotion (no push for {gap_s:.2f} s); "
        f"{len(acked)} acked, {len(acked) - len(receiver.pushed)} pulled after "
        f"{receiver.hints} hints"
    )
    assert resumed_s < RESUME_WITHIN_S, f"pushes resumed {resumed_s:.2f} s after the promotion"
    if how == "manual":  # coordinated: the old master hands over, nothing is down for long
        assert len(receiver.pushed) >= 0.9 * len(acked), "a manual failover cost pushes"
    assert await _route_is_there(sending), "the receiver's route was not registered again"
