"""Plain-TCP client connections as bare file descriptors, without uvloop's transports
(`--client-transport fd`, the default: docs/decisions.md).

uvloop's TCP transport and its libuv handle take 1,225 of the ~2,025 bytes of an idle
logged-in connection. Here a connection is its socket's file descriptor, watched with
`loop.add_reader`, and one small `FdTransport` that implements what `Connection` uses
of `asyncio.Transport`: write (straight to the socket; what the kernel does not take
waits for `add_writer`), writelines, close (after what waits is written), abort,
pause/resume reading, and the pause_writing/resume_writing calls past a high-water
mark. Reads go into one buffer shared by the process's connections (`os.readv`) and
are handed over as bytes.

Measured with `bench.probes.transport_probe` (docs/decisions.md,
"Plain-TCP connections are bare file descriptors"): 812 bytes
per idle connection against 1,334 with uvloop's transport, and the same CPU per PING;
the gateway on it, 1,494 bytes against ~2,020.

TLS connections and a host that names several addresses keep uvloop's `create_server`.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import socket
import sys
import termios
from collections.abc import Callable
from typing import Any, Final, cast

import structlog

HIGH_WATER: Final = 64 * 1024  # as uvloop: pause_writing past it ...
LOW_WATER: Final = 16 * 1024  # ... resume_writing at or below it
READ_SIZE: Final = 256 * 1024  # as uvloop: one read takes up to this much
# Connections accepted per readiness of the listener. Few: an accepted connection's login
# deadline runs from its accept, so in a reconnect storm connections wait better in the
# kernel's backlog than in a worker still busy accepting (512 timed logins out).
ACCEPT_BATCH: Final = 64
ACCEPT_PAUSE_S: Final = 1.0  # out of files (or memory): accept again after this
_ACCEPT_EXHAUSTED: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

log = structlog.get_logger("imgw")

# One read buffer for every connection of the process: each read is copied out at once,
# before the next callback runs.
_BUF: Final = bytearray(READ_SIZE)
_BUFS: Final = [_BUF]  # os.readv's argument, made once
_VIEW: Final = memoryview(_BUF)


_READING: Final = 1  # watched with add_reader
_CLOSING: Final = 2  # close() or abort() called, or a socket error
_PAUSED: Final = 4  # pause_writing called, resume_writing not yet
_EOF: Final = 8  # the peer closed its side
_ABORTED: Final = 16  # abort() or a socket error: no goodbye


class FdTransport:
    """One connection: four pointers (each byte counts a million times over), and not
    an `asyncio.Transport` subclass, whose `_extra` slot would be a fifth; it has the
    methods `Connection` calls. `_out` is None while nothing waits to be written (an
    idle connection owns no list)."""

    __slots__ = ("_fd", "_flags", "_out", "_protocol")
    lingers: Final = True  # close() shuts down, then waits for the peer's close (_linger)

    def __init__(self, fd: int, protocol: asyncio.Protocol) -> None:
        self._fd = fd
        self._protocol = protocol
        self._out: list[bytes] | None = None
        self._flags = 0

    # -- asyncio.Transport ----------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """`peername` and `sockname` (asked for only with per-address limits)."""
        if self._fd < 0 or name not in ("peername", "sockname"):
            return default
        sock = socket.socket(fileno=self._fd)
        try:
            return sock.getpeername() if name == "peername" else sock.getsockname()
        except OSError:
            return default
        finally:
            sock.detach()

    def is_closing(self) -> bool:
        return bool(self._flags & _CLOSING)

    def is_reading(self) -> bool:
        return bool(self._flags & _READING)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def get_write_buffer_size(self) -> int:
        return 0 if self._out is None else sum(map(len, self._out))

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._fd < 0 or not data:
            return
        if self._out is not None:
            self._out.append(bytes(data))
            self._check_high()
            return
        try:
            n = os.write(self._fd, data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as e:
            self._fail(e)
            return
        if n == len(data):
            return
        self._out = [bytes(data[n:])]
        asyncio.get_running_loop().add_writer(self._fd, _writable, self)
        self._check_high()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def drop_unsent(self) -> None:
        """Drop what waits to be written but the rest of a write already begun: each
        write() is whole frames, so what stays ends on a frame boundary (a slow
        consumer's KICK goes right behind it)."""
        if self._out is not None and len(self._out) > 1:
            del self._out[1:]

    def pause_reading(self) -> None:
        if self._flags & _READING:
            self._flags &= ~_READING
            asyncio.get_running_loop().remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._flags & (_READING | _CLOSING) and self._fd >= 0:
            self._flags |= _READING
            asyncio.get_running_loop().add_reader(self._fd, _readable, self)

    def close(self) -> None:
        """Stop reading; close once what waits has been written."""
        if self._flags & _CLOSING:
            return
        self._flags |= _CLOSING
        self.pause_reading()
        if self._out is None:
            asyncio.get_running_loop().call_soon(self._finish, None)

    def abort(self) -> None:
        self._fail(None)

    def can_write_eof(self) -> bool:
        return False

    # -- internals ------------------------------------------------------------------------

    def _check_high(self) -> None:
        if not self._flags & _PAUSED and self.get_write_buffer_size() > HIGH_WATER:
            self._flags |= _PAUSED
            self._protocol.pause_writing()

    def _fail(self, exc: Exception | None) -> None:
        """Drop what waits and close now (abort, or a socket error)."""
        if self._fd < 0:
            return
        self._flags |= _ABORTED
        if not self._flags & _CLOSING:
            self._flags |= _CLOSING
            self.pause_reading()
        if self._out is not None:
            self._out = None
            asyncio.get_running_loop().remove_writer(self._fd)
        asyncio.get_running_loop().call_soon(self._finish, exc)

    def _finish(self, exc: Exception | None) -> None:
        fd = self._fd
        if fd < 0:
            return
        loop = asyncio.get_running_loop()
        self.pause_reading()
        if self._out is not None:
            self._out = None
            loop.remove_writer(fd)
        self._fd = -1
        if not self._flags & (_ABORTED | _EOF):
            _linger(loop, fd)
        else:
            os.close(fd)
        self._protocol.connection_lost(exc)


# A socket we close while the peer still sends (a PING to a connection it has not yet
# read the KICK of) would answer with a reset, and a reset makes the peer's kernel drop
# what it received and the client has not read: the last frames and the KICK. So a
# closed connection is shut down for writing (FIN after the last byte) and read and
# discarded until the peer closes too, for as long as the bytes still queued take at
# LINGER_RATE, within LINGER_MIN_S..LINGER_MAX_S; then closed.
LINGER_RATE: Final = 1024  # bytes/s: the slowest reader still owed its last frames
LINGER_MIN_S: Final = 5.0
LINGER_MAX_S: Final = 300.0
LINGER_MAX: Final = 10_000  # sockets lingering at once; past that, closed at once
_lingering: dict[int, asyncio.TimerHandle] = {}


def _linger(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    if len(_lingering) >= LINGER_MAX:
        os.close(fd)
        return
    try:
        os.set_blocking(fd, False)
        with socket.socket(fileno=fd) as sock:
            try:
                sock.shutdown(socket.SHUT_WR)
                queued = _unsent(sock)
            finally:
                sock.detach()
    except OSError:
        os.close(fd)
        return
    wait = min(LINGER_MAX_S, max(LINGER_MIN_S, queued / LINGER_RATE))
    _lingering[fd] = loop.call_later(wait, _end_linger, loop, fd)
    loop.add_reader(fd, _discard, loop, fd)


def _unsent(sock: socket.socket) -> int:
    """Bytes in the socket's send queue (SIOCOUTQ), 0 where unknown."""
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")  # SIOCOUTQ
    except OSError:
        return 0
    return int.from_bytes(buf, sys.byteorder)


def _discard(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    try:
        n = os.readv(fd, _BUFS)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        n = 0
    if n == 0:
        _end_linger(loop, fd)


def _end_linger(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    timer = _lingering.pop(fd, None)
    if timer is None:
        return
    timer.cancel()
    loop.remove_reader(fd)
    os.close(fd)


def _readable(t: FdTransport) -> None:
    try:
        n = os.readv(t._fd, _BUFS)
    except (BlockingIOError, InterruptedError):
        return
    except OSError as e:
        t._fail(e)
        return
    if n == 0:  # EOF: the protocol says whether to keep our side open (the gateway: no)
        t._flags |= _EOF
        keep = t._protocol.eof_received()
        if keep:
            t.pause_reading()
        else:
            t.close()
        return
    t._protocol.data_received(_VIEW[:n].tobytes())


def _writable(t: FdTransport) -> None:
    out = t._out
    if out is None or t._fd < 0:
        return
    data = out[0] if len(out) == 1 else b"".join(out)
    try:
        n = os.write(t._fd, data)
    except (BlockingIOError, InterruptedError):
        return
    except OSError as e:
        t._fail(e)
        return
    left = len(data) - n
    if left:
        # Keep each write's bytes apart: every element ends where a write() ended, on
        # a frame boundary, so that drop_unsent can keep whole frames.
        while n >= len(out[0]):
            n -= len(out.pop(0))
        if n:
            out[0] = out[0][n:]
    else:
        t._out = None
        asyncio.get_running_loop().remove_writer(t._fd)
    if t._flags & _PAUSED and left <= LOW_WATER:
        t._flags &= ~_PAUSED
        t._protocol.resume_writing()
    if t._out is None and t._flags & _CLOSING:
        t._finish(None)


class FdServer:
    """Accepts on a bound, listening socket; each connection gets `factory()`'s protocol
    and an `FdTransport` (handed to `connection_made` as the transport it stands for)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        listener: socket.socket,
        factory: Callable[[], asyncio.Protocol],
    ) -> None:
        self.loop = loop
        self.listener = listener
        self.factory = factory
        self._accepting = False
        self._closed = False
        self._nodelay_inherited = False
        self._resume: asyncio.TimerHandle | None = None

    @property
    def sockets(self) -> list[socket.socket]:
        return [self.listener]

    def start(self) -> None:
        self.listener.setblocking(False)
        # Accepted sockets inherit TCP_NODELAY from the listener on Linux: no setsockopt
        # per connection (set again below where it is not inherited).
        self._nodelay_inherited = _inherits_nodelay(self.listener)
        self._accepting = True
        self.loop.add_reader(self.listener.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting and close the listening socket (what waits in its backlog is
        reset); the connections stay."""
        if self._closed:
            return
        self._closed = True
        if self._resume is not None:
            self._resume.cancel()
        if self._accepting:
            self._accepting = False
            self.loop.remove_reader(self.listener.fileno())
        self.listener.close()

    def _accept(self) -> None:
        listener = self.listener
        for _ in range(ACCEPT_BATCH):
            try:
                fd, _ = listener._accept()  # type: ignore[attr-defined]  # no socket object
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno not in _ACCEPT_EXHAUSTED:
                    raise
                log.error("accept failed; accepting again shortly", error=str(e))
                self._accepting = False
                self.loop.remove_reader(listener.fileno())
                self._resume = self.loop.call_later(ACCEPT_PAUSE_S, self._accept_again)
                return
            try:
                os.set_blocking(fd, False)
                if not self._nodelay_inherited:
                    with socket.socket(fileno=fd) as sock:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        sock.detach()
            except OSError:
                os.close(fd)  # reset already
                continue
            protocol = self.factory()
            t = FdTransport(fd, protocol)
            protocol.connection_made(cast(asyncio.Transport, t))
            t.resume_reading()  # unless connection_made closed it

    def _accept_again(self) -> None:
        self._resume = None
        if not self._closed and not self._accepting:
            self._accepting = True
            self.loop.add_reader(self.listener.fileno(), self._accept)


def _inherits_nodelay(listener: socket.socket) -> bool:
    """Set TCP_NODELAY on `listener`; whether sockets accepted from it have it too (Linux
    copies it to them: tests/e2e/test_fd_connections.py checks an accepted one)."""
    try:
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        return False
    return sys.platform.startswith("linux")
