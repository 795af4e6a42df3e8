"""The WebSocket layer alone: memory per idle connection, CPU per PING and per message of
three WebSocket libraries, and of the plain protocol beside them.

A probe server answers LOGIN with LOGIN_OK (the token is not checked), PING with PONG and
a SEND with the same bytes (an echo, for the per-message figure), and does nothing else.
Each binary WebSocket message carries one frame body, no LEN (docs/protocol.md). Kinds:

- `websockets`: the library's sans-I/O `ServerProtocol` on a bare non-blocking socket
  watched with `loop.add_reader` (gateway.net.fdtransport's `FdServer`, as the gateway's
  plain-TCP connections);
- `wsproto`: wsproto's sans-I/O `WSConnection`, on the same bare sockets;

  both swap the handshake's object for a fresh one in the open state once the 101 is
  written (`ServerProtocol(state=OPEN)`, `wsproto.connection.Connection`): the
  handshake's keeps the request and its headers, ~2,250 of ~3,700 bytes (websockets) and
  ~3,000 of ~4,700 (wsproto), tracemalloc;
- `aiohttp`: `web.Application`, a `WebSocketResponse` handler per connection (its own
  transport and a task each; autoping and compression off);
- `tcp`: no WebSocket, the plain protocol on the same bare sockets: the floor.

Each keeps one small slotted object per connection. Drive a kind with the connect bench
against its pid, then with the echo:

    python -m bench.ws_probe --kind websockets --port 7400 &
    imgw bench connect --transport ws --addr 127.0.0.1:7400 --token-key k:s \\
        --gateway-pid $! --connections 15000 --hb 5 --hold 45 --ramp 5000
    python -m bench.ws_probe --echo ws://127.0.0.1:7400/ws --pid $! --rate 2000

(`--kind tcp`: `imgw bench connect` without `--transport ws`, and `--echo
tcp://127.0.0.1:7400`). `--echo` opens `--connections` logged-in connections and sends
`--rate` SEND-sized messages a second (`--size` bytes of content) round robin for
`--duration` s after a warmup, and reports the server's CPU µs per message echoed.
`--client-cost` measures what the bench's own WebSocket client saves against the
library's `ClientProtocol` (bench.wsclient says why it matters).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import socket
import sys
import time
import tracemalloc
from typing import Any, Final, cast
from urllib.parse import urlsplit

import uvloop

from bench.common import CLK_TCK, proc_cpu_split, proc_rss
from bench.wsclient import (
    OP_BINARY,
    PING_BODY,
    PONG_BODY,
    WS_PATH,
    ClientFramer,
    Handshake,
    WsWire,
    read_frames,
)
from gateway.net.openfiles import raise_nofile
from protocol.codec import encode_body, frame_bytes
from protocol.frames import Login, LoginOk, Send
from protocol.ops import Op
from protocol.token import sign_token

KINDS: Final = ("websockets", "wsproto", "aiohttp", "tcp")
LOGIN_OK_BODY: Final = encode_body(LoginOk(1, "probe", 30, 75, 65536, 2048, 0))
MAX_MESSAGE: Final = 65536
_LEN: Final = 4


def answer(body: bytes | bytearray | memoryview) -> bytes | None:
    """The probe's answer to one frame body: PONG to PING, LOGIN_OK to LOGIN, the same
    bytes to SEND, nothing to the rest (the op is the array's first element, right after
    the fixarray byte)."""
    if body == PING_BODY:
        return PONG_BODY
    if len(body) > 1:
        if body[1] == Op.LOGIN:
            return LOGIN_OK_BODY
        if body[1] == Op.SEND:
            return bytes(body)
    return None


# === servers ============================================================================


def websockets_conn() -> type[asyncio.Protocol]:
    """The connection class on the `websockets` library's `ServerProtocol` (made here, so
    that the library is imported only by the kind that uses it, and once)."""
    from websockets.frames import Frame, Opcode
    from websockets.http11 import Request
    from websockets.protocol import OPEN
    from websockets.server import ServerProtocol

    binary = Opcode.BINARY

    class WebsocketsConn(asyncio.Protocol):
        __slots__ = ("proto", "transport")

        def __init__(self) -> None:
            self.proto = ServerProtocol(max_size=MAX_MESSAGE)
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)

        def data_received(self, data: bytes) -> None:
            proto = self.proto
            proto.receive_data(data)
            for ev in proto.events_received():
                if isinstance(ev, Frame):
                    if ev.opcode is binary and (reply := answer(ev.data)) is not None:
                        proto.send_binary(reply)
                elif isinstance(ev, Request):
                    ok = ev.path == WS_PATH
                    proto.send_response(proto.accept(ev) if ok else proto.reject(404, "no"))
                    if ok:  # the client waits for the 101: nothing behind the request
                        self._flush()
                        self.proto = ServerProtocol(state=OPEN, max_size=MAX_MESSAGE)
                        return
            self._flush()

        def _flush(self) -> None:
            transport = self.transport
            assert transport is not None
            for data in self.proto.data_to_send():
                if data:
                    transport.write(data)
                else:  # the library's end of stream: close once written
                    transport.close()

        def eof_received(self) -> bool:
            self.proto.receive_eof()
            self._flush()
            return False

        def connection_lost(self, exc: Exception | None) -> None:
            self.transport = None

    return WebsocketsConn


def wsproto_conn() -> type[asyncio.Protocol]:
    """The connection class on wsproto's `WSConnection`."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.connection import Connection
    from wsproto.events import (
        AcceptConnection,
        BytesMessage,
        CloseConnection,
        Ping,
        RejectConnection,
        Request,
    )

    server = ConnectionType.SERVER

    class WsprotoConn(asyncio.Protocol):
        __slots__ = ("partial", "transport", "ws")

        def __init__(self) -> None:
            self.ws: WSConnection | Connection = WSConnection(server)
            self.transport: asyncio.Transport | None = None
            self.partial = b""  # a message that came in pieces, until its last

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)

        def data_received(self, data: bytes | None) -> None:
            ws, out, close = self.ws, [], False
            ws.receive_data(data)
            for ev in ws.events():
                if isinstance(ev, BytesMessage):
                    body = ev.data
                    if not ev.message_finished or self.partial:
                        self.partial += bytes(body)
                        if not ev.message_finished:
                            continue
                        body, self.partial = self.partial, b""
                    if (reply := answer(body)) is not None:
                        out.append(ws.send(BytesMessage(data=reply)))
                elif isinstance(ev, Request):
                    if ev.target == WS_PATH:
                        out.append(ws.send(AcceptConnection()))
                        # the client waits for the 101: nothing behind the request
                        self.ws = Connection(server)
                    else:
                        out.append(ws.send(RejectConnection(status_code=404)))
                        close = True
                elif isinstance(ev, Ping):
                    out.append(ws.send(ev.response()))
                elif isinstance(ev, CloseConnection):
                    out.append(ws.send(ev.response()))
                    close = True
            transport = self.transport
            assert transport is not None
            if out:
                transport.write(b"".join(out))
            if close:
                transport.close()

        def eof_received(self) -> bool:
            with contextlib.suppress(Exception):  # a socket closed without a close frame
                self.ws.receive_data(None)
            return False

        def connection_lost(self, exc: Exception | None) -> None:
            self.transport = None

    return WsprotoConn


