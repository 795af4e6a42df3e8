"""`imgw db add-server` of full shards under real traffic: memory, freeze, read-back.

    python -m bench.probes.shard_move [--messages 1000000] [--rate 1000]
        [--mysql mysql://root:@127.0.0.1:3306/] [--target 127.0.0.1:3307]
        [--redis redis://127.0.0.1:6379/0] [--budget 900] [--json out.json]

1. A fresh database of 4 shards on --mysql; shards 2 and 3 (the ones add-server gives
   the new server) filled with --messages messages of --size bytes straight into the
   tables (bench.probes.shard_fill: conversations of 100 messages, their seq, member and
   delivered rows, idempotency records).
2. A gateway (`imgw serve`, MySQL + Redis) starts; --clients clients send --rate
   messages/s in all over p2p conversations of every shard, each send retried with the
   same id until acked, each ack followed by the sender's READ and DELIVERED of it.
3. After a few seconds `imgw db add-server` moves shards 2-3 to a database of the same
   name on --target (its progress lines are shown as they come).
4. Traffic goes on 3 s on the new map, then stops; the positions are flushed.

Reports: the gateway's and the command's RSS (at start, peak; sampled from /proc every
0.2 s), the command's freeze of each server's shards (RENAME to map switch: the target
is 1 s) and the longest time one send to a moving shard waited for its ack (from its
first try), the sends acked while the shards were copied, and the read-back: every
acked message exactly once at its acked seq on the server of its shard, every filled
message on the new server, every last READ and DELIVERED position there. The run stops
after --budget seconds at most (the command killed; the databases are dropped anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.common import Gateway, GatewaySpec, drop_database, log, proc_rss
from bench.probes.shard_fill import fill
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.frames import (
    ConvOk,
    Delivered,
    Error,
    Frame,
    Login,
    LoginOk,
    OpenP2P,
    Read,
    Send,
    SendAck,
)
from protocol.ops import ErrorCode
from protocol.token import sign_token

SHARDS = 4
MOVING = (2, 3)
KID = "bench"
UID0 = 5_000_000


class Client:
    """One logged-in connection: requests matched to replies by rid."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(side=Side.CLIENT)
        self.waiting: dict[int, asyncio.Future[Frame]] = {}
        self.rid = 0
        self.task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def login(cls, port: int, uid: int, secret: str) -> Client:
        c = cls(*await asyncio.open_connection("127.0.0.1", port))
        tok = sign_token(KID, secret, uid, "d", int(time.time()) + 3600)
        ok = await c.request(Login(0, 1, uid, "d", tok))
        if not isinstance(ok, LoginOk):
            raise RuntimeError(f"login refused: {ok}")
        return c

    async def _read(self) -> None:
        while data := await self.reader.read(65536):
            for f in self.decoder.feed(data):
                fut = self.waiting.pop(getattr(f, "rid", 0) or -1, None)
                if fut is not None and not fut.done():
                    fut.set_result(f)  # type: ignore[arg-type]

    async def request(self, frame: Any, timeout: float = 30.0) -> Frame:
        self.rid += 1
        frame.rid = self.rid
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self.waiting[self.rid] = fut
        self.writer.write(encode(frame))
        return await asyncio.wait_for(fut, timeout)

    def send(self, frame: Any) -> None:
        self.writer.write(encode(frame))

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()


class Traffic:
    """Senders at a paced rate; what was acked, the positions, the waits."""

    def __init__(self, port: int, secret: str, clients: int, rate: float) -> None:
        self.port, self.secret, self.clients, self.rate = port, secret, clients, rate
        self.acked: dict[tuple[int, str], tuple[int, float]] = {}
        self.positions: dict[tuple[int, int], int] = {}
        self.waited: dict[int, float] = {}  # shard -> longest wait of one send
        self.refused = 0
        self.stop = asyncio.Event()

    async def sender(self, k: int) -> None:
        uid = UID0 + 100 * k
        c = await Client.login(self.port, uid, self.secret)
        convs = []
        for peer in range(uid + 1, uid + 9):  # 8 p2p conversations: every shard
            ok = await c.request(OpenP2P(0, peer))
            assert isinstance(ok, ConvOk), ok
            convs.append(ok.conv_id)
        every = self.clients / self.rate
        next_at = time.monotonic()
        i = 0
        while not self.stop.is_set():
            next_at += every
            conv, cmid = convs[i % len(convs)], f"{k}-{i}"
            first = time.monotonic()
            while True:
                reply = await c.request(Send(0, conv, cmid, 1, cmid.encode()))
                if isinstance(reply, SendAck):
                    break
                if not (isinstance(reply, Error) and reply.code == ErrorCode.UNAVAILABLE):
                    raise RuntimeError(f"send refused: {reply}")
                self.refused += 1
                await asyncio.sleep(0.02)
            now = time.monotonic()
            self.acked[(conv, cmid)] = (reply.seq, now)
            self.waited[conv % SHARDS] = max(self.waited.get(conv % SHARDS, 0.0), now - first)
            c.send(Read(conv, reply.seq))
            c.send(Delivered(conv, reply.seq))
            self.positions[(conv, uid)] = reply.seq
            i += 1
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.sleep(0.5)
        c.close()


