"""Generator processes that open, log in and hold many connections on uvloop's
transports: the load of the `connect` and `storm` scenarios with `tls` or `ws_path`.
Plain TCP runs on bench.fdholders, which holds each connection as a bare file
descriptor and shares this module's spec, states and port choice.

Each process owns a uid range and one loopback source address (so that the 64k ports of
one address are no limit: 1,000,000 connections come from ~70 addresses), stays under
the 20,000 open files a process may hold here, and keeps its per-connection state to
one slotted object. Nothing per connection runs on its own: one ramp timer opens
connections at the process's share of the rate, and one heartbeat wheel (one slot per
second of the heartbeat interval; connection i lives in slot i mod hb) writes the PINGs
of one slot each second. Socket buffers are set small (idle connections move a few
bytes a minute).

With `reconnect`, a connection that drops (the gateway was killed or restarted) logs in
again after a full-jitter backoff, `uniform(0, min(cap, base * 2**attempt))`, and with
`sync` each login is followed by a SYNC: a connection counts as held once its SYNC is
answered (it has caught up), which is what `storm` measures.

With `ws_path` the connections speak WebSocket to the gateway's WebSocket listener:
the opening handshake first (bench.wsclient), then the same frames, one a message.

The process reports once a second to the driver: connections held, logins, drops,
errors, its RSS.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Final

from bench.common import proc_rss, run_generator
from bench.loadclient import PING, login_frame, raw_frames
from bench.wsclient import Handshake, WsError, WsWire
from protocol.codec import encode
from protocol.frames import Pong, Sync
from protocol.ops import ErrorCode, KickReason, Op

DEVICE: Final = "b"
TICK_S: Final = 0.05
REPORT_EVERY_S: Final = 1.0
CONNECT_TRIES: Final = 5
FIRST_PORT: Final = 1024  # source ports this process picks from: 1024..65535, less the
# kernel's ephemeral range (source_ports)
PORT_TRIES: Final = 64
_PONG: Final = encode(Pong())
# Connection states (UPGRADING: the WebSocket handshake).
IDLE, CONNECTING, UPGRADING, LOGGING_IN, SYNCING, HELD = range(6)


@dataclass(frozen=True)
class HolderSpec:
    """What one generator process does; picklable (spawn)."""

    idx: int
    host: str
    port: int
    kid: str
    secret: str
    uid0: int
    count: int
    src_ip: str
    ramp_per_s: float  # this process's share of the ramp
    hb_s: int
    sync: bool
    reconnect: bool
    backoff_base_s: float
    backoff_cap_s: float
    max_pending: int  # connects in flight at once
    sock_buf: int
    deadline_ns: int  # monotonic
    tls: bool = False  # connect with TLS (certificate not verified: a bench on loopback)
    keep_since: bool = True  # SYNC from the last pass's next_since, as apps do (else 0)
    # with sync: the SYNC goes in the LOGIN's write, as docs/protocol.md allows (one write
    # and one read fewer on each side), instead of after LOGIN_OK
    pipeline_sync: bool = True
    ws_path: str | None = None  # speak WebSocket on this path (else the plain protocol)


class TcpWire:
    """The plain protocol's framing: what `WsWire` is for WebSocket."""

    __slots__ = ()
    ping: Final = PING
    pong: Final = _PONG

    def wrap(self, framed: bytes) -> bytes:
        return framed

    def split(self, buf: bytes) -> tuple[list[list[Any]], bytes, bytes]:
        frames, rest = raw_frames(buf)
        return frames, rest, b""


