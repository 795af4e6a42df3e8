"""Gateway memory per idle, logged-in connection.

Starts its own gateway (embedded store, a temporary data dir, --idle 600 --hb 300 so
nothing times out while connections are held), records the gateway's RSS after a short
settle as the baseline, then opens --connections logged-in connections from --procs
generator processes (each from its own loopback source address 127.0.0.<2+i>), holds
them for --settle seconds, samples the gateway's RSS and reports

    rss_per_conn_bytes = (rss - baseline) / connections

together with the generators' own RSS per connection and the kernel's TCP buffer
memory per connection (from /proc/net/sockstat; both ends of every connection live on
this host). Everything is then closed, the gateway gets SIGTERM, and the figures go to
stdout and, with --json, to a file.

    python -m bench.probes.idle_rss --connections 10000 --procs 4 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import log, run_generator, set_log_name
from bench.loadclient import login_frame, raw_frames
from bench.serve import ServeError, ServeProcess, free_port
from gateway.net.openfiles import raise_nofile
from protocol.ops import Op

KID = "bench"
SECRET = "bench-idle-rss-secret"
UID_BASE = 1_000_000
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux


# --- Helpers shared by the driver and the generators ---------------------------------


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """The memory fields of /proc/<pid>/status, in bytes."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[key] = int(parts[0]) * 1024
    return out


def rss(pid: int | str = "self") -> int:
    return proc_status(pid)["VmRSS"]


