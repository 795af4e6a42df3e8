"""The gateway server: opens the backends, listens, and shuts down in a fixed order.

Shutdown (SIGTERM, SIGINT): stop accepting -> stop reading requests -> finish the
requests in flight and commit the send batcher -> KICK shutdown to every session ->
wait for the sockets to flush (bounded) -> close the backends. Nothing acked is lost
because nothing is acked before its commit.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from typing import Final

import structlog
import uvloop

from gateway.admin import AdminServer
from gateway.config import Config
from gateway.connection import State
from gateway.logs import configure
from gateway.node import Node
from protocol.ops import KickReason
from storage.factory import BackendError, Backends, open_backends
from storage.models import StoreUnavailable

BACKLOG: Final = 4096
FLUSH_WAIT_S: Final = 2.0


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Server:
    def __init__(self, config: Config, *, reuse_port: bool = False) -> None:
        self.config = config
        self.reuse_port = reuse_port
        self.node: Node | None = None
        self.backends: Backends | None = None
        self._server: asyncio.Server | None = None
        self._admin: AdminServer | None = None
        self._stopped = asyncio.Event()
        self.log = structlog.get_logger("imgw")

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        cfg = self.config
        self.backends = open_backends(cfg.store_url(), cfg.cache, cfg.bus)
        await self.backends.store.start()
        self._report_durability()
        node = self.node = Node(
            cfg,
            node_id=cfg.node_id or default_node_id(),
            store=self.backends.store,
            routes=self.backends.routes,
            bus=self.backends.bus,
        )
        await node.start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            node.protocol_factory,
            cfg.host,
            cfg.port,
            backlog=BACKLOG,
            reuse_address=True,
            reuse_port=self.reuse_port or None,
        )
        if cfg.admin_port:
            self._admin = AdminServer(node, cfg.host, cfg.admin_port)
            await self._admin.start()
        self.log.info(
            "imgw listening",
            host=cfg.host,
            port=self.port,
            node=node.node_id,
            store=cfg.store_url(),
            cache=cfg.cache,
            bus=cfg.bus,
            admin_port=cfg.admin_port or None,
        )

    def _report_durability(self) -> None:
        assert self.backends is not None
        settings = self.backends.store.durability()
        self.log.info("store durability", **settings)
        flush = settings.get("innodb_flush_log_at_trx_commit")
        if flush is not None and flush != "1":
            self.log.warning(
                "innodb_flush_log_at_trx_commit is not 1: a MySQL crash can lose "
                "acknowledged messages; set it to 1",
                innodb_flush_log_at_trx_commit=flush,
            )

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def shutdown(self, reason: KickReason = KickReason.SHUTDOWN) -> None:
        node = self.node
        if node is None or not node.accepting:
            return
        cfg = self.config
        started = time.monotonic()
        self.log.info("shutting down", sessions=len(node.sessions), reason=reason.name.lower())
        node.accepting = False
        if self._server is not None:
            self._server.close()
        conns = node.live_connections()
        for conn in conns:
            if conn.transport is not None and conn.state < State.CLOSING:
                conn.transport.pause_reading()
        # Finish what clients already sent: queued requests, then the batcher.
        inflight = [c.task for c in conns if c.task is not None]
        if inflight:
            await asyncio.wait(inflight, timeout=cfg.shutdown_timeout)
        try:
            await asyncio.wait_for(node.batcher.drain(), timeout=cfg.shutdown_timeout)
        except TimeoutError:
            self.log.error("send batcher did not drain in time", pending=node.batcher.pending)
        await node.settle()
        for conn in node.live_connections():
            conn.kick(reason, "server shutting down")
        deadline = time.monotonic() + FLUSH_WAIT_S
        while node.open_count > 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.05)
        await node.settle()
        node.wheel.stop()
        if self._admin is not None:
            await self._admin.close()
        assert self.backends is not None
        await self.backends.bus.close()
        await self.backends.routes.close()
        await self.backends.store.close()
        self.log.info("stopped", seconds=round(time.monotonic() - started, 3))
        self._stopped.set()


def run(config: Config) -> int:
    """Run a gateway until SIGTERM/SIGINT; the exit status."""
    configure(config.log_format, config.log_level)

    async def main() -> int:
        server = Server(config)
        try:
            await server.start()
        except (StoreUnavailable, BackendError, OSError) as e:
            structlog.get_logger("imgw").error("cannot start", error=str(e))
            if server.backends is not None:
                await server.backends.store.close()
            return 1
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: loop.create_task(server.shutdown()))
        await server.wait_stopped()
        return 0

    return uvloop.run(main())
