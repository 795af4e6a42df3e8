"""A bystander's SEND latency while one uid floods TYPING from many connections.

Starts `imgw serve` from a source tree (this one, or `--tree` another checkout, to
compare), logs a bystander and its peer in (a p2p), and one attacker uid on
`--attackers` connections (each its own device; the node may refuse some: per-uid cap)
in a group of 100 members. Each attacker connection writes TYPING as fast as the
gateway reads it (256 KiB writes, from a process of its own). Meanwhile the bystander
sends one SEND at a time, every `--interval-ms`, and the script prints the latency of
its acks (p50, p99, max), before the flood and during it, as one JSON line.

    python -m bench.flood --seconds 10 --attackers 20
    python -m bench.flood --store mysql://root:@127.0.0.1:3306/imgw_flood \\
        --cache redis://127.0.0.1:6379/9 --seconds 10 --attackers 20
    python -m bench.flood --tree /path/to/other/checkout ...   # the same load, another build

Check first that no other benchmark runs (`ps aux | grep "imgw bench"`): the numbers
are CPU-bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.frames import (
    ConvOk,
    Error,
    GroupCreate,
    Login,
    LoginOk,
    OpenP2P,
    Ping,
    Send,
    SendAck,
    Typing,
)
from protocol.token import sign_token

KID, SECRET = "flood", "flood-secret"
ROOT = Path(__file__).resolve().parent.parent
ATTACKER, BYSTANDER, PEER = 1, 100_001, 100_002


def token(uid: int, device: str) -> str:
    return sign_token(KID, SECRET, uid, device, int(time.time()) + 3600)


class Link:
    """One plain-TCP client connection: requests and their answers, nothing else."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(side=Side.CLIENT, max_frame=1 << 24)
        self.frames: list[Any] = []

    @classmethod
    async def login(cls, port: int, uid: int, device: str) -> Link | Error:
        link = cls(*await asyncio.open_connection("127.0.0.1", port))
        ok = await link.request(Login(1, 1, uid, device, token(uid, device)), 1)
        if isinstance(ok, LoginOk):
            return link
        link.writer.close()
        assert isinstance(ok, Error), ok
        return ok

    async def request(self, frame: Any, rid: int, timeout: float = 60.0) -> Any:
        self.writer.write(encode(frame))
        async with asyncio.timeout(timeout):
            while True:
                for i, f in enumerate(self.frames):
                    if getattr(f, "rid", None) == rid:
                        return self.frames.pop(i)
                self.frames.clear()  # pushes, notices: not what is measured
                data = await self.reader.read(1 << 16)
                if not data:
                    raise ConnectionError("closed")
                self.frames += self.decoder.feed(data)


def attack(port: int, n: int, conv_id: int, op: str, until: float, out: Any) -> None:
    """The attacker's process: `n` connections of one uid, TYPING flat out."""

    async def main() -> None:
        links = [await Link.login(port, ATTACKER, f"a{i}") for i in range(n)]
        online = [x for x in links if isinstance(x, Link)]
        if op == "send":  # distinct ids: each one a new message (over budget: refused)
            flood = b"".join(
                encode(Send(i + 1, conv_id, f"f{os.getpid()}-{i}", 1, b"x")) for i in range(8000)
            )
        else:
            frame = encode(Ping() if op == "ping" else Typing(conv_id))
            flood = frame * (256 * 1024 // len(frame))
        sent = [0]
        seen: dict[str, int] = {}

        async def one(link: Link) -> None:
            async def discard() -> None:  # what the gateway answers: counted by kind
                while data := await link.reader.read(1 << 16):
                    for f in link.decoder.feed(data):
                        kind = type(f).__name__ + str(getattr(f, "code", getattr(f, "reason", "")))
                        seen[kind] = seen.get(kind, 0) + 1

            reading = asyncio.create_task(discard())
            try:
                while time.time() < until:
                    link.writer.write(flood)
                    async with asyncio.timeout(max(0.1, until - time.time())):
                        await link.writer.drain()  # while the gateway does not read
                    sent[0] += len(flood)
            except (ConnectionError, OSError, TimeoutError):
                pass
            reading.cancel()
            link.writer.transport.abort()

        await asyncio.gather(*(one(x) for x in online))
        out.put(
            {"online": len(online), "refused": n - len(online), "bytes": sent[0], "answers": seen}
        )

    asyncio.run(main())


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p * len(s)))] * 1000, 2) if s else float("nan")


