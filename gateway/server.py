"""The gateway server: opens the backends, listens, and shuts down in a fixed order.

The client port is bound first, before the backends are opened, and accepted from once
they are (gateway/net/listen.py): a client that connects meanwhile waits instead of being
refused.

Drain (SIGTERM, SIGINT, `imgw drain`): stop accepting -> KICK draining (with the
reconnect hint) to the sessions at `drain_rate` per second, the others keep working
meanwhile -> stop reading what is left -> finish the requests in flight and commit the
send batcher -> close the rest -> wait for the sockets to flush (bounded) -> close the
backends. Nothing acked is lost because nothing is acked before its commit; a send whose
ack a kicked client did not see is retried by it on another node and answered from the
idempotency record.

With a Redis cache the node leases its snowflake worker id there (storage.redis.lease)
and keeps it renewed; else it uses worker id 0 (one process per store).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import signal
import socket
import ssl
import time
from collections.abc import Sequence
from typing import Any, Final

import structlog
import uvloop

from gateway.config import REDIS_URLS, Config, ConfigError
from gateway.connection import Connection
from gateway.gctune import quiet_gc
from gateway.http.admin import AdminServer
from gateway.http.media import MediaListener
from gateway.logs import configure
from gateway.media import Media
from gateway.net.fdtransport import FdServer
from gateway.net.hostport import split_host_port
from gateway.net.listen import BACKLOG, bind_listener
from gateway.net.openfiles import connection_cap, raise_nofile
from gateway.net.tls import CHECK_EVERY_S, CertificateWatch, summary
from gateway.net.websocket import WS_PATH, WsPolicy, WsTransport, load_pages
from gateway.node import PACE_STEP_S, Node, due_by
from gateway.periodic import Periodic
from gateway.redact import config_secrets, redact_url, remember
from protocol.ops import KickReason
from storage.errors import BackendUnavailable
from storage.factory import Backends, open_backends
from storage.redis.lease import WorkerIdLease
from storage.snowflake import Snowflake

FLUSH_WAIT_S: Final = 2.0
ADMIN_BIND_WAIT_S: Final = 5.0  # how long a starting node waits for its admin port
ADMIN_BIND_STEP_S: Final = 0.1
LEASE_ATTEMPTS: Final = 3  # a starting node's tries for its snowflake worker id


def default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Server:
    """`listener`: the client port's socket, bound already (a supervisor's first start of
    its workers). Without one a single node binds it first thing in `start`, before
    its backends are opened, and a worker (`reuse_port`) binds it once it is ready
    (gateway/net/listen.py says why)."""

    def __init__(
        self,
        config: Config,
        *,
        reuse_port: bool = False,
        listener: socket.socket | None = None,
    ) -> None:
        self.config = config
        self.reuse_port = reuse_port
        self._listener = listener
        self.node: Node | None = None
        self.backends: Backends | None = None
        self._server: asyncio.Server | FdServer | None = None
        self._ws_server: asyncio.Server | FdServer | None = None  # --ws-listen
        self.ws_url = ""  # ws://host:port/ws once it listens
        self._admin: AdminServer | None = None
        self.media_http: MediaListener | None = None  # --media-listen
        self.media_base = ""  # the signed URLs' base, when media_http serves them
        self.cert_watch: CertificateWatch | None = None  # with --tls-cert
        self._cert_checks: Periodic | None = None
        self._lease: WorkerIdLease | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None  # an admin drain
        self.ids = Snowflake(0)
        self._stopped = asyncio.Event()
        self.log = structlog.get_logger("imgw")

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def ws_port(self) -> int:
        """The WebSocket listener's port (--ws-listen)."""
        assert self._ws_server is not None
        return int(self._ws_server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        cfg = self.config
        if self._listener is None and not self.reuse_port:
            self._listener = bind_listener(cfg.host, cfg.port, reuse_port=False, backlog=BACKLOG)
        try:
            await self._start()
        except BaseException:
            if self._listener is not None:
                self._listener.close()  # what waits in its backlog is reset
            raise

    async def _start(self) -> None:
        cfg = self.config
        nofile = raise_nofile()
        node_id = cfg.node_id or default_node_id()
        if cfg.cache.startswith(REDIS_URLS):
            await self._lease_worker_id(node_id)
        self.backends = open_backends(cfg.store_url(), cfg.cache, cfg.bus, ids=self.ids)
        await self.backends.store.start()
        self._report_durability()
        node = self.node = Node(
            cfg,
            node_id=node_id,
            store=self.backends.store,
            routes=self.backends.routes,
            bus=self.backends.bus,
            budgets=self.backends.budgets,
        )
        if cfg.media:
            await self._start_media(node)
        await node.start()
        node.max_connections = connection_cap(cfg.max_connections, nofile)
        self._report_connection_cap(nofile)
        if cfg.admin_port:
            # Before the client port serves: a node that cannot bind it fails without
            # having taken a client.
            self._admin = AdminServer(
                node,
                cfg.admin_host,
                cfg.admin_port,
                on_drain=self._drain_soon,
                token=cfg.admin_token,
                api_keys=cfg.api_keys,
            )
            await self._bind_admin(self._admin)
        loop = asyncio.get_running_loop()
        tls = cfg.tls_context()
        if tls is not None:
            self.cert_watch = CertificateWatch(cfg.tls_cert, self.log, node.metrics)
            self.cert_watch.serve(tls)
        # The socket bound before the backends (take what waits in it), else bind now.
        listener = self._listener
        bare = cfg.client_transport == "fd" and tls is None
        if listener is None and bare:
            listener = bind_listener(
                cfg.host, cfg.port, reuse_port=self.reuse_port, backlog=BACKLOG
            )
        if bare and listener is not None:
            # --client-transport fd: connections as bare file descriptors
            # (gateway/net/fdtransport.py), about 530 bytes fewer each than uvloop's.
            fd_server = FdServer(loop, listener, node.protocol_factory)
            fd_server.start()
            self._server = fd_server
        else:
            where: dict[str, Any] = (
                {"sock": listener}
                if listener is not None
                else {"host": cfg.host, "port": cfg.port, "reuse_address": True,
                      "reuse_port": self.reuse_port or None}
            )  # fmt: skip
            self._server = await loop.create_server(
                node.protocol_factory,
                backlog=BACKLOG,
                ssl=tls,
                ssl_handshake_timeout=cfg.login_timeout if cfg.tls_cert else None,
                **where,
            )
        if cfg.ws_listen:
            await self._start_ws(node, tls)
        if self.cert_watch is not None:
            self.cert_watch.started()
            self._cert_checks = Periodic(
                CHECK_EVERY_S, self.cert_watch.check_async, log=self.log,
                failed="TLS certificate check failed",
            )  # fmt: skip
            self._cert_checks.start()
        self._report_listening()

    def _report_listening(self) -> None:
        """The start's summary: where clients connect, on which backends and with which
        features, every URL without its credentials (gateway.redact)."""
        cfg, node = self.config, self.node
        assert node is not None
        self.log.info(
            "imgw listening",
            host=cfg.host,
            port=self.port,
            tls=summary(self.cert_watch.info) if self.cert_watch is not None else None,
            ws=self.ws_url or None,
            node=node.node_id,
            store=redact_url(cfg.store_url()),
            cache=redact_url(cfg.cache),
            bus=redact_url(cfg.bus),
            media=redact_url(cfg.media) or None,
            media_urls=self.media_base or None,
            notify=redact_url(cfg.notify_url) or None,
            check=redact_url(cfg.check_url) or None,
            admin_port=cfg.admin_port or None,
        )

    async def _start_ws(self, node: Node, tls: ssl.SSLContext | None) -> None:
        """The WebSocket listener (gateway/net/websocket.py): bare file descriptors like the
        client port, uvloop's transports with TLS."""
        cfg = self.config
        host, port = split_host_port(cfg.ws_listen, any_port=True)
        origins = cfg.ws_origin_set()
        policy = WsPolicy(max_frame=cfg.max_frame, origins=origins, pages=load_pages())

        def factory() -> WsTransport:
            return WsTransport(Connection(node), policy)

        loop = asyncio.get_running_loop()
        if tls is None:
            sock = bind_listener(host, port, reuse_port=self.reuse_port, backlog=BACKLOG)
            if sock is None:
                raise ConfigError(f"ws_listen {cfg.ws_listen}: names several addresses")
            ws_server = FdServer(loop, sock, factory)
            ws_server.start()
            self._ws_server = ws_server
        else:
            self._ws_server = await loop.create_server(
                factory, host, port, backlog=BACKLOG, ssl=tls, reuse_address=True,
                reuse_port=self.reuse_port or None, ssl_handshake_timeout=cfg.login_timeout,
            )  # fmt: skip
        bound = self._ws_server.sockets[0].getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.ws_url = f"{'wss' if tls else 'ws'}://{shown}:{bound[1]}{WS_PATH}"
        if origins is None:
            allowed = "any (loopback)" if not cfg.ws_origins else "any (--ws-origins *)"
        else:
            allowed = ", ".join(sorted(origins)) or "none but its own page (--ws-origins)"
        self.log.info(
            "websocket listening",
            url=self.ws_url,
            page="/" in policy.pages,
            browser_origins=allowed,
        )

    async def _bind_admin(self, admin: AdminServer) -> None:
        """Bind the admin port, waiting up to ADMIN_BIND_WAIT_S while it is in use: after
        a kill -9 the predecessor holds it until its exit has closed every socket (a
        second or two with 15,000 connections), and a worker that gave up at once would
        be restarted, opening its backends again, while its clients wait."""
        deadline = time.monotonic() + ADMIN_BIND_WAIT_S
        warned = False
        while True:
            try:
                await admin.start()
                return
            except OSError as e:
                if e.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                    raise
            if not warned:
                warned = True
                self.log.warning(
                    "admin port in use; waiting for it (a killed predecessor exiting?)",
                    port=self.config.admin_port,
                    wait_s=ADMIN_BIND_WAIT_S,
                )
            await asyncio.sleep(ADMIN_BIND_STEP_S)

    async def _start_media(self, node: Node) -> None:
        """Media by object key (gateway/media.py): its index, and for a file:// root the
        listener serving its signed URLs."""
        from storage.media.objects import FileObjects

        cfg = self.config
        assert self.backends is not None
        media = Media.from_config(
            media_url=cfg.media, store_url=cfg.store_url(), data_dir=cfg.data_dir,
            secret=cfg.media_secret, max_size=cfg.media_max_size, types=cfg.media_types,
            url_ttl_s=cfg.media_url_ttl, orphan_s=cfg.media_orphan_s,
            clock=self.backends.store.now_ms,
        )  # fmt: skip
        await media.open()
        node.media = media
        if isinstance(media.objects, FileObjects) and cfg.media_listen:
            host, port = split_host_port(cfg.media_listen, any_port=True)
            self.media_http = MediaListener(
                media.objects, host, port, reuse_port=self.reuse_port,
                per_address=cfg.media_max_connections_per_ip,
            )  # fmt: skip
            await self.media_http.start()
            bound = self.media_http.port
            shown = f"[{host}]" if ":" in host else host  # an IPv6 address
            public = cfg.media_public_url.rstrip("/") or f"http://{shown}:{bound}"
            if not cfg.media_public_url and host in ("0.0.0.0", "::", ""):
                self.log.warning(
                    "media URLs name an address clients cannot reach: pass --media-public-url",
                    base=public,
                )
            media.objects.base_url = lambda: public
            self.media_base = public
        self.log.info(
            "media by object key", media=redact_url(cfg.media), listen=cfg.media_listen or None
        )

    def secrets(self) -> set[str]:
        """What the process must never show (gateway.redact): the configuration's
        secrets, and the media secret, which may have been generated in the data dir."""
        found = config_secrets(self.config)
        media = self.node.media if self.node is not None else None
        key = getattr(media.objects, "secret", b"") if media is not None else b""
        if isinstance(key, bytes) and key:
            found.add(key.decode(errors="replace"))
        return found

    async def _lease_worker_id(self, node_id: str) -> None:
        from storage.redis import redis_from_url

        client, prefix = redis_from_url(self.config.cache)
        owner = f"{node_id}:{os.getpid()}:{time.time_ns()}"
        self._lease = WorkerIdLease(client, prefix=prefix, owner=owner)
        for attempt in range(1, LEASE_ATTEMPTS + 1):
            try:
                self.ids.worker_id = await self._lease.acquire()
                break
            except BackendUnavailable as e:
                if attempt == LEASE_ATTEMPTS:
                    await client.aclose()
                    self._lease = None
                    raise
                # a first contact can be slow (a cluster client reads the slot map and
                # loads the script on every master first): try again before giving up
                self.log.warning("worker id lease failed; trying again", error=str(e))
        self.log.info("snowflake worker id leased", worker_id=self.ids.worker_id)
        self._lease_task = asyncio.get_running_loop().create_task(self._keep_lease())

    async def _keep_lease(self) -> None:
        lease = self._lease
        assert lease is not None
        delay = lease.renew_every_s
        while True:
            await asyncio.sleep(delay)
            try:
                moved = await lease.renew()
            except BackendUnavailable as e:
                self.log.warning("worker id lease renewal failed", error=str(e))
                delay = 1.0  # re-take the key as soon as Redis is back
            else:
                if moved:
                    self.log.warning("worker id was taken over; moved", worker_id=lease.worker_id)
                delay = lease.renew_every_s
            if lease.worker_id < 0:
                self.ids.suspend()  # taken over and no fresh id yet: sends get unavailable
            else:
                self.ids.worker_id = lease.worker_id

    async def _end_lease(self) -> None:
        if self._lease_task is not None:
            self._lease_task.cancel()
            await asyncio.wait([self._lease_task])
        if self._lease is not None:
            try:
                await self._lease.release()
            except BackendUnavailable as e:
                self.log.warning("worker id lease release failed", error=str(e))
            await self._lease.close()

    def _report_connection_cap(self, nofile: int) -> None:
        """Once at start: a warning when the open-file limit holds the node below a
        --max-connections that was asked for; at the default (1,000,000, "as many as
        the system allows") the cap is only news, far above any development use."""
        node, cfg = self.node, self.config
        assert node is not None
        if node.max_connections >= cfg.max_connections:
            return
        explicit = cfg.max_connections != Config().max_connections
        (self.log.warning if explicit else self.log.info)(
            "the open-file limit caps the connections this process can hold"
            + ("; raise it (ulimit -n, LimitNOFILE=) or run more workers" if explicit else ""),
            open_file_limit=nofile,
            max_connections=node.max_connections,
            configured=cfg.max_connections,
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

    async def _kick_sessions(self, rate: float, reason: KickReason, text: str, hint: str) -> None:
        """KICK every session, `rate` per second (0: all at once). Each step's connections
        stop being read, their requests in flight are answered (sends committed and
        acked), then they are kicked; the others keep working meanwhile. Sessions whose
        LOGIN was already on the way when accepting stopped go too."""
        node = self.node
        assert node is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        kicked = 0
        while node.sessions:
            total = kicked + len(node.sessions)
            quota = max(1, due_by(loop.time() - started, rate, total) - kicked)
            step = list(itertools.islice(node.sessions.values(), quota))
            for conn in step:
                conn.hold_reading()  # stays held: a draining node resumes no reading
            await self._finish_requests(step)
            before = len(node.sessions)
            for conn in step:
                conn.kick(reason, text, hint)
            kicked += len(step)
            if len(node.sessions) >= before:
                break  # nothing left that can be kicked
            if node.sessions:
                await asyncio.sleep(PACE_STEP_S)

    async def _finish_requests(self, conns: Sequence[Connection]) -> None:
        """Wait (bounded) until the requests `conns` already sent are answered."""
        node = self.node
        assert node is not None
        inflight = [c.task for c in conns if c.task is not None]
        try:
            async with asyncio.timeout(self.config.shutdown_timeout):
                if inflight:
                    await asyncio.wait(inflight)
                await node.batcher.settled()
                await asyncio.sleep(0)  # acks are written by the callbacks of the commit
        except TimeoutError:
            self.log.error("requests in flight did not finish in time", connections=len(conns))

    def _drain_soon(self, rate: float | None, hint: str | None) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(
            self.shutdown(rate=rate, hint=hint)
        )

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def shutdown(
        self,
        reason: KickReason = KickReason.DRAINING,
        *,
        rate: float | None = None,
        hint: str | None = None,
    ) -> None:
        """Drain and stop (see the module docstring); `rate` KICKs per second (default
        the configured drain_rate; 0 = all at once), `hint` the reconnect address."""
        node = self.node
        if node is None or not node.accepting:
            return
        cfg = self.config
        rate = cfg.drain_rate if rate is None else rate
        hint = cfg.reconnect_hint if hint is None else hint
        text = "server draining" if reason == KickReason.DRAINING else "server shutting down"
        started = time.monotonic()
        self.log.info(
            "draining", sessions=len(node.sessions), reason=reason.name.lower(), rate=rate
        )
        node.drain_hint = hint
        node.accepting = False  # from now on a LOGIN is answered KICK draining
        try:
            if self._server is not None:
                self._server.close()
            if self._ws_server is not None:
                self._ws_server.close()
            await self._kick_sessions(rate, reason, text, hint)
            try:
                await asyncio.wait_for(node.batcher.drain(), timeout=cfg.shutdown_timeout)
            except TimeoutError:
                self.log.error("send batcher did not drain in time", pending=node.batcher.pending)
            await node.settle()
            deadline = time.monotonic() + FLUSH_WAIT_S
            while node.open_count > 0 and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            await node.settle()
            if node.outbox is not None:
                await node.outbox.finish()
        finally:
            # Whatever failed above, the backends are closed and the process can exit.
            node.close()
            if self._cert_checks is not None:
                self._cert_checks.stop()
            assert self.backends is not None
            closers = [self.backends.bus.close, self.backends.routes.close,
                       self.backends.store.close, self._end_lease]  # fmt: skip
            if self._admin is not None:
                closers.insert(0, self._admin.close)
            if node.media is not None:
                closers.append(node.media.close)
            if self.media_http is not None:
                closers.insert(0, self.media_http.close)
            if node.check is not None:
                closers.append(node.check.close)
            if node.hooks is not None:
                closers.insert(0, node.hooks.close)  # a last flush, before the rest
            for close in closers:
                try:
                    await close()
                except Exception as e:
                    self.log.error("close failed while stopping", error=repr(e))
            self.log.info("stopped", seconds=round(time.monotonic() - started, 3))
            self._stopped.set()


def run(config: Config, *, reuse_port: bool = False, listener: socket.socket | None = None) -> int:
    """Run a gateway until SIGTERM/SIGINT or `imgw drain`; the exit status. The process
    masks the gateway's secrets in everything it logs (gateway.redact)."""
    configure(config.log_format, config.log_level)
    remember(config_secrets(config))

    async def main() -> int:
        server = Server(config, reuse_port=reuse_port, listener=listener)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):  # a signal while starting counts too
            loop.add_signal_handler(sig, stop.set)
        try:
            await server.start()
        except (BackendUnavailable, OSError, ValueError) as e:
            # ValueError: a URL or file the config could not check (BackendError, a media
            # URL's options, the TLS certificate): said in one line, not a traceback
            structlog.get_logger("imgw").error("cannot start", error=str(e))
            if server.backends is not None:
                await server.backends.store.close()
            await server._end_lease()
            return 1
        remember(server.secrets())
        quiet_gc()
        stopped = loop.create_task(server.wait_stopped())  # `imgw drain` over admin HTTP
        signalled = loop.create_task(stop.wait())
        await asyncio.wait([signalled, stopped], return_when=asyncio.FIRST_COMPLETED)
        signalled.cancel()
        await server.shutdown()  # a no-op when a drain is already under way
        await stopped
        return 0

    return uvloop.run(main())
