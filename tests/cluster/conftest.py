"""Gateway nodes as separate processes on the production backends (MariaDB, Redis,
RabbitMQ), each on its own port, sharing one fresh database, one Redis key prefix and
the broker. RabbitMQ is reached through a fault-injecting TCP proxy so that a test can
take the bus down and bring it back."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.client import Client
from tests.support.proc import GatewayProcess
from tests.support.services import (
    drop_mysql,
    drop_redis,
    fresh_mysql,
    fresh_redis_url,
    require_port,
)
from tests.support.tcpproxy import TcpProxy
from tests.support.wire import token

AMQP_PORT = 5672


@dataclass
class Cluster:
    root: Path
    store: str
    cache: str
    bus: str
    rabbit: TcpProxy
    nodes: list[GatewayProcess] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)
    links: dict[int, TcpProxy] = field(default_factory=dict)  # nodes with their own proxy

    async def start_node(self, *extra: str, own_link: bool = False) -> GatewayProcess:
        """Start one more node (in a thread: the RabbitMQ proxy runs on this loop). With
        `own_link`, its link to RabbitMQ goes through a proxy of its own
        (`self.links[i]`), so that a test can cut this node alone off the bus."""
        i = len(self.nodes)
        bus = self.bus
        if own_link:
            proxy = self.links[i] = TcpProxy("127.0.0.1", AMQP_PORT)
            port = await proxy.start()
            bus = bus.replace(f":{self.rabbit.port}/", f":{port}/")
        node = GatewayProcess(
            self.root / f"n{i}",
            None,
            "--store", self.store, "--cache", self.cache, "--bus", bus,
            "--node-id", f"n{i}-{secrets.token_hex(3)}", "--sync-hint-spread", "0.5",
            "--drain-rate", "200", *extra,
        )  # fmt: skip
        self.nodes.append(node)
        await asyncio.to_thread(node.start, 30)
        return node

    def addr(self, i: int) -> str:
        return f"127.0.0.1:{self.nodes[i].port}"

    def client(self, uid: int, first: int, device: str = "d") -> Client:
        """A client whose address list starts at node `first` and goes on round the rest."""
        n = len(self.nodes)
        addrs = ",".join(self.addr((first + k) % n) for k in range(n))
        c = Client(
            addrs, uid, device, token(uid, device), backoff_base=0.05, backoff_cap=0.5,
            request_timeout=5, send_retry_s=30,
        )  # fmt: skip
        self.clients.append(c)
        return c


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    require_port(AMQP_PORT, "RabbitMQ")
    store = await fresh_mysql()
    cache = fresh_redis_url()
    proxy = TcpProxy("127.0.0.1", AMQP_PORT)
    port = await proxy.start()
    bus = f"amqp://guest:guest@127.0.0.1:{port}/?expires_s=30&publish_timeout_s=0.5"
    c = Cluster(tmp_path, store, cache, bus, proxy)
    try:
        yield c
    finally:
        for client in c.clients:
            await client.close()
        for node in c.nodes:
            node.kill()
        await proxy.close()
        for link in c.links.values():
            await link.close()
        await drop_mysql(store)
        await drop_redis(cache)


@pytest.fixture
async def three(cluster: Cluster) -> Cluster:
    await asyncio.gather(*(cluster.start_node() for _ in range(3)))
    return cluster