async def measure(
    link: Link, conv_id: int, seconds: float, interval: float, tag: str
) -> dict[str, Any]:
    lat: list[float] = []
    errors: dict[str, int] = {}
    until = time.monotonic() + seconds
    i = 0
    while time.monotonic() < until:
        i += 1
        started = time.monotonic()
        rid = 10_000 + i if tag == "during" else 1_000 + i
        reply = await link.request(Send(rid, conv_id, f"{tag}-{i}", 1, b"hello"), rid)
        lat.append(time.monotonic() - started)
        if not isinstance(reply, SendAck):
            name = str(getattr(reply, "code", type(reply).__name__))
            errors[name] = errors.get(name, 0) + 1
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    return {"sends": len(lat), "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99),
            "max_ms": pct(lat, 1.0), "errors": errors}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise SystemExit(f"imgw serve exited with {proc.returncode}")
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise SystemExit("imgw serve did not listen in time")


def start_gateway(
    args: argparse.Namespace, tree: Path, port: int, log: Any
) -> subprocess.Popen[bytes]:
    data = tempfile.mkdtemp(prefix="imgw-flood-")
    cmd = [
        sys.executable, "-c", "import sys; from gateway.cli import main; sys.exit(main())",
        "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", data,
        "--token-key", f"{KID}:{SECRET}", "--log-level", "warning",
        *(["--store", args.store] if args.store else []),
        *(["--cache", args.cache] if args.cache else []),
        *args.gateway_arg,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if args.store.startswith("mysql"):  # the schema first (idempotent)
        migrate = [*cmd[:3], "db", "migrate", "--store", args.store]
        subprocess.run(migrate, cwd=tree, env=env, check=True, stdout=sys.stderr)
    return subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=log)


async def run(args: argparse.Namespace, tree: Path, log: Any) -> dict[str, Any]:
    """The scenario against a gateway from `tree`, which logs into `log`."""
    port = free_port()
    gw = start_gateway(args, tree, port, log)
    interval = args.interval_ms / 1000
    try:
        await wait_port(port, gw)
        by = await Link.login(port, BYSTANDER, "phone")
        peer = await Link.login(port, PEER, "phone")
        owner = await Link.login(port, ATTACKER, "owner")
        assert isinstance(by, Link) and isinstance(peer, Link) and isinstance(owner, Link)
        p2p = await by.request(OpenP2P(2, PEER), 2)
        group = await owner.request(GroupCreate(2, "flood", tuple(range(2, 101))), 2)
        assert isinstance(p2p, ConvOk) and isinstance(group, ConvOk), (p2p, group)
        owner.writer.close()
        result: dict[str, Any] = {
            "tree": str(tree),
            "store": args.store or "embedded",
            "op": args.op,
        }
        result["before"] = await measure(by, p2p.conv_id, args.baseline, interval, "before")
        until = time.time() + args.seconds + 3
        q: Any = mp.get_context("spawn").Queue()
        proc = mp.get_context("spawn").Process(
            target=attack,
            args=(port, args.attackers, group.conv_id, args.op, until, q),
            daemon=True,
        )
        proc.start()
        await asyncio.sleep(2.0)  # logged in and flooding
        result["during"] = await measure(by, p2p.conv_id, args.seconds, interval, "during")
        result["attack"] = await asyncio.to_thread(q.get, True, 60)
        proc.join(10)
        result["after"] = await measure(by, p2p.conv_id, 2.0, interval, "after")
    finally:
        gw.terminate()
        try:
            gw.wait(15)
        except subprocess.TimeoutExpired:
            gw.kill()
    log.seek(0)
    lines = log.read().decode(errors="replace").splitlines()
    result["gateway_log"] = {
        "warnings": sum("warning" in line for line in lines),
        "sync_hint_broadcasts": sum("sending SYNC_HINT" in line for line in lines),
        "backend_timeouts": sum("TimeoutError" in line for line in lines),
    }
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", default=str(ROOT), help="source tree to run imgw serve from")
    p.add_argument("--store", default="", help="store URL (default: embedded)")
    p.add_argument("--cache", default="", help="route store URL")
    p.add_argument("--attackers", type=int, default=20, help="connections of the attacking uid")
    p.add_argument("--op", choices=("typing", "ping", "send"), default="typing", help="the frames")
    p.add_argument("--seconds", type=float, default=10.0, help="measured flood time")
    p.add_argument("--baseline", type=float, default=3.0, help="measured time before the flood")
    p.add_argument("--interval-ms", type=float, default=20.0, help="between bystander SENDs")
    p.add_argument("--gateway-arg", action="append", default=[], help="passed to imgw serve")
    args = p.parse_args()
    with tempfile.TemporaryFile() as log:  # the gateway's log: its warnings are counted
        print(json.dumps(asyncio.run(run(args, Path(args.tree).resolve(), log))))


if __name__ == "__main__":
    main()
