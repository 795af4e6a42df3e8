"""The driver side of the holder processes (bench.holders): start them, aggregate their
reports into one view, and print the live progress line."""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import queue
import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Final

from bench.common import BenchError, Gateway, Sampler
from bench.fdholders import fd_holder_main, serves
from bench.holders import HolderSpec, holder_main

MAX_PER_PROC: Final = 18_000  # a process may hold 20,000 open files here


@dataclass
class FleetView:
    """The sum of the latest report of every process."""

    started: int = 0
    held: int = 0
    logins: int = 0
    drops: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    kicks: dict[str, int] = field(default_factory=dict)
    rss: int = 0
    rss_baseline: int = 0  # the processes' RSS before they held anything
    gave_up: int = 0  # connections that failed every try (without --reconnect)
    pongs: int = 0  # PINGs the gateway answered
    syncs: int = 0  # SYNCs the gateway answered
    unavailable_max: int = 0  # the most ERROR unavailable one client was told
    unavailable_over_2: int = 0  # clients told unavailable more than twice

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


class Fleet:
    def __init__(
        self,
        *,
        connections: int,
        per_proc: int,
        ramp: float,
        hb_s: int,
        sync: bool = False,
        reconnect: bool = False,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = 30.0,
        sock_buf: int = 4096,
        tls: bool = False,
        keep_since: bool = True,
        pipeline_sync: bool = True,
        ws_path: str | None = None,
        net: int | None = None,
        sources: list[str] | None = None,
        timeout_s: float,
    ) -> None:
        if per_proc > MAX_PER_PROC:
            raise BenchError(f"--per-proc must be <= {MAX_PER_PROC} (20,000 files a process)")
        self.connections = connections
        self.tls = tls
        self.keep_since = keep_since
        self.pipeline_sync = pipeline_sync
        self.ws_path = ws_path  # WebSocket on this path, else the plain protocol
        self.procs_n = max(1, math.ceil(connections / per_proc))
        self.ramp = ramp
        self.hb_s = hb_s
        self.sync = sync
        self.reconnect = reconnect
        self.backoff = (backoff_base_s, backoff_cap_s)
        self.sock_buf = sock_buf
        self.timeout_s = timeout_s
        self.ctx = mp.get_context("spawn")
        self.out: Any = self.ctx.Queue()
        self.procs: list[Any] = []
        self.ctrls: list[Any] = []
        self.latest: dict[int, tuple[Any, ...]] = {}
        self.rss_baseline = 0
        # Source addresses: one per process, in a /16 picked per run (no TIME_WAIT clash
        # with an earlier run), e.g. 127.113.0.1, 127.113.0.2, ...
        # (an agent is given its own by the controller)
        self.net = net if net is not None else 100 + secrets.randbelow(150)
        # Or the machine's own addresses, one per process: an agent loading a gateway on
        # another machine binds addresses that route there.
        self.sources = sources or []
        if self.sources and len(self.sources) < self.procs_n:
            raise BenchError(
                f"{connections:,} connections take {self.procs_n} generator processes, each "
                f"with its own source address: give at least {self.procs_n} (--source), "
                f"not {len(self.sources)}"
            )

    def src_ip(self, i: int) -> str:
        if self.sources:
            return self.sources[i]
        return f"127.{self.net}.{i // 250}.{1 + i % 250}"

    def sources_text(self, host: str) -> str:
        return f"source addresses {self.src_ip(0)}.."

    def start(self, host: str, port: int, kid: str, secret: str, uid0: int) -> None:
        shares = [self.connections // self.procs_n] * self.procs_n
        for i in range(self.connections % self.procs_n):
            shares[i] += 1
        deadline_ns = time.monotonic_ns() + int(self.timeout_s * 1e9)
        for i, n in enumerate(shares):
            spec = HolderSpec(
                idx=i, host=host, port=port, kid=kid, secret=secret, uid0=uid0, count=n,
                src_ip=self.src_ip(i), ramp_per_s=self.ramp * n / self.connections,
                hb_s=self.hb_s, sync=self.sync, reconnect=self.reconnect,
                backoff_base_s=self.backoff[0], backoff_cap_s=self.backoff[1],
                max_pending=max(50, min(2000, int(self.ramp / self.procs_n))),
                sock_buf=self.sock_buf, deadline_ns=deadline_ns, tls=self.tls,
                keep_since=self.keep_since, pipeline_sync=self.pipeline_sync,
                ws_path=self.ws_path,
            )  # fmt: skip
            uid0 += n
            parent_end, child_end = self.ctx.Pipe()
            # plain TCP on bare file descriptors (bench.fdholders); TLS and WebSocket on
            # uvloop's transports (bench.holders)
            main = fd_holder_main if serves(spec) else holder_main
            p = self.ctx.Process(target=main, args=(spec, child_end, self.out), daemon=True)
            p.start()
            self.procs.append(p)
            self.ctrls.append(parent_end)

    def poll(self, wait_s: float) -> FleetView:
        """Take the reports that arrived within `wait_s`; the aggregate view."""
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            try:
                msg = self.out.get(timeout=max(0.0, left)) if left > 0 else self.out.get_nowait()
            except queue.Empty:
                break
            if msg[0] == "error":
                raise BenchError(f"generator process {msg[1]} failed: {msg[2]}")
            if msg[0] == "progress":
                self.latest[msg[1]] = msg
        dead = [p for p in self.procs if p.exitcode not in (None, 0)]
        if dead:
            raise BenchError(f"a generator process exited with status {dead[0].exitcode}")
        view = FleetView()
        for m in self.latest.values():
            view.started += m[2]
            view.held += m[3]
            view.logins += m[4]
            view.drops += m[5]
            for k, v in m[6].items():
                view.errors[k] = view.errors.get(k, 0) + v
            for k, v in m[7].items():
                view.kicks[k] = view.kicks.get(k, 0) + v
            view.rss += m[8]
            view.rss_baseline += m[9]
            view.gave_up += m[10]
            view.pongs += m[11]
            view.syncs += m[12]
            view.unavailable_max = max(view.unavailable_max, m[13])
            view.unavailable_over_2 += m[14]
        return view

    def pids(self) -> list[int]:
        """The generator processes still running."""
        return [p.pid for p in self.procs if p.pid is not None and p.is_alive()]

    def stop(self) -> None:
        for ctrl in self.ctrls:
            with contextlib.suppress(OSError):
                ctrl.send(("stop",))
        deadline = time.monotonic() + 60
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(5)


def progress_line(
    phase: str, elapsed: float, view: FleetView, target: int, rate: float, sampler: Sampler
) -> None:
    rss = sampler.latest_rss("gateway")
    rows = sampler.samples.get("gateway", [])
    cpu = "-"
    if len(rows) >= 2:
        (t0, c0, *_), (t1, c1, *_) = rows[-2], rows[-1]
        from bench.common import CLK_TCK

        cpu = f"{100.0 * (c1 - c0) / CLK_TCK / max(1e-3, t1 - t0):.0f}%"
    print(
        f"  [{phase:<7} {elapsed:6.1f}s] held {view.held:>9,}/{target:,}  logins/s {rate:8.0f}"
        f"  drops {view.drops:>6}  errors {view.error_count:>6}"
        f"  gateway rss {'-' if rss is None else f'{rss / 2**20:,.0f} MiB'} cpu {cpu}"
        f"  generators rss {view.rss / 2**20:,.0f} MiB",
        file=sys.stderr,
        flush=True,
    )


def gateway_alive(gw: Gateway | None) -> None:
    if gw is not None and not gw.alive():
        raise BenchError(f"the gateway under test exited:\n{gw.log_tail() if gw.proc else ''}")