def sockstat() -> dict[str, int]:
    """TCP fields of /proc/net/sockstat (mem is in pages)."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                parts = line.split()[1:]
                return {parts[i]: int(parts[i + 1]) for i in range(0, len(parts) - 1, 2)}
    return {}


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (Slab covers socket structs, files, epoll entries)."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[-1] == "kB" else 1)
    return out


# --- Generator process ---------------------------------------------------------------


class Client(asyncio.Protocol):
    """One held connection: writes LOGIN, waits for LOGIN_OK, then stays silent."""

    __slots__ = ("buf", "done", "frame", "transport")

    def __init__(self, frame: bytes, done: asyncio.Future[None]) -> None:
        self.frame = frame
        self.done = done
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(self.frame)  # type: ignore[union-attr]
        self.frame = b""

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return  # nothing else is expected while idle; ignore it
        frames, self.buf = raw_frames(self.buf + data)
        if not frames:
            return
        frame = frames[0]
        if frame[0] == Op.LOGIN_OK:
            self.done.set_result(None)
        else:
            self.done.set_exception(RuntimeError(f"login refused: {frame!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"closed before LOGIN_OK: {exc}"))


async def _generate(
    idx: int,
    count: int,
    uid0: int,
    host: str,
    port: int,
    src_ip: str,
    concurrency: int,
    deadline: float,
    q: Any,
    stop: Any,
) -> None:
    loop = asyncio.get_running_loop()
    exp = int(time.time()) + 24 * 3600
    sem = asyncio.Semaphore(concurrency)
    clients: list[Client] = []
    counts = {"connected": 0, "logged_in": 0, "retries": 0}

    async def one(i: int) -> None:
        async with sem:
            done: asyncio.Future[None] = loop.create_future()
            frame = login_frame(KID, SECRET, uid0 + i, "b", exp)
            for attempt in range(5):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    # Pick the source port at connect() time, with the whole 4-tuple known,
                    # so ports in TIME_WAIT from an earlier run are not a problem.
                    sock.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                    sock.bind((src_ip, 0))
                    sock.setblocking(False)
                    await loop.sock_connect(sock, (host, port))
                    _, client = await loop.create_connection(lambda: Client(frame, done), sock=sock)
                    break
                except OSError:
                    sock.close()
                    if attempt == 4:
                        raise
                    counts["retries"] += 1
                    await asyncio.sleep(0.2 * (attempt + 1))
            counts["connected"] += 1
            await asyncio.wait_for(done, max(1.0, deadline - time.monotonic()))
            counts["logged_in"] += 1
            clients.append(client)

    async def progress() -> None:
        while True:
            q.put(("progress", idx, counts["connected"], counts["logged_in"]))
            await asyncio.sleep(1.0)

    rss_before = rss()
    reporter = loop.create_task(progress())
    # The driver sets `stop` when it is done measuring, or early when it gives up.
    stopped = loop.run_in_executor(None, stop.wait, max(1.0, deadline - time.monotonic()))
    connecting = asyncio.ensure_future(asyncio.gather(*(one(i) for i in range(count))))
    try:
        await asyncio.wait({connecting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        reporter.cancel()
    if connecting.done():
        connecting.result()  # raises if a connection failed
        q.put(("progress", idx, counts["connected"], counts["logged_in"]))
        q.put(("ready", idx, rss_before, rss(), counts["retries"]))
        await stopped  # hold until told to close
    else:
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await connecting
    for c in clients:
        if c.transport is not None:
            c.transport.close()
    await asyncio.sleep(0.5)  # let the closes go out
    q.put(("closed", idx))


def generator_main(
    idx: int,
    count: int,
    uid0: int,
    host: str,
    port: int,
    src_ip: str,
    concurrency: int,
    deadline: float,
    q: Any,
    stop: Any,
) -> None:
    run_generator(
        idx, _generate(idx, count, uid0, host, port, src_ip, concurrency, deadline, q, stop), q
    )


# --- Driver ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.probes.idle_rss",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--connections", type=int, default=10_000, help="connections to hold")
    p.add_argument("--procs", type=int, default=4, help="generator processes")
    p.add_argument("--json", metavar="PATH", help="also write the results here")
    p.add_argument("--settle", type=float, default=5.0, help="seconds to hold before sampling")
    p.add_argument(
        "--baseline-settle", type=float, default=3.0, help="seconds after start before baseline"
    )
    p.add_argument("--samples", type=int, default=3, help="RSS samples, 1 s apart (median)")
    p.add_argument("--timeout", type=float, default=300.0, help="overall time bound, seconds")
    p.add_argument("--concurrency", type=int, default=256, help="connects in flight per proc")
    p.add_argument("--host", default="127.0.0.1", help="gateway listen address")
    p.add_argument("--port", type=int, default=0, help="gateway port (0 = a free one)")
    p.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `imgw serve` (repeat; use --gateway-arg=--flag for flags)",
    )
    args = p.parse_args(argv)
    if args.connections < 1 or args.procs < 1 or args.procs > 250:
        p.error("need --connections >= 1 and 1 <= --procs <= 250")
    return args


def run(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """Measure; fills `result` as it goes (so a failure still leaves partial figures)."""
    t_start = time.monotonic()
    deadline = t_start + args.timeout
    nofile = raise_nofile()  # inherited by the gateway
    if nofile < args.connections + 100:
        log(f"warning: open-file limit {nofile} is below {args.connections} connections")
    port = args.port or free_port(args.host)
    result.update(connections=args.connections, procs=args.procs)
    durations: dict[str, float] = {}
    result["durations"] = durations

    with tempfile.TemporaryDirectory(prefix="imgw-idle-rss-") as tmp:
        gw = ServeProcess(
            [
                "--host", args.host, "--port", str(port), "--data-dir", tmp,
                "--token-key", f"{KID}:{SECRET}", "--idle", "600", "--hb", "300",
                "--login-timeout", "60", "--log-level", "warning", *args.gateway_arg,
            ],
            host=args.host, port=port, log_path=Path(tmp) / "gateway.log",
        )  # fmt: skip
        ctx = mp.get_context("spawn")
        procs: list[Any] = []
        stop = ctx.Event()
        try:
            gw.start(min(30.0, deadline - time.monotonic()))
            durations["gateway_start_s"] = time.monotonic() - t_start
            time.sleep(max(0.0, min(args.baseline_settle, deadline - time.monotonic())))
            baseline = rss(gw.pid)
            result["baseline_rss_bytes"] = baseline
            log(
                f"gateway pid {gw.pid} on {args.host}:{port}, "
                f"baseline RSS {baseline / 2**20:.1f} MiB"
            )
            sock_before = sockstat()
            slab_before = meminfo().get("Slab", 0)

            q = ctx.Queue()
            per = [args.connections // args.procs] * args.procs
            for i in range(args.connections % args.procs):
                per[i] += 1
            uid0 = UID_BASE
            t_conn = time.monotonic()
            for i, n in enumerate(per):
                src = f"127.0.0.{2 + i}"
                pr = ctx.Process(
                    target=generator_main,
                    args=(i, n, uid0, args.host, port, src, args.concurrency, deadline, q, stop),
                    daemon=True,
                )
                pr.start()
                procs.append(pr)
                uid0 += n

            progress = {i: (0, 0) for i in range(args.procs)}
            ready: dict[int, tuple[int, int, int]] = {}
            last_log = 0.0
            while len(ready) < args.procs:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("timed out while connecting")
                try:
                    msg = q.get(timeout=min(1.0, remaining))
                except queue.Empty:
                    msg = None
                if msg is not None:
                    kind, idx = msg[0], msg[1]
                    if kind == "progress":
                        progress[idx] = (msg[2], msg[3])
                    elif kind == "ready":
                        ready[idx] = (msg[2], msg[3], msg[4])
                    elif kind == "error":
                        raise RuntimeError(f"generator {idx}: {msg[2]}")
                if not gw.running():
                    raise RuntimeError(f"gateway exited:\n{gw.log_tail()}")
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"generator exited with status {dead[0].exitcode}")
                if time.monotonic() - last_log >= 2.0:
                    last_log = time.monotonic()
                    conn = sum(c for c, _ in progress.values())
                    logged = sum(v for _, v in progress.values())
                    log(
                        f"connected {conn}/{args.connections} logged in {logged} "
                        f"gateway RSS {rss(gw.pid) / 2**20:.1f} MiB"
                    )
            durations["connect_s"] = time.monotonic() - t_conn
            log(f"all {args.connections} logged in after {durations['connect_s']:.1f}s")

            time.sleep(max(0.0, min(args.settle, deadline - time.monotonic())))
            samples = []
            for i in range(max(1, args.samples)):
                if i:
                    time.sleep(1.0)
                samples.append(rss(gw.pid))
            sock_after = sockstat()
            slab_after = meminfo().get("Slab", 0)
            status = proc_status(gw.pid)
            rss_now = int(statistics.median(samples))
            n = args.connections
            gen_delta = sum(after - before for before, after, _ in ready.values())
            mem_pages = sock_after.get("mem", 0) - sock_before.get("mem", 0)
            result.update(
                rss_bytes=rss_now,
                rss_samples_bytes=samples,
                rss_per_conn_bytes=(rss_now - baseline) / n,
                gateway_rss_anon_bytes=status.get("RssAnon"),
                gateway_hwm_bytes=status.get("VmHWM"),
                generator_rss_per_conn_bytes=gen_delta / n,
                generator_rss_bytes=[after for _, after, _ in ready.values()],
                connect_retries=sum(r for _, _, r in ready.values()),
                kernel_bytes_per_conn=mem_pages * PAGE_SIZE / n,
                kernel_tcp_mem_pages_before=sock_before.get("mem"),
                kernel_tcp_mem_pages_after=sock_after.get("mem"),
                kernel_slab_bytes_per_conn=(slab_after - slab_before) / n,
                kernel_tcp_inuse_delta=sock_after.get("inuse", 0) - sock_before.get("inuse", 0),
                page_size=PAGE_SIZE,
            )
            log(
                f"gateway RSS {rss_now / 2**20:.1f} MiB, "
                f"{result['rss_per_conn_bytes']:.0f} B/conn; generators "
                f"{result['generator_rss_per_conn_bytes']:.0f} B/conn; kernel TCP "
                f"{result['kernel_bytes_per_conn']:.0f} B/conn, slab "
                f"{result['kernel_slab_bytes_per_conn']:.0f} B/conn (both ends)"
            )
        finally:
            t_close = time.monotonic()
            stop.set()
            close_by = time.monotonic() + 15
            for pr in procs:
                pr.join(timeout=max(0.1, close_by - time.monotonic()))
                if pr.is_alive():
                    pr.kill()
                    pr.join()
            durations["close_s"] = time.monotonic() - t_close
            t_stop = time.monotonic()
            rc = gw.stop(30) if gw.proc is not None else None
            durations["gateway_stop_s"] = time.monotonic() - t_stop
            result["gateway_exit_status"] = rc
            if rc != 0:
                log(f"gateway exit status {rc}; log tail:\n{gw.log_tail()}")
    durations["total_s"] = time.monotonic() - t_start
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_log_name("idle_rss")
    result: dict[str, Any] = {}
    status = 0
    try:
        run(args, result)
    except (RuntimeError, TimeoutError, ServeError) as e:
        log(f"failed: {e}")
        result["error"] = str(e)
        status = 1
    if result.get("gateway_exit_status") != 0:
        status = 1
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
