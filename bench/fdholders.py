"""Generator processes that hold plain-TCP connections as bare file descriptors: the
lean path of `bench.holders`, which the driver (bench.fleet) runs for every `connect`
and `storm` without `--tls` or `--transport ws`.

A connection here is a slot in a few arrays, not an object: its state and retry count
(one byte each) and its socket's file descriptor (four bytes), with a map from file
descriptor back to slot. Dicts hold only what few connections have at a time: a socket
still connecting (at most `max_pending`), bytes of a frame not yet whole, a write the
kernel did not take at once, a SYNC position, a kept LOGIN with `reconnect`.

One `select.epoll` drives every socket of the process; there is no asyncio, no
transport and no callback per connection. Between polls one tick (every `TICK_S`)
opens connections at the process's share of the ramp, writes the PINGs of the
heartbeat wheel's slots that are due (connection i lives in slot i mod hb), fires the
reconnect and re-SYNC backoffs that are due, and reports once a second. A PING is
written from its pre-encoded bytes with `os.write`; a read goes into one buffer shared
by the process (`os.readv`), and a read that is exactly one PONG is counted without
making any object. Anything else is split into frames (`split_frames`) and decoded.

Everything users see is `bench.holders`': the source address and ports, the ramp, the
heartbeat, reconnects with full-jitter backoff, SYNC after LOGIN, the error and kick
counts, the deadline, the `stop` message, and the report tuple each second.
"""

from __future__ import annotations

import array
import contextlib
import errno
import heapq
import os
import random
import select
import signal
import socket
import struct
import time
from typing import Any, Final

import msgpack

from bench.common import proc_rss
from bench.holders import (
    CONNECT_TRIES,
    DEVICE,
    HELD,
    IDLE,
    LOGGING_IN,
    PORT_TRIES,
    REPORT_EVERY_S,
    SYNCING,
    TICK_S,
    HolderSpec,
    kind_name,
    progress,
    source_ports,
)
from bench.loadclient import PING, login_frame
from protocol.codec import encode
from protocol.frames import Pong, Sync
from protocol.ops import ErrorCode, KickReason, Op

CONNECTING: Final = 1  # bench.holders' value; UPGRADING (2) is WebSocket-only
PONG: Final = encode(Pong())
PONG_BODY: Final = PONG[4:]
_PONG_LEN: Final = len(PONG)
READ_SIZE: Final = 64 * 1024  # one read takes up to this much (level-triggered: the rest next poll)
MAX_EVENTS: Final = 4096  # readiness events taken per poll
# While every connection is held, reads wait this long between polls: PONGs are taken
# in batches, and still within the 40 ms of TCP's delayed ACK, so the ACK of a PONG goes
# out from this process's read, as a client's would, not from a timer on whichever CPU.
READ_EVERY_S: Final = 0.02
_LEN: Final = struct.Struct(">I")
_LINGER_RST: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
_IN: Final = select.EPOLLIN
_IN_OUT: Final = select.EPOLLIN | select.EPOLLOUT
_IN_ERR: Final = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR
_REOPEN, _RESYNC = 0, 1  # timer kinds


def serves(spec: HolderSpec) -> bool:
    """Whether this lean path runs `spec`: plain TCP (TLS and WebSocket stay on
    bench.holders' transports)."""
    return not spec.tls and spec.ws_path is None


def split_frames(buf: bytes) -> tuple[int, list[bytes], bytes]:
    """The PONGs at the start of `buf`, the bodies of its other complete frames (msgpack
    arrays, op first) in order, and the bytes left over (the start of a frame)."""
    pongs = 0
    bodies: list[bytes] = []
    at, end = 0, len(buf)
    while end - at >= 4:
        (n,) = _LEN.unpack_from(buf, at)
        if end - at - 4 < n:
            break
        body = buf[at + 4 : at + 4 + n]
        if body == PONG_BODY:
            pongs += 1
        else:
            bodies.append(body)
        at += 4 + n
    return pongs, bodies, buf[at:]


