"""The socket floor of a SEND on this machine, in Python: what a uvloop server costs per
message when it does only the socket work of a SEND (read the frame, decode it, write an
ACK to the sender and a PUSH to the other member), with no store, no Redis, no checks.

    python -m bench.probes.socket_floor --rate 2000 --pairs 100 --seconds 20

Prints the server process's user and system CPU per message. Clients run in a second
process (uvloop, a 1 ms pacing timer, as bench.senders), 100 pairs by default.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import struct
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import ClassVar, cast

import msgpack
import uvloop

HDR = struct.Struct(">I")
OP_ACK = 0x11
OP_PUSH = 0x21
OP_SEND = 0x10


def frame(obj: object) -> bytes:
    body: bytes = msgpack.packb(obj)
    return HDR.pack(len(body)) + body


class ServerConn(asyncio.Protocol):
    """One server-side connection: ACK each SEND, PUSH it to the paired connection."""

    conns: ClassVar[list[ServerConn]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = cast(asyncio.WriteTransport, transport)  # uvloop's is no asyncio subclass
        self.buf = b""
        self.idx = len(self.conns)
        self.conns.append(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        peer = self.conns[self.idx ^ 1] if len(self.conns) > (self.idx ^ 1) else None
        while len(buf) - pos >= HDR.size:
            (n,) = HDR.unpack_from(buf, pos)
            if len(buf) - pos - HDR.size < n:
                break
            _op, rid, conv, cmid, mtype, content = msgpack.unpackb(
                buf[pos + HDR.size : pos + HDR.size + n]
            )
            pos += HDR.size + n
            self.t.write(frame([OP_ACK, rid, conv, 1, 1, 1]))
            if peer is not None:
                peer.t.write(frame([OP_PUSH, conv, 1, 1, self.idx, mtype, content, 1, cmid]))
        self.buf = buf[pos:]


def serve(port: int, ready: Event, stop: Event) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(ServerConn, "127.0.0.1", port)
        ready.set()
        await loop.run_in_executor(None, stop.wait)  # a process event: wait in a thread
        srv.close()

    uvloop.run(run())


class ClientConn(asyncio.Protocol):
    """One client connection: counts what it receives."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = cast(asyncio.WriteTransport, transport)  # uvloop's is no asyncio subclass
        self.got = 0

    def data_received(self, data: bytes) -> None:
        self.got += len(data)


def clients(port: int, pairs: int, rate: float, seconds: float, out: Queue[int]) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        conns: list[ClientConn] = []
        for _ in range(2 * pairs):
            _, p = await loop.create_connection(ClientConn, "127.0.0.1", port)
            conns.append(p)
            await asyncio.sleep(0)
        await asyncio.sleep(0.5)
        start = loop.time()
        sent = 0
        payload = os.urandom(100)
        while (now := loop.time()) - start < seconds:
            due = int((now - start) * rate)
            while sent < due:
                c = conns[sent % len(conns)]
                c.t.write(frame([OP_SEND, sent, sent % pairs, f"m{sent}", 1, payload]))
                sent += 1
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.5)
        out.put(sent)

    uvloop.run(run())


def ticks(pid: int) -> tuple[int, int]:
    """The process's user and system CPU, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.probes.socket_floor", description=__doc__)
    ap.add_argument("--rate", type=float, default=2000, help="SENDs per second")
    ap.add_argument("--pairs", type=int, default=100, help="client pairs")
    ap.add_argument("--seconds", type=float, default=20, help="how long the load runs")
    ap.add_argument("--port", type=int, default=7399, help="the server's port on 127.0.0.1")
    a = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    q: Queue[int] = ctx.Queue()
    s = ctx.Process(target=serve, args=(a.port, ready, stop))
    s.start()
    ready.wait(10)
    c = ctx.Process(target=clients, args=(a.port, a.pairs, a.rate, a.seconds, q))
    c.start()
    time.sleep(1.0)  # connected, before the load starts
    assert s.pid is not None
    u0, s0 = ticks(s.pid)
    sent = q.get(timeout=a.seconds + 30)
    u1, s1 = ticks(s.pid)
    c.join()
    stop.set()
    s.join()
    us = 1e6 / os.sysconf("SC_CLK_TCK")
    print(
        f"rate {a.rate:.0f}/s sent {sent}: server CPU per message "
        f"user {(u1 - u0) * us / sent:.1f} us, system {(s1 - s0) * us / sent:.1f} us, "
        f"total {((u1 - u0) + (s1 - s0)) * us / sent:.1f} us"
    )


if __name__ == "__main__":
    main()