class TcpConn(asyncio.Protocol):
    """One plain-protocol connection (4-byte LEN, then the body): the floor."""

    __slots__ = ("buf", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        out, at = [], 0
        while len(buf) - at >= _LEN:
            n = int.from_bytes(buf[at : at + _LEN], "big")
            if len(buf) - at < _LEN + n:
                break
            if (reply := answer(buf[at + _LEN : at + _LEN + n])) is not None:
                out.append(frame_bytes(reply))
            at += _LEN + n
        self.buf = buf[at:]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def _aiohttp(listener: socket.socket) -> None:
    from aiohttp import WSMsgType, web

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            max_msg_size=MAX_MESSAGE, autoping=False, compress=False, heartbeat=None
        )
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == WSMsgType.BINARY and (reply := answer(msg.data)) is not None:
                await ws.send_bytes(reply)
        return ws

    app = web.Application()
    app.router.add_get(WS_PATH, handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.SockSite(runner, listener, backlog=4096).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


async def serve(kind: str, host: str, port: int) -> None:
    from gateway.net.fdtransport import FdServer

    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(4096)
    if kind == "aiohttp":
        await _aiohttp(listener)
        return
    factory = {"websockets": websockets_conn, "wsproto": wsproto_conn}.get(kind, lambda: TcpConn)()
    FdServer(loop, listener, factory).start()
    await asyncio.Event().wait()


# === the echo driver ====================================================================


class EchoClient(asyncio.Protocol):
    """One logged-in connection of the echo driver; counts what comes back."""

    def __init__(self, driver: EchoDriver) -> None:
        self.driver = driver
        self.transport: asyncio.Transport | None = None
        self.handshake: Handshake | None = None
        self.buf = b""
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        d = self.driver
        if d.ws_path is not None:
            self.handshake = Handshake(d.host, d.port, d.ws_path)
            self.transport.write(self.handshake.request())
        else:
            self.transport.write(d.wrap(d.login))

    def data_received(self, data: bytes) -> None:
        d = self.driver
        if self.handshake is not None:
            if self.handshake.receive(data) is None:
                return
            self.handshake = None
            assert self.transport is not None
            self.transport.write(d.wrap(d.login))
            return
        buf = self.buf + data if self.buf else data
        if d.ws_path is not None:
            ws, self.buf = read_frames(buf)
            bodies = [p for op, p in ws if op == OP_BINARY]
        else:
            bodies, at = [], 0
            while len(buf) - at >= _LEN:
                n = int.from_bytes(buf[at : at + _LEN], "big")
                if len(buf) - at < _LEN + n:
                    break
                bodies.append(buf[at + _LEN : at + _LEN + n])
                at += _LEN + n
            self.buf = buf[at:]
        for body in bodies:
            if body[1] == Op.LOGIN_OK and not self.ready.done():
                self.ready.set_result(None)
            elif body[1] == Op.SEND:
                d.echoed += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed before LOGIN_OK"))


class EchoDriver:
    def __init__(self, url: str, connections: int, size: int) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "tcp") or parts.hostname is None or parts.port is None:
            raise SystemExit("--echo takes ws://HOST:PORT/PATH or tcp://HOST:PORT")
        self.host, self.port = parts.hostname, parts.port
        self.ws_path = (parts.path or WS_PATH) if parts.scheme == "ws" else None
        self.framer = ClientFramer()
        self.connections = connections
        self.login = encode_body(Login(1, 1, 1, "probe", sign_token("k", "s", 1, "probe", 0)))
        content = os.urandom(size)
        self.send = encode_body(Send(2, 1, "probe-000000000000", 1, content))
        self.echoed = 0
        self.clients: list[EchoClient] = []

    def wrap(self, body: bytes) -> bytes:
        return self.framer.frame(body) if self.ws_path is not None else frame_bytes(body)

    async def run(self, rate: float, warmup: float, duration: float, pid: int) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        for _ in range(self.connections):
            _, c = await loop.create_connection(lambda: EchoClient(self), self.host, self.port)
            self.clients.append(c)
        await asyncio.wait_for(asyncio.gather(*(c.ready for c in self.clients)), 30)
        message = self.wrap(self.send)
        tick, k = 0.001, 0
        t0 = time.monotonic()
        window: dict[str, Any] = {}
        while True:
            now = time.monotonic()
            if not window and now - t0 >= warmup:
                window = {"t": now, "echoed": self.echoed, "cpu": _ticks(pid),
                          "self": time.process_time()}  # fmt: skip
            if now - t0 >= warmup + duration:
                break
            due = int((now - t0) * rate)
            while k < due:
                transport = self.clients[k % self.connections].transport
                if transport is not None:
                    transport.write(message)
                k += 1
            await asyncio.sleep(tick)
        wall = time.monotonic() - window["t"]
        echoed = self.echoed - window["echoed"]
        cpu = (_ticks(pid) - window["cpu"]) / CLK_TCK
        mine = time.process_time() - window["self"]
        for c in self.clients:
            if c.transport is not None:
                c.transport.close()
        return {
            "rate_target": rate, "duration_s": round(wall, 2), "echoed": echoed,
            "echoed_per_s": round(echoed / wall, 1),
            "server_cpu_us_per_msg": round(1e6 * cpu / echoed, 1) if echoed else None,
            "server_cpu_percent": round(100 * cpu / wall, 1),
            "driver_cpu_us_per_msg": round(1e6 * mine / echoed, 1) if echoed else None,
            "server_rss_bytes": proc_rss(pid),
        }  # fmt: skip


