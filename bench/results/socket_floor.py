"""The socket floor of a SEND on this machine, in Python: what a uvloop server costs per
message when it does only the socket work of a SEND (read the frame, decode it, write an
ACK to the sender and a PUSH to the other member), with no store, no Redis, no checks.

    python floor.py --rate 2000 --pairs 100 --seconds 20

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

import msgpack
import uvloop

HDR = struct.Struct(">I")


def frame(obj: object) -> bytes:
    body = msgpack.packb(obj)
    return HDR.pack(len(body)) + body


class ServerConn(asyncio.Protocol):
    conns: list["ServerConn"] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""
        self.idx = len(self.conns)
        self.conns.append(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        peer = self.conns[self.idx ^ 1] if len(self.conns) > (self.idx ^ 1) else None
        while len(buf) - pos >= 4:
            (n,) = HDR.unpack_from(buf, pos)
            if len(buf) - pos - 4 < n:
                break
            op, rid, conv, cmid, mtype, content = msgpack.unpackb(buf[pos + 4 : pos + 4 + n])
            pos += 4 + n
            self.t.write(frame([0x11, rid, conv, 1, 1, 1]))  # ACK
            if peer is not None:
                peer.t.write(frame([0x21, conv, 1, 1, self.idx, mtype, content, 1, cmid]))
        self.buf = buf[pos:]


def serve(port: int, ready: "mp.Event", stop: "mp.Event") -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(ServerConn, "127.0.0.1", port)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.2)
        srv.close()

    uvloop.run(main())


class ClientConn(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.got = 0

    def data_received(self, data: bytes) -> None:
        self.got += len(data)


def clients(port: int, pairs: int, rate: float, seconds: float, out: "mp.Queue") -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        conns = []
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
                c.t.write(frame([0x10, sent, sent % pairs, f"m{sent}", 1, payload]))
                sent += 1
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.5)
        out.put(sent)

    uvloop.run(main())


def ticks(pid: int) -> tuple[int, int]:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]), int(f[12])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=2000)
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--port", type=int, default=7399)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    ready, stop, q = ctx.Event(), ctx.Event(), ctx.Queue()
    s = ctx.Process(target=serve, args=(a.port, ready, stop))
    s.start()
    ready.wait(10)
    c = ctx.Process(target=clients, args=(a.port, a.pairs, a.rate, a.seconds, q))
    c.start()
    time.sleep(1.0)  # connected, before the load starts
    u0, s0 = ticks(s.pid)
    sent = q.get(timeout=a.seconds + 30)
    u1, s1 = ticks(s.pid)
    c.join()
    stop.set()
    s.join()
    hz = os.sysconf("SC_CLK_TCK")
    us = 1e6 / hz
    print(
        f"rate {a.rate:.0f}/s sent {sent}: server CPU per message "
        f"user {(u1 - u0) * us / sent:.1f} us, system {(s1 - s0) * us / sent:.1f} us, "
        f"total {((u1 - u0) + (s1 - s0)) * us / sent:.1f} us"
    )


if __name__ == "__main__":
    main()