async def _sample(pids: dict[str, int], peaks: dict[str, int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        for name, pid in pids.items():
            rss = proc_rss(pid)
            if rss is not None:
                peaks[name] = max(peaks.get(name, 0), rss)
        await asyncio.sleep(0.2)


async def _rows(url: str, query: str) -> list[tuple[Any, ...]]:
    import aiomysql

    p = urlsplit(url)
    conn = await aiomysql.connect(
        host=p.hostname, port=p.port or 3306, user=p.username or "root",
        password=p.password or "", db=p.path.lstrip("/"), autocommit=True,
    )  # fmt: skip
    try:
        async with conn.cursor() as cur:
            await cur.execute(query)
            return list(await cur.fetchall())
    finally:
        conn.close()


async def _read_back(t: Traffic, old: str, new: str, filled: int) -> dict[str, Any]:
    """Every acked message once at its seq where its shard is now; the filled ones;
    the last positions."""
    wrong: list[str] = []
    on_new = 0
    for url, shards in ((old, (0, 1)), (new, MOVING)):
        stored: dict[tuple[int, str], list[int]] = {}
        for shard in shards:
            for conv, cmid, seq in await _rows(
                url, f"SELECT conv_id, client_msg_id, seq FROM im_message_{shard:04d} "
                "WHERE client_msg_id NOT LIKE 'fill.%'"
            ):  # fmt: skip
                stored.setdefault((int(conv), bytes(cmid).decode()), []).append(int(seq))
            if url == new:
                (n,) = (await _rows(url, f"SELECT COUNT(*) FROM im_message_{shard:04d} "
                                    "WHERE client_msg_id LIKE 'fill.%'"))[0]  # fmt: skip
                on_new += int(n)
        mine = {k: [seq] for k, (seq, _) in t.acked.items() if k[0] % SHARDS in shards}
        for k in mine.keys() | stored.keys():
            if mine.get(k) != stored.get(k):
                wrong.append(f"{k}: acked {mine.get(k)}, stored {stored.get(k)}")
    positions_wrong = 0
    for (conv, uid), seq in t.positions.items():
        url = new if conv % SHARDS in MOVING else old
        read = await _rows(url, f"SELECT read_seq FROM im_conv_member WHERE conv_id={conv} "
                           f"AND uid={uid}")  # fmt: skip
        got = await _rows(url, f"SELECT seq FROM im_delivered WHERE conv_id={conv} AND "
                          f"uid={uid} AND device='d'")  # fmt: skip
        if [tuple(map(int, r)) for r in read] != [(seq,)] or [tuple(map(int, r)) for r in got] != [
            (seq,)
        ]:
            positions_wrong += 1
    return {
        "acked": len(t.acked),
        "acked_wrong": len(wrong),
        "wrong_examples": wrong[:5],
        "filled_on_new_server": on_new,
        "filled_missing": filled - on_new,
        "positions": len(t.positions),
        "positions_wrong": positions_wrong,
    }


async def run(args: argparse.Namespace, done: list[Any]) -> dict[str, Any]:
    """The run; `done` gets the gateway and the new server's URL, to clean up once the
    event loop is closed."""
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="imgw-shard-move-"))
    secret = os.urandom(8).hex()
    spec = GatewaySpec(store=args.mysql, cache=args.redis, shards=SHARDS)
    gw = Gateway(spec, workdir, KID, secret)
    gw.check_services()
    gw.migrate(120)
    db = urlsplit(gw.store).path.lstrip("/")
    parts = urlsplit(gw.store.split("?")[0])
    auth = parts.netloc.rpartition("@")[0]
    target = f"mysql://{auth + '@' if auth else ''}{args.target}/{db}"
    out: dict[str, Any] = {"messages": args.messages, "rate": args.rate, "size": args.size}
    try:
        t0 = time.monotonic()
        await fill(gw.store, MOVING, args.messages, size=args.size, log=log)
        out["fill_s"] = round(time.monotonic() - t0, 1)
        log(f"filled shards {list(MOVING)} with {args.messages:,} messages in {out['fill_s']} s")
        gw.start(60)
        assert gw.proc is not None
        traffic = Traffic(gw.port, secret, args.clients, args.rate)
        senders = [asyncio.create_task(traffic.sender(k)) for k in range(args.clients)]
        peaks: dict[str, int] = {}
        stop_sampling = asyncio.Event()
        await asyncio.sleep(3.0)
        out["gateway_rss_start_mib"] = round((proc_rss(gw.proc.pid) or 0) / 2**20, 1)
        env = {**os.environ, "IMGW_STORE": gw.store}
        tool = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "db", "add-server", target,
            "--grace", "3", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        await asyncio.sleep(0.3)
        out["tool_rss_start_mib"] = round((proc_rss(tool.pid) or 0) / 2**20, 1)
        sampler = asyncio.create_task(
            _sample({"gateway": gw.proc.pid, "tool": tool.pid}, peaks, stop_sampling)
        )
        tool_t0 = time.monotonic()
        lines: list[str] = []
        frozen_at = 0.0
        assert tool.stdout is not None
        left = args.budget - (time.monotonic() - started) - 60
        try:
            async with asyncio.timeout(left):
                while line := (await tool.stdout.readline()).decode():
                    lines.append(line.rstrip())
                    log(f"add-server: {line.rstrip()}")
                    if "frozen (tables renamed)" in line and not frozen_at:
                        frozen_at = time.monotonic()
                rc = await tool.wait()
        except TimeoutError:
            tool.kill()
            raise RuntimeError(
                f"imgw db add-server still running after the budget ({left:.0f} s)"
            ) from None
        out["tool_s"] = round(time.monotonic() - tool_t0, 1)
        if rc != 0:
            raise RuntimeError("imgw db add-server failed:\n" + "\n".join(lines[-20:]))
        await asyncio.sleep(3.0)
        traffic.stop.set()
        await asyncio.gather(*senders)
        stop_sampling.set()
        await sampler
        await asyncio.sleep(4.0)  # the last positions flushed
        text = "\n".join(lines)
        out["freeze_s"] = [
            float(x) for x in re.findall(r"frozen ([\d.]+) s \(rename to map switch", text)
        ]
        out["longest_send_wait_s_by_shard"] = {
            str(k): round(v, 3) for k, v in sorted(traffic.waited.items())
        }
        out["sends_refused"] = traffic.refused
        out["acked_to_moving_shards_while_copying"] = sum(
            1 for (c, _), (_, at) in traffic.acked.items()
            if c % SHARDS in MOVING and tool_t0 < at < frozen_at
        )  # fmt: skip
        out["gateway_rss_peak_mib"] = round(peaks.get("gateway", 0) / 2**20, 1)
        out["tool_rss_peak_mib"] = round(peaks.get("tool", 0) / 2**20, 1)
        out["tool_lines"] = lines
        out["read_back"] = await _read_back(traffic, gw.store.split("?")[0], target, args.messages)
    finally:
        gw.stop(30)
        done.extend([gw, target])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.probes.shard_move", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--messages", type=int, default=1_000_000, help="in the moving shards")
    p.add_argument("--size", type=int, default=100, help="bytes a filled message (100)")
    p.add_argument("--rate", type=float, default=1000.0, help="messages/s of traffic (1000)")
    p.add_argument("--clients", type=int, default=20, help="sending connections (20)")
    p.add_argument("--mysql", default="mysql://root:@127.0.0.1:3306/", help="the first server")
    p.add_argument("--target", default="127.0.0.1:3307", help="the new server, host:port")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    p.add_argument("--budget", type=float, default=900.0, help="seconds at most (900)")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    done: list[Any] = []
    try:
        out = asyncio.run(run(args, done))
    finally:
        if done:
            gw, target = done
            gw.cleanup()
            with contextlib.suppress(Exception):
                drop_database(target)
    shown = {k: v for k, v in out.items() if k != "tool_lines"}
    print(json.dumps(shown, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    ok = out["read_back"]["acked_wrong"] == 0 and out["read_back"]["positions_wrong"] == 0
    return 0 if ok and out["read_back"]["filled_missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