def source_ports(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> list[int]:
    """The source ports a generator binds: 1024..65535 outside the kernel's ephemeral
    range. A port bound explicitly, on any address, is one the kernel no longer picks for
    a connect() without bind(): generators holding 100,000 ports inside that range left
    the gateway's own new Redis and MySQL connections without a port (EADDRNOTAVAIL,
    answered `unavailable` to tens of thousands of logins in one storm)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return [p for p in range(FIRST_PORT, 65536) if not low <= p <= high]


class Held(asyncio.Protocol):
    __slots__ = ("attempt", "buf", "gen", "i", "since", "state", "transport")

    def __init__(self, gen: Holders, i: int) -> None:
        self.gen = gen
        self.i = i
        self.state = IDLE
        self.buf = b""
        self.attempt = 0
        self.since: bytes | int = 0  # the next_since of its last SYNC
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        gen = self.gen
        if gen.spec.ws_path is not None:
            self.state = UPGRADING
            transport.write(gen.upgrade(self))  # type: ignore[attr-defined]
        else:
            gen.log_in(self)

    def data_received(self, data: bytes) -> None:
        gen = self.gen
        if data == gen.pong and not self.buf:
            gen.pongs += 1
            return  # the common case, ~33,000 a second at 1M connections: no decoding
        if self.state == UPGRADING:
            gen.on_upgrade(self, data)
            return
        try:
            frames, self.buf, reply = gen.wire.split(self.buf + data if self.buf else data)
        except WsError as e:
            gen.on_ws_error(self, e)
            return
        if reply and self.transport is not None:
            self.transport.write(reply)
        for frame in frames:
            gen.on_frame(self, frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.gen.on_lost(self)


class Holders:
    """The connections of one process."""

    def __init__(self, spec: HolderSpec, out: Any) -> None:
        self.unavailable: dict[int, int] = {}  # connection -> ERROR unavailable answers
        self.unavailable_max = 0
        self.unavailable_over_2 = 0  # clients told unavailable more than twice
        self.tls: ssl.SSLContext | None = None
        if spec.tls:
            self.tls = ssl.create_default_context()
            self.tls.check_hostname = False
            self.tls.verify_mode = ssl.CERT_NONE
        self.spec = spec
        self.out = out
        self.loop = asyncio.get_running_loop()
        self.wire: TcpWire | WsWire = WsWire() if spec.ws_path is not None else TcpWire()
        self.pong = self.wire.pong
        self.handshakes: dict[int, Handshake] = {}  # connection -> its WebSocket handshake
        self.rss0 = proc_rss() or 0  # before any connection state exists
        self.conns = [Held(self, i) for i in range(spec.count)]
        self.exp = int(time.time()) + 7 * 86_400
        self.sync_frame = self.wire.wrap(encode(Sync(1, 0, 0, 1)))
        self.started = 0  # connections started by the ramp
        self.pending = 0  # connects in flight
        self.held = 0
        self.pongs = 0  # PONGs received: PINGs the gateway answered
        self.syncs = 0  # SYNC_RESULTs received
        self.logins = 0
        self.drops = 0
        self.errors: dict[str, int] = {}
        self.kicks: dict[str, int] = {}
        self.stopping = False
        self.retry: list[int] = []  # connections whose backoff ended, waiting for a slot
        self.gave_up = 0  # connections that failed CONNECT_TRIES times (not reconnecting)
        self.ports = source_ports()
        self.next_port = random.randrange(len(self.ports))  # an index into ports
        # With reconnect, each client's LOGIN (its token) is kept for the next one, as
        # apps keep theirs: signing a token took a sixth of a generator's CPU in a storm.
        self.logins_kept: dict[int, bytes] | None = {} if spec.reconnect else None

    def login_frame(self, i: int) -> bytes:
        kept = self.logins_kept
        if kept is not None and (frame := kept.get(i)) is not None:
            return frame
        spec = self.spec
        frame = self.wire.wrap(login_frame(spec.kid, spec.secret, spec.uid0 + i, DEVICE, self.exp))
        if kept is not None:
            kept[i] = frame
        return frame

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1

    def log_in(self, conn: Held) -> None:
        """Write the LOGIN (and the SYNC behind it, when pipelined)."""
        conn.state = LOGGING_IN
        login = self.login_frame(conn.i)
        if self.spec.sync and self.spec.pipeline_sync:
            login += self.sync_frame_of(conn)  # handled right after the login
        assert conn.transport is not None
        conn.transport.write(login)

    # -- WebSocket -------------------------------------------------------------------------

    def upgrade(self, conn: Held) -> bytes:
        """The handshake request of `conn`, whose answer `on_upgrade` takes."""
        spec = self.spec
        assert spec.ws_path is not None
        hs = self.handshakes[conn.i] = Handshake(spec.host, spec.port, spec.ws_path)
        return hs.request()

    def on_upgrade(self, conn: Held, data: bytes) -> None:
        hs = self.handshakes.get(conn.i)
        if hs is None:
            return
        try:
            early = hs.receive(data)
        except WsError as e:
            self.on_ws_error(conn, e)
            return
        if early is None:
            return  # more of the 101 to come
        del self.handshakes[conn.i]
        self.log_in(conn)
        if early:  # frames right behind the 101: none from the gateway
            assert isinstance(self.wire, WsWire)
            frames, reply = self.wire.messages(early)
            if reply and conn.transport is not None:
                conn.transport.write(reply)
            for frame in frames:
                self.on_frame(conn, frame)

    def on_ws_error(self, conn: Held, e: WsError) -> None:
        self.count(self.errors, "ws_handshake" if conn.state == UPGRADING else "ws_framing")
        if conn.transport is not None:
            conn.transport.abort()

    # -- opening -------------------------------------------------------------------------

    def open(self, i: int) -> None:
        conn = self.conns[i]
        conn.state = CONNECTING
        self.pending += 1
        self.loop.create_task(self._open(conn))

    async def _open(self, conn: Held) -> None:
        spec = self.spec
        try:
            # uvloop makes and owns the socket: a socket object of ours handed over with
            # sock= would close a reused fd number when collected, under churn.
            transport = await self._connect(conn)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, spec.sock_buf)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, spec.sock_buf)
        except OSError as e:
            conn.state = IDLE
            self.count(self.errors, f"connect_{type(e).__name__}")
            self._retry(conn)
        finally:
            self.pending -= 1

    async def _connect(self, conn: Held) -> asyncio.BaseTransport:
        """Connect from this process's own source address on a port it picks itself:
        bind() to port 0 searches the port range for a free port, and with ten thousand
        ports of one address in use that search took 95 % of a generator's CPU and
        stalled the ramp. The process owns its address, so a port in use or in
        TIME_WAIT is only skipped."""
        spec = self.spec
        for _ in range(PORT_TRIES):
            port = self.ports[self.next_port]
            self.next_port = (self.next_port + 1) % len(self.ports)
            try:
                transport, _ = await self.loop.create_connection(
                    lambda: conn, spec.host, spec.port, local_addr=(spec.src_ip, port),
                    ssl=self.tls,
                )  # fmt: skip
                return transport
            except OSError as e:
                # EADDRNOTAVAIL: the port is this process's own live connection (the
                # socket has SO_REUSEADDR, so only connect() finds the clash)
                if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                    raise
        raise OSError(errno.EADDRINUSE, f"no free port on {spec.src_ip} in {PORT_TRIES} tries")

    def _retry(self, conn: Held) -> None:
        if self.stopping:
            return
        conn.attempt += 1
        spec = self.spec
        if spec.reconnect or conn.attempt < CONNECT_TRIES:  # after a full-jitter backoff
            ceiling = min(spec.backoff_cap_s, spec.backoff_base_s * 2 ** min(conn.attempt, 20))
            self.loop.call_later(random.uniform(0, ceiling), self._reopen, conn)
        else:
            self.gave_up += 1  # counted as failed: the ramp does not wait for it

    def _reopen(self, conn: Held) -> None:
        if self.stopping or conn.state != IDLE:
            return
        if self.pending >= self.spec.max_pending:
            # This process simulates thousands of clients: its own connects in flight are
            # bounded (a SYN flood from one process only fills the listen backlogs and
            # stalls everyone in SYN retransmission); the rest wait their turn.
            self.retry.append(conn.i)
        else:
            self.open(conn.i)

    # -- frames --------------------------------------------------------------------------

    def on_frame(self, conn: Held, frame: list[Any]) -> None:
        op = frame[0]
        if op == Op.PONG:
            self.pongs += 1
            return
        if op == Op.LOGIN_OK and conn.state == LOGGING_IN:
            self.logins += 1
            if self.spec.sync:
                conn.state = SYNCING
                if not self.spec.pipeline_sync:
                    assert conn.transport is not None
                    conn.transport.write(self.sync_frame_of(conn))
            else:
                self._held(conn)
        elif op == Op.SYNC_RESULT and conn.state == SYNCING:
            self.syncs += 1
            if self.spec.keep_since:
                conn.since = frame[2]
            self._held(conn)
        elif op == Op.KICK:
            self.count(self.kicks, kind_name(KickReason, frame[1]))
        elif op == Op.ERROR:
            self.count(self.errors, kind_name(ErrorCode, frame[2]))
            if frame[2] == ErrorCode.UNAVAILABLE:  # per client: how often it was told
                told = self.unavailable[conn.i] = self.unavailable.get(conn.i, 0) + 1
                if told == 3:
                    self.unavailable_over_2 += 1
                self.unavailable_max = max(self.unavailable_max, told)
            if conn.state == SYNCING:  # as a client would: SYNC again after a backoff
                conn.attempt += 1
                ceiling = min(self.spec.backoff_cap_s, self.spec.backoff_base_s * 2**conn.attempt)
                self.loop.call_later(random.uniform(0, ceiling), self._resync, conn)

    def _resync(self, conn: Held) -> None:
        if conn.state == SYNCING and conn.transport is not None and not self.stopping:
            conn.transport.write(self.sync_frame_of(conn))

    def sync_frame_of(self, conn: Held) -> bytes:
        if conn.since == 0:
            return self.sync_frame
        return self.wire.wrap(encode(Sync(1, conn.since, 0, 1)))

    def _held(self, conn: Held) -> None:
        conn.state = HELD
        conn.attempt = 0
        self.held += 1

    def on_lost(self, conn: Held) -> None:
        was = conn.state
        conn.state = IDLE
        conn.buf = b""
        self.handshakes.pop(conn.i, None)
        if was == HELD:
            self.held -= 1
        if self.stopping:
            return
        if was == HELD:
            self.drops += 1
        elif was in (UPGRADING, LOGGING_IN, SYNCING):
            why = {UPGRADING: "closed_in_handshake", LOGGING_IN: "closed_before_login"}
            self.count(self.errors, why.get(was, "closed_in_sync"))
        self._retry(conn)

    # -- timers --------------------------------------------------------------------------

    async def run(self, ctrl: Any) -> None:
        spec = self.spec
        t0 = time.monotonic()
        last_report = 0.0
        last_hb_second = -1  # heartbeat wheel: the last second whose slot was pinged
        stop_wait = self.loop.run_in_executor(None, _wait_stop, ctrl)
        while not stop_wait.done():
            now = time.monotonic()
            if now * 1e9 > spec.deadline_ns:
                break
            # Ramp: open connections at this process's share of the rate.
            due = min(spec.count, int((now - t0) * spec.ramp_per_s) + 1)
            while self.started < due and self.pending < spec.max_pending:
                self.open(self.started)
                self.started += 1
            while self.retry and self.pending < spec.max_pending:
                self.open(self.retry.pop())
            # Heartbeats: one wheel slot per second.
            second = int(now - t0)
            # Every slot whose second has come, those of seconds a slow tick skipped too
            # (else a busy generator would let connections idle out).
            ping = self.wire.ping
            for sec in range(max(last_hb_second + 1, second - spec.hb_s + 1), second + 1):
                conns = self.conns
                for i in range(sec % spec.hb_s, spec.count, spec.hb_s):
                    conn = conns[i]
                    if conn.state >= SYNCING and conn.transport is not None:
                        conn.transport.write(ping)
            last_hb_second = second
            if now - last_report >= REPORT_EVERY_S:
                last_report = now
                self.report()
            await asyncio.sleep(TICK_S)
        self.stopping = True
        self.report()
        for conn in self.conns:
            if conn.transport is not None:
                conn.transport.abort()  # RST: no TIME_WAIT left behind on this side
        await asyncio.sleep(0.5)
        self.out.put(("closed", spec.idx))

    def report(self) -> None:
        self.out.put(progress(self))


def progress(g: Any) -> tuple[Any, ...]:
    """A generator process's report to the driver, `g` its counters (bench.fleet reads
    the fields by position)."""
    return (
        "progress", g.spec.idx, g.started, g.held, g.logins, g.drops, dict(g.errors),
        dict(g.kicks), proc_rss() or 0, g.rss0, g.gave_up, g.pongs, g.syncs,
        g.unavailable_max, g.unavailable_over_2,
    )  # fmt: skip


def kind_name(kind: Any, value: int) -> str:
    try:
        return str(kind(value).name.lower())
    except ValueError:
        return f"code_{value}"


def _wait_stop(ctrl: Any) -> None:
    with contextlib.suppress(EOFError, OSError):
        while ctrl.recv() != ("stop",):
            pass


def holder_main(spec: HolderSpec, ctrl: Any, out: Any) -> None:
    run_generator(spec.idx, _main(spec, ctrl, out), out)


async def _main(spec: HolderSpec, ctrl: Any, out: Any) -> None:
    await Holders(spec, out).run(ctrl)