class FdHolders:
    """The connections of one process, on one epoll."""

    def __init__(self, spec: HolderSpec, ctrl: Any, out: Any) -> None:
        self.spec = spec
        self.ctrl = ctrl
        self.out = out
        self.addr = (socket.gethostbyname(spec.host), spec.port)
        self.ep = select.epoll()
        self.ctrl_fd: int = ctrl.fileno()
        self.ep.register(self.ctrl_fd, _IN)
        self.buf = bytearray(READ_SIZE)
        self.bufs = [self.buf]  # os.readv's argument, made once
        self.view = memoryview(self.buf)
        self.exp = int(time.time()) + 7 * 86_400
        self.sync_frame = encode(Sync(1, 0, 0, 1))
        self.ports = source_ports()
        self.next_port = random.randrange(len(self.ports))  # an index into ports
        self.rss0 = proc_rss() or 0  # before any connection state exists
        n = spec.count
        self.state = bytearray(n)  # IDLE, CONNECTING, LOGGING_IN, SYNCING, HELD
        self.attempt = bytearray(n)  # failed connects (or SYNCs) in a row, at most 255
        self.fds = array.array("i", [-1]) * n  # connection -> its socket's fd, or -1
        self.slot_of = array.array("i", [-1]) * 1024  # fd -> connection (grows)
        self.connecting: dict[int, socket.socket] = {}  # connection -> socket in connect
        self.partial: dict[int, bytes] = {}  # connection -> start of a frame read
        self.unsent: dict[int, bytes] = {}  # connection -> bytes the kernel did not take
        self.since: dict[int, Any] = {}  # connection -> next_since of its last SYNC
        self.unavailable: dict[int, int] = {}  # connection -> ERROR unavailable answers
        # With reconnect, each client's LOGIN (its token) is kept for the next one, as
        # apps keep theirs: signing a token took a sixth of a generator's CPU in a storm.
        self.logins_kept: dict[int, bytes] | None = {} if spec.reconnect else None
        self.timers: list[tuple[float, int, int]] = []  # (when, _REOPEN/_RESYNC, conn)
        self.retry: list[int] = []  # connections waiting for a connect slot
        self.started = 0
        self.held = 0
        self.logins = 0
        self.drops = 0
        self.pongs = 0
        self.syncs = 0
        self.gave_up = 0
        self.unavailable_max = 0
        self.unavailable_over_2 = 0
        self.errors: dict[str, int] = {}
        self.kicks: dict[str, int] = {}
        self.stopping = False

    # -- writing -------------------------------------------------------------------------

    def write(self, i: int, data: bytes) -> None:
        """Write `data` to connection i; what the kernel does not take waits for EPOLLOUT."""
        fd = self.fds[i]
        if i in self.unsent:
            self.unsent[i] += data
            return
        try:
            n = os.write(fd, data)
        except BlockingIOError:
            n = 0
        except OSError:
            self.lost(i)
            return
        if n < len(data):
            self.unsent[i] = data[n:]
            self.ep.modify(fd, _IN_OUT)

    def flush(self, i: int, fd: int) -> None:
        data = self.unsent.pop(i, b"")
        try:
            n = os.write(fd, data) if data else 0
        except BlockingIOError:
            n = 0
        except OSError:
            self.lost(i)
            return
        if n < len(data):
            self.unsent[i] = data[n:]
        else:
            self.ep.modify(fd, _IN)

    def login_frame(self, i: int) -> bytes:
        kept = self.logins_kept
        if kept is not None and (frame := kept.get(i)) is not None:
            return frame
        spec = self.spec
        frame = login_frame(spec.kid, spec.secret, spec.uid0 + i, DEVICE, self.exp)
        if kept is not None:
            kept[i] = frame
        return frame

    def sync_frame_of(self, i: int) -> bytes:
        since = self.since.get(i, 0)
        return self.sync_frame if since == 0 else encode(Sync(1, since, 0, 1))

    def log_in(self, i: int) -> None:
        """Write the LOGIN (and the SYNC behind it, when pipelined)."""
        self.state[i] = LOGGING_IN
        login = self.login_frame(i)
        if self.spec.sync and self.spec.pipeline_sync:
            login += self.sync_frame_of(i)  # handled right after the login
        self.write(i, login)

    # -- opening -------------------------------------------------------------------------

    def open(self, i: int) -> None:
        """Start connecting connection i from this process's own source address on a
        port it picks itself: bind() to port 0 searches the port range for a free port,
        which with ten thousand ports of one address in use stalls the ramp. The process
        owns its address, so a port in use or in TIME_WAIT is only skipped."""
        spec = self.spec
        for _ in range(PORT_TRIES):
            port = self.ports[self.next_port]
            self.next_port = (self.next_port + 1) % len(self.ports)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, spec.sock_buf)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, spec.sock_buf)
                sock.bind((spec.src_ip, port))
                err = sock.connect_ex(self.addr)
            except OSError as e:
                sock.close()
                if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                    continue
                self.connect_failed(i, e.errno or 0)
                return
            # EADDRNOTAVAIL: the port is this process's own live connection (the socket
            # has SO_REUSEADDR, so only connect() finds the clash)
            if err in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                sock.close()
                continue
            if err not in (0, errno.EINPROGRESS):
                sock.close()
                self.connect_failed(i, err)
                return
            fd = sock.fileno()
            self.bind_fd(fd, i)
            self.state[i] = CONNECTING
            self.connecting[i] = sock
            self.ep.register(fd, select.EPOLLOUT)
            return
        self.connect_failed(i, errno.EADDRINUSE)

    def bind_fd(self, fd: int, i: int) -> None:
        slot_of = self.slot_of
        if fd >= len(slot_of):
            slot_of.extend(array.array("i", [-1]) * max(fd + 1 - len(slot_of), len(slot_of)))
        slot_of[fd] = i
        self.fds[i] = fd

    def connected(self, i: int, fd: int) -> None:
        """Connection i's connect finished, or failed."""
        sock = self.connecting.pop(i)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.fds[i] = -1
            sock.close()
            self.connect_failed(i, err)
            return
        sock.detach()  # from here on the connection is its fd
        self.ep.modify(fd, _IN)
        self.log_in(i)

    def connect_failed(self, i: int, err: int) -> None:
        self.state[i] = IDLE
        # the name of the OSError subclass for err, as uvloop's connect would raise it
        self.count(self.errors, f"connect_{type(OSError(err, '')).__name__}")
        self.retry_later(i)

    def retry_later(self, i: int) -> None:
        if self.stopping:
            return
        attempt = self.attempt[i] = min(255, self.attempt[i] + 1)
        spec = self.spec
        if spec.reconnect or attempt < CONNECT_TRIES:
            # after a full-jitter backoff, as an app would: retried at once, the logins
            # a loaded gateway refused came back at it on top of the ramp's
            ceiling = min(spec.backoff_cap_s, spec.backoff_base_s * 2 ** min(attempt, 20))
            when = time.monotonic() + random.uniform(0, ceiling)
            heapq.heappush(self.timers, (when, _REOPEN, i))
        else:
            self.gave_up += 1  # counted as failed: the ramp does not wait for it

    # -- reading -------------------------------------------------------------------------

    def readable(self, i: int, fd: int) -> None:
        try:
            n = os.readv(fd, self.bufs)
        except BlockingIOError:
            return
        except OSError:
            self.lost(i)
            return
        self.received(i, fd, n)

    def received(self, i: int, fd: int, n: int) -> None:
        """Connection i read `n` bytes into the shared buffer (0: the peer closed)."""
        if n == 0:
            self.lost(i)
            return
        data = bytes(self.view[:n])
        rest = self.partial.pop(i, None)
        pongs, bodies, rest = split_frames(rest + data if rest else data)
        self.pongs += pongs
        if rest:
            self.partial[i] = rest
        for body in bodies:
            if self.fds[i] != fd:
                return  # lost on an earlier frame of this read
            self.on_frame(i, msgpack.unpackb(body))

    def on_frame(self, i: int, frame: list[Any]) -> None:
        op = frame[0]
        state = self.state[i]
        spec = self.spec
        if op == Op.LOGIN_OK and state == LOGGING_IN:
            self.logins += 1
            if spec.sync:
                self.state[i] = SYNCING
                if not spec.pipeline_sync:
                    self.write(i, self.sync_frame_of(i))
            else:
                self.mark_held(i)
        elif op == Op.SYNC_RESULT and state == SYNCING:
            self.syncs += 1
            if spec.keep_since:
                self.since[i] = frame[2]
            self.mark_held(i)
        elif op == Op.KICK:
            self.count(self.kicks, kind_name(KickReason, frame[1]))
        elif op == Op.ERROR:
            self.count(self.errors, kind_name(ErrorCode, frame[2]))
            if frame[2] == ErrorCode.UNAVAILABLE:  # per client: how often it was told
                told = self.unavailable[i] = self.unavailable.get(i, 0) + 1
                if told == 3:
                    self.unavailable_over_2 += 1
                self.unavailable_max = max(self.unavailable_max, told)
            if state == SYNCING:  # as a client would: SYNC again after a backoff
                attempt = self.attempt[i] = min(255, self.attempt[i] + 1)
                ceiling = min(spec.backoff_cap_s, spec.backoff_base_s * 2**attempt)
                when = time.monotonic() + random.uniform(0, ceiling)
                heapq.heappush(self.timers, (when, _RESYNC, i))

    def mark_held(self, i: int) -> None:
        self.state[i] = HELD
        self.attempt[i] = 0
        self.held += 1

    def lost(self, i: int) -> None:
        """Connection i closed (by the peer, or a socket error): close its fd, count it,
        and retry it as `retry_later` says."""
        was = self.state[i]
        fd = self.fds[i]
        if fd < 0 or was == IDLE:
            return
        self.fds[i] = -1
        self.slot_of[fd] = -1
        sock = self.connecting.pop(i, None)
        if sock is not None:
            sock.close()
        else:
            os.close(fd)  # also leaves the epoll
        self.state[i] = IDLE
        self.partial.pop(i, None)
        self.unsent.pop(i, None)
        if was == HELD:
            self.held -= 1
        if self.stopping:
            return
        if was == HELD:
            self.drops += 1
        elif was in (LOGGING_IN, SYNCING):
            why = "closed_before_login" if was == LOGGING_IN else "closed_in_sync"
            self.count(self.errors, why)
        self.retry_later(i)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        spec = self.spec
        t0 = time.monotonic()
        next_tick = t0
        last_report = 0.0
        last_hb_second = -1  # heartbeat wheel: the last second whose slot was pinged
        poll = self.ep.poll
        while not self.stopping:
            now = time.monotonic()
            if now >= next_tick:
                if now * 1e9 > spec.deadline_ns:
                    break
                self.fire_timers(now)
                self.ramp(now - t0)
                second = int(now - t0)
                # Every slot whose second has come, those of seconds a slow tick skipped
                # too (else a busy generator would let connections idle out).
                for sec in range(max(last_hb_second + 1, second - spec.hb_s + 1), second + 1):
                    self.ping_slot(sec % spec.hb_s)
                last_hb_second = second
                if now - last_report >= REPORT_EVERY_S:
                    last_report = now
                    self.report()
                next_tick = max(next_tick + TICK_S, now)
            wait = max(0.0, next_tick - time.monotonic())
            if self.held == spec.count and wait > 0:
                # Everything held: what is read now is PONGs. Take what came in the last
                # READ_EVERY_S at once, not one wakeup a PONG.
                time.sleep(min(wait, READ_EVERY_S))
                wait = 0.0
            self.dispatch(poll(wait, MAX_EVENTS))
        self.stopping = True
        self.report()
        self.close_all()
        self.out.put(("closed", spec.idx))

    def dispatch(self, events: list[tuple[int, int]]) -> None:
        """Handle one poll's readiness events; a read of one PONG makes no object."""
        slot_of, fds, state, partial = self.slot_of, self.fds, self.state, self.partial
        readv, bufs, startswith = os.readv, self.bufs, self.buf.startswith
        ctrl_fd, pongs = self.ctrl_fd, 0
        for fd, ev in events:
            if fd == ctrl_fd:
                self.control()
                continue
            i = slot_of[fd]
            if i < 0 or fds[i] != fd:
                continue  # closed earlier in this batch
            if ev == _IN and state[i] >= LOGGING_IN:
                try:
                    n = readv(fd, bufs)
                except BlockingIOError:
                    continue
                except OSError:
                    self.lost(i)
                    continue
                if n == _PONG_LEN and startswith(PONG) and i not in partial:
                    pongs += 1  # the common case, ~3,000 a second here
                else:
                    self.received(i, fd, n)
            elif state[i] == CONNECTING:
                self.connected(i, fd)
            else:
                if ev & select.EPOLLOUT and i in self.unsent:
                    self.flush(i, fd)
                    if fds[i] != fd:
                        continue
                if ev & _IN_ERR:
                    self.readable(i, fd)
        self.pongs += pongs

    def ramp(self, elapsed: float) -> None:
        """Open connections at this process's share of the rate, and those to retry."""
        spec = self.spec
        due = min(spec.count, int(elapsed * spec.ramp_per_s) + 1)
        while self.started < due and len(self.connecting) < spec.max_pending:
            self.open(self.started)
            self.started += 1
        while self.retry and len(self.connecting) < spec.max_pending:
            i = self.retry.pop()
            if self.state[i] == IDLE:
                self.open(i)

    def fire_timers(self, now: float) -> None:
        timers = self.timers
        while timers and timers[0][0] <= now:
            _, kind, i = heapq.heappop(timers)
            if kind == _REOPEN:
                if self.state[i] == IDLE:
                    self.retry.append(i)  # opened by the ramp, within max_pending
            elif self.state[i] == SYNCING and self.fds[i] >= 0:
                self.write(i, self.sync_frame_of(i))

    def ping_slot(self, slot: int) -> None:
        """PING the logged-in connections of one heartbeat slot."""
        fds, state, unsent, ping = self.fds, self.state, self.unsent, PING
        write = os.write
        for i in range(slot, self.spec.count, self.spec.hb_s):
            if state[i] >= SYNCING:
                if unsent and i in unsent:
                    self.write(i, ping)
                    continue
                try:
                    if write(fds[i], ping) == len(ping):
                        continue
                except BlockingIOError:
                    self.write(i, ping)
                    continue
                except OSError:
                    self.lost(i)
                    continue
                self.write(i, ping)  # never: 6 bytes fit any socket buffer with room

    def control(self) -> None:
        try:
            if self.ctrl.recv() == ("stop",):
                self.stopping = True
        except (EOFError, OSError):
            self.stopping = True  # the driver is gone

    def close_all(self) -> None:
        """Close every socket with RST: no TIME_WAIT left behind on this side."""
        for sock in self.connecting.values():
            sock.close()
        self.connecting.clear()
        for i, fd in enumerate(self.fds):
            if fd < 0:
                continue
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
            sock.close()
            self.fds[i] = -1
        self.ep.close()

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1

    def report(self) -> None:
        self.out.put(progress(self))


def fd_holder_main(spec: HolderSpec, ctrl: Any, out: Any) -> None:
    """The body of a lean generator process: ^C is the driver's, the open-file limit is
    raised, and a failure is reported to the driver as ("error", idx, text) before the
    process exits 1."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from gateway.gctune import quiet_gc
    from gateway.net.openfiles import raise_nofile

    raise_nofile()
    quiet_gc()  # a collection in a generator is latency it would wrongly blame on the gateway
    try:
        FdHolders(spec, ctrl, out).run()
    except BaseException as e:
        out.put(("error", spec.idx, f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from None