def _ticks(pid: int) -> int:
    split = proc_cpu_split(pid)
    if split is None:
        raise SystemExit(f"process {pid} is gone")
    return split[0] + split[1]


# === the client's own cost ==============================================================


def client_cost(n: int = 2000, rounds: int = 100_000) -> dict[str, Any]:
    """What a generator's connection costs with the library's `ClientProtocol` kept open
    against bench.wsclient: bytes per open connection (tracemalloc) and CPU µs per PING
    round (the PING written, the PONG read)."""
    from websockets.client import ClientProtocol
    from websockets.server import ServerProtocol
    from websockets.uri import parse_uri

    def opened() -> ClientProtocol:
        c = ClientProtocol(parse_uri("ws://127.0.0.1:7400/ws"), max_size=MAX_MESSAGE)
        s = ServerProtocol(max_size=MAX_MESSAGE)
        c.send_request(c.connect())
        for data in c.data_to_send():
            s.receive_data(data)
        request = s.events_received()[0]
        s.send_response(s.accept(request))  # type: ignore[arg-type]
        for data in s.data_to_send():
            c.receive_data(data)
        c.events_received()
        return c

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    kept = [opened() for _ in range(n)]
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    per_conn = sum(s.size_diff for s in after.compare_to(before, "filename")) / n
    c = kept[0]
    del kept
    wire = WsWire()
    pong = wire.pong
    t = time.process_time()
    for _ in range(rounds):
        c.send_binary(PING_BODY)
        c.data_to_send()
        c.receive_data(pong)
        c.events_received()
    library_us = 1e6 * (time.process_time() - t) / rounds
    t = time.process_time()
    pongs = 0
    for _ in range(rounds):
        data = wire.ping  # written as is
        if pong == wire.pong:  # bench.holders' PONG test
            pongs += 1
    lean_us = 1e6 * (time.process_time() - t) / rounds
    return {
        "library_bytes_per_open_connection": round(per_conn),
        "library_cpu_us_per_ping_round": round(library_us, 2),
        "lean_bytes_per_open_connection": 0,
        "lean_cpu_us_per_ping_round": round(lean_us, 3),
        "ping_frame": data.hex(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.ws_probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--kind", choices=KINDS, help="serve this kind")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7400)
    p.add_argument("--echo", metavar="URL", help="drive a probe: ws://HOST:PORT/PATH or tcp://..")
    p.add_argument("--pid", type=int, help="with --echo: the probe's pid, to sample its CPU")
    p.add_argument("--connections", type=int, default=100, help="with --echo (100)")
    p.add_argument("--rate", type=float, default=2000, help="with --echo: messages/s (2000)")
    p.add_argument("--size", type=int, default=100, help="with --echo: content bytes (100)")
    p.add_argument("--warmup", type=float, default=3, help="with --echo, s (3)")
    p.add_argument("--duration", type=float, default=20, help="with --echo, s (20)")
    p.add_argument("--json", metavar="PATH", help="with --echo or --client-cost: write here")
    p.add_argument("--client-cost", action="store_true", help="the generator client's cost")
    args = p.parse_args(argv)
    if args.client_cost:
        return _report(client_cost(), args.json)
    if args.echo:
        if args.pid is None:
            p.error("--echo needs --pid (the probe's, to sample its CPU)")
        driver = EchoDriver(args.echo, args.connections, args.size)
        result = uvloop.run(driver.run(args.rate, args.warmup, args.duration, args.pid))
        return _report({"echo": args.echo, "size": args.size, **result}, args.json)
    if args.kind is None:
        p.error("give --kind (serve), --echo URL (drive) or --client-cost")
    raise_nofile()
    print(f"probe {args.kind} on {args.host}:{args.port}, pid {os.getpid()}", flush=True)
    started = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve(args.kind, args.host, args.port))
    print(f"stopped after {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


def _report(result: dict[str, Any], path: str | None) -> int:
    text = json.dumps(result, indent=1)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
