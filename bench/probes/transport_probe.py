"""The connection layer alone: memory per idle connection and CPU per PING of uvloop's
TCP transport against a bare socket watched with `loop.add_reader`.

The gateway's idle connection costs ~2,025 B, 1,225 B of it uvloop's transport, and a
PING ~18 µs, most of it kernel time (docs/decisions.md, "Plain-TCP
connections are bare file descriptors"). This measures what a transport of one's own saves
(gateway/net/fdtransport.py is the gateway's): a server that
answers LOGIN with LOGIN_OK (the token is not checked) and PING with PONG, and does
nothing else, in one of two ways:

- `transport`: `loop.create_server` and an `asyncio.Protocol`, as the gateway does;
- `reader`: a non-blocking socket per connection, detached to its file descriptor and
  watched with `loop.add_reader`; reads go into one shared buffer (`os.readv`), writes
  are `os.write` (a PONG is six bytes: a short write is not handled, this is a probe).

Both keep the same two-slot object per connection. Measure each with the connect bench
against its pid:

    python -m bench.probes.transport_probe --kind reader --port 7400 &
    imgw bench connect --addr 127.0.0.1:7400 --token-key k:s --gateway-pid $! \\
        --connections 15000 --hb 5 --hold 45 --ramp 5000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import time
from typing import Final

import uvloop

from gateway.net.openfiles import raise_nofile
from protocol.codec import encode
from protocol.frames import LoginOk, Ping, Pong
from protocol.ops import Op

PING: Final = encode(Ping())
PONG: Final = encode(Pong())
LOGIN_OK: Final = encode(LoginOk(1, "probe", 30, 75, 65536, 2048, 0))
_READ_SIZE: Final = 65536


def _answer(data: bytes | memoryview) -> bytes:
    """What the probe says to a read that is not a lone PING: LOGIN_OK to a LOGIN (the
    op is the first element of the frame's msgpack array, right after its 4-byte
    length), nothing to anything else."""
    if len(data) > 5 and data[5] == Op.LOGIN:
        return LOGIN_OK
    return b""


class Held:
    """The per-connection state both kinds keep."""

    __slots__ = ("last_rx", "link")

    def __init__(self, link: object) -> None:
        self.link = link
        self.last_rx = 0.0


class ProbeProtocol(asyncio.Protocol):
    __slots__ = ("held", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.held: Held | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.held = Held(transport)

    def data_received(self, data: bytes) -> None:
        held = self.held
        assert held is not None
        held.last_rx = self.loop.time()
        transport: asyncio.Transport = held.link  # type: ignore[assignment]
        if data == PING:
            transport.write(PONG)
        elif reply := _answer(data):
            transport.write(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.held = None


class ReaderServer:
    """Connections as file descriptors watched with add_reader."""

    def __init__(self, loop: asyncio.AbstractEventLoop, listener: socket.socket) -> None:
        self.loop = loop
        self.listener = listener
        self.conns: dict[int, Held] = {}
        self.buf = bytearray(_READ_SIZE)
        self.view = memoryview(self.buf)

    def start(self) -> None:
        self.loop.add_reader(self.listener.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(256):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # EMFILE and the like: the client retries
            sock.setblocking(False)
            fd = sock.detach()
            self.conns[fd] = Held(fd)
            self.loop.add_reader(fd, self._read, fd)

    def _read(self, fd: int) -> None:
        try:
            n = os.readv(fd, [self.buf])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = 0
        if n == 0:
            self._close(fd)
            return
        self.conns[fd].last_rx = self.loop.time()
        data = self.view[:n]
        try:
            if data == PING:
                os.write(fd, PONG)
            elif reply := _answer(data):
                os.write(fd, reply)
        except OSError:
            self._close(fd)

    def _close(self, fd: int) -> None:
        self.loop.remove_reader(fd)
        self.conns.pop(fd, None)
        os.close(fd)


async def serve(kind: str, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(4096)
    listener.setblocking(False)
    if kind == "transport":
        server = await loop.create_server(lambda: ProbeProtocol(loop), sock=listener, backlog=4096)
        async with server:
            await asyncio.Event().wait()
    else:
        ReaderServer(loop, listener).start()
        await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.probes.transport_probe",
        description="LOGIN_OK and PONG only: the connection layer's memory and CPU per PING",
    )
    p.add_argument("--kind", choices=("transport", "reader"), required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7400)
    args = p.parse_args(argv)
    raise_nofile()
    print(f"probe {args.kind} on {args.host}:{args.port}, pid {os.getpid()}", flush=True)
    started = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.kind, args.host, args.port))
    print(f"stopped after {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
