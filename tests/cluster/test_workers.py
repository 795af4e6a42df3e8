"""`imgw serve --workers N`: workers share the port, each leases its own snowflake worker
id, a crashed worker is restarted by the supervisor, SIGTERM drains all and exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from storage.redis import redis_from_url
from tests.cluster.conftest import Cluster
from tests.support.proc import GatewayProcess
from tests.support.wire import Wire


def children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


def alive(pid: int) -> bool:
    """Running (not exited, and not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def listening(pid: int, port: int) -> int:
    """How many sockets listening on `port` process `pid` holds."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                inodes.add(f[9])
    fds = Path(f"/proc/{pid}/fd")
    held = 0
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            held += 1
    return held


async def wait_for(what: str, check, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def leased_ids(cache_url: str) -> dict[str, str]:
    client, prefix = redis_from_url(cache_url)
    try:
        keys = {k async for k in client.scan_iter(match=f"{prefix}{{wid}}:*")}
        return {k.decode(): (await client.get(k)).decode() for k in keys}
    finally:
        await client.aclose()


async def test_supervisor_restarts_a_killed_worker_and_drains_on_sigterm(
    cluster: Cluster,
) -> None:
    sup = GatewayProcess(
        cluster.root / "sup", None,
        "--store", cluster.store, "--cache", cluster.cache, "--bus", cluster.bus,
        "--workers", "2", "--node-id", "sup", "--drain-rate", "0",
    )  # fmt: skip
    cluster.nodes.append(sup)
    await asyncio.to_thread(sup.start, 30)
    assert sup.proc is not None
    workers = await wait_for(
        "two workers", lambda: (c := children(sup.proc.pid)) and len(c) == 2 and c
    )  # type: ignore[union-attr]
    leases = await wait_for_async_leases(cluster.cache, 2)
    assert len(set(leases)) == 2 and len(set(leases.values())) == 2  # distinct ids, owners
    # The supervisor bound each worker's socket before starting it, and kept no copy.
    assert listening(sup.proc.pid, sup.port) == 0
    assert [listening(pid, sup.port) for pid in workers] == [1, 1]

    sessions = [await Wire.login(sup.port, uid, "d") for uid in range(1, 7)]
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    replaced = await wait_for(
        "a replacement worker",
        lambda: (c := children(sup.proc.pid)) and len(c) == 2 and victim not in c and c,  # type: ignore[union-attr]
    )
    assert replaced - workers, "a new worker process took the killed one's place"
    again = await Wire.login(sup.port, 99, "d")  # the port still serves
    await again.close()

    sup.signal(signal.SIGTERM)
    assert await asyncio.to_thread(sup.wait, 30) == 0
    assert not any(alive(pid) for pid in replaced)
    for w in sessions:
        await w.close()


async def wait_for_async_leases(cache_url: str, n: int, timeout: float = 20.0) -> dict[str, str]:
    async with asyncio.timeout(timeout):
        while len(leases := await leased_ids(cache_url)) < n:  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.1)
    return leases
