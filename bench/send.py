"""`imgw bench chat` and `imgw bench group`: durable SEND throughput and latency, open
loop (the generator processes are bench.senders).

Units of users, each user one logged-in connection: p2p pairs (chat; OPEN_P2P at setup)
or groups of --group-size (group; GROUP_CREATE); the members of a unit take turns
sending. Load comes from --procs generator processes (multiprocessing spawn, uvloop),
each with its own share of the units and of the rate, and ONE pacing timer per process
(every ~1 ms) that writes every send whose intended time has come: the schedule never
waits for replies, so a slow gateway shows up as latency, not as a lower offered rate.
With `--transport ws` every connection is a WebSocket (bench.loadclient.WsLoadConnection).

Latency is measured from the INTENDED send time (coordinated-omission safe) to the
SEND_ACK (durable: committed to the store) and to the PUSH at each other member. Both go
into HdrHistograms (1 us .. 60 s, 3 significant digits) that are reset when the warmup
ends and merged across processes at the end of each step.

Each step (--rate, or every rate of --rates) runs --warmup then --duration seconds at
its rate, then drains: the sends of the measured window that are still in flight get
up to 10 s for their ACK, after which they count as errors "timeout".

Result fields (top level = the last step; `steps` holds every step): rate_target,
duration_s, sent, acked, errors (and errors_by_code), acked_per_s (ACKs received inside
the measured window / its length), ack_p50/p90/p99/max_ms, push_p50/p99_ms,
gateway_cpu_percent (mean, 100 = one core), gateway_rss_bytes (max), CPU per message of
the gateway, MariaDB, Redis, the generators and the machine, gateway_kernel_percent (the
share of the gateway's CPU spent in the kernel: socket reads and writes), and more.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import os
import queue
import secrets
import sys
import time
from collections.abc import Iterator
from typing import Any, Final

from bench.common import BenchError, deadline_alarm, hist_of, log, ms
from bench.push_sink import PUSH_DEVICE, SinkProcess, step_line
from bench.remote import RemoteWorkers
from bench.run import Run
from bench.senders import StepSpec, WorkerSpec, worker_main

SCENARIOS: Final = ("chat", "group")
UID_SPAN: Final = 1_000_000_000  # a run's uids: a random block of this size
P99_GOAL_MS: Final = 50.0
PER_UID_SAFE_RATE: Final = 80.0  # below the gateway's default 100 msg/s per uid
DRAIN_S: Final = 10.0  # per step: how long sends of the window may take to be acked
CONNECT_CONCURRENCY: Final = 200  # logins and conversation setups in flight per process
FRAMES_PER_PROC_S: Final = 15_000


def check(args: argparse.Namespace, units_flag: str) -> str | None:
    """Check and complete the load settings of a chat/group run in `args`: `steps` (the
    rates), `procs` and `pairs` (units: p2p pairs or groups, named `units_flag` on the
    command line) when not given. The error to report, or None."""
    try:
        args.steps = [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]
    except ValueError:
        return "--rates must be numbers separated by commas, e.g. 2000,5000,10000"
    if any(r <= 0 for r in args.steps):
        return "rates must be positive"
    top, g = max(args.steps), args.group_size
    if not 2 <= g <= 1000:
        return "--group-size must be 2..1000"
    if args.procs is None:
        args.procs = default_procs(top, g)
    if args.pairs is None:
        # pairs: each uid sends <= 10 msg/s; groups: each member <= 10 msg/s
        args.pairs = (
            max(10, math.ceil(top / 20))
            if units_flag == "--pairs"
            else max(args.procs, int(top / (10 * g)) + 1)
        )
    if args.procs < 1 or args.pairs < args.procs:
        return f"need 1 <= --procs <= {units_flag}"
    if args.duration <= 0 or args.warmup < 0 or args.drain < 0:
        return "need --duration > 0, --warmup >= 0, --drain >= 0"
    if args.content_size < 8:
        return "--content-size must be >= 8 (the send time travels in the content)"
    per_uid = top / (g * args.pairs)
    if per_uid > PER_UID_SAFE_RATE:
        log(
            f"warning: {per_uid:.0f} msg/s per uid; the gateway's default limit is 100/s "
            f"(burst 200): use more {units_flag} or --gateway-arg=--rate-per-s=..."
        )
    return None


def run_send(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    """The chat/group scenario on a started `run`; its result. What completed steps
    measured stays in `run.partial` if a later one fails."""
    senders = Senders(args, run)
    run.partial = senders.result()
    try:
        # The driver checks its deadline everywhere; the alarm is the backstop.
        with deadline_alarm(args.timeout + 30, f"--timeout {args.timeout:.0f} s reached"):
            senders.start()
            for i, rate in enumerate(args.steps):
                senders.steps.append(senders.run_step(i, rate))
                print_step(senders.steps[-1])
                run.partial = senders.result()
    finally:
        with deadline_alarm(90, "the generators did not stop"):
            senders.stop()
    result = senders.result()
    if len(senders.steps) > 1:
        best = result["max_rate_p99_le_50ms"]
        print(
            f"highest rate with p99 <= {P99_GOAL_MS:g} ms, no errors, >= 95% acked/s: "
            f"{'none' if best is None else f'{best:g} msg/s'}"
        )
    return result


# === The gateway's own view ============================================================


GATEWAY_SERIES: Final = (
    "imgw_send_batch_size_sum",
    "imgw_send_batch_size_count",
    "imgw_send_commit_seconds_sum",
    "imgw_send_commit_seconds_count",
    "imgw_send_ack_seconds_sum",
    "imgw_send_ack_seconds_count",
)


def scrape(url: str | None) -> dict[str, float] | None:
    """The gateway's own send-path counters from its Prometheus /metrics, or None."""
    if not url:
        return None
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in GATEWAY_SERIES:
            out[name] = float(value)
    return out


def gateway_view(before: dict[str, float] | None, after: dict[str, float] | None) -> Any:
    """Means over a window from two scrapes: what the gateway itself saw."""
    if not before or not after:
        return None

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    batches = delta("imgw_send_batch_size_count")
    acks = delta("imgw_send_ack_seconds_count")
    return {
        "batches": int(batches),
        "batch_mean": round(delta("imgw_send_batch_size_sum") / batches, 1) if batches else None,
        "commit_mean_ms": round(1000 * delta("imgw_send_commit_seconds_sum") / batches, 2)
        if batches
        else None,
        "server_ack_mean_ms": round(1000 * delta("imgw_send_ack_seconds_sum") / acks, 2)
        if acks
        else None,
    }


# === Steps, progress, results ==========================================================


class LocalWorkers:
    """The generator processes of a run, here: spawned, told each step through a pipe,
    heard from through one queue."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.out: Any = self.ctx.Queue()
        self.procs: list[Any] = []
        self.ctrls: list[Any] = []

    @property
    def count(self) -> int:
        return len(self.procs)

    def start(self, specs: list[WorkerSpec]) -> None:
        for spec in specs:
            parent_end, child_end = self.ctx.Pipe()
            p = self.ctx.Process(target=worker_main, args=(spec, child_end, self.out), daemon=True)
            p.start()
            self.procs.append(p)
            self.ctrls.append(parent_end)

    def get(self, wait_s: float) -> tuple[Any, ...]:
        """The next message of any process (queue.Empty after `wait_s`)."""
        msg: tuple[Any, ...] = self.out.get(timeout=wait_s)
        return msg

    def step(self, i: int, step: StepSpec) -> None:
        self.ctrls[i].send(("step", step))

    def check_alive(self) -> None:
        dead = [p for p in self.procs if p.exitcode not in (None, 0)]
        if dead:
            raise BenchError(f"generator process exited with status {dead[0].exitcode}")

    def stop(self, clean: bool) -> None:
        for ctrl in self.ctrls:
            with contextlib.suppress(OSError):
                ctrl.send(("stop",))
        for p in self.procs:
            p.join(timeout=5 if clean else 1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


class Senders:
    """The driver side of one chat/group run: its generator processes, its steps, and
    what they measured."""

    def __init__(self, args: argparse.Namespace, run: Run) -> None:
        self.args = args
        self.run = run
        self.workers: LocalWorkers | RemoteWorkers = (
            RemoteWorkers(args.coordinator, args.agents, args.agents_wait)
            if getattr(args, "agents", 0)
            else LocalWorkers()
        )
        self.shares: list[int] = []
        self.steps: list[dict[str, Any]] = []  # one summary per step run
        self.deadline = time.monotonic() + args.timeout
        self.sampler = run.sampler
        self.gateway = run.gateway
        self.progress: dict[int, tuple[Any, ...]] = {}
        self.metrics_url = run.metrics_url
        self.scrape_at_ns = 1 << 62  # when to take the gateway's counters at window start
        # The measured window's edges: the sampler reads /proc right as each passes, so
        # CPU per operation covers the window even when it lasts a second or two.
        self.edges_ns: list[int] = []
        self.scraped: dict[str, float] | None = None
        # --push-sink: every uid leaves a registered device offline (in both runs); the
        # run with push events on has the sink they go to.
        self.push_device = PUSH_DEVICE if getattr(args, "push_sink", False) else None
        self.sink: SinkProcess | None = getattr(args, "sink", None)
        self.sink_seen = (0, time.monotonic())  # events at the last progress line

    def remaining(self) -> float:
        left: float = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"--timeout {self.args.timeout:.0f} s reached")
        return left

    def check_alive(self) -> None:
        gw = self.gateway
        if gw is not None and gw.proc is not None and gw.proc.poll() is not None:
            raise BenchError(f"gateway exited with status {gw.proc.returncode}:\n{gw.log_tail()}")
        self.workers.check_alive()

    def messages(self) -> Iterator[tuple[Any, ...]]:
        """Messages from the generators, sampling resources meanwhile; bounded."""
        while True:
            self.sampler.sample()
            if self.edges_ns and time.monotonic_ns() >= self.edges_ns[0]:
                self.edges_ns.pop(0)
                self.sampler.sample(force=True)
            if self.scraped is None and time.monotonic_ns() >= self.scrape_at_ns:
                self.scraped = scrape(self.metrics_url) or {}  # the window opened
            wait = min(0.2, self.remaining())
            if self.edges_ns:  # wake up at the next edge, not up to 0.2 s after it
                wait = min(wait, max(0.001, (self.edges_ns[0] - time.monotonic_ns()) / 1e9))
            try:
                msg = self.workers.get(wait)
            except queue.Empty:
                self.check_alive()
                continue
            if msg[0] == "error":
                raise BenchError(f"generator {msg[1]}: {msg[2]}")
            yield msg

    def start(self) -> None:
        """Start the generator processes; return once all are logged in and their
        conversations are open."""
        args, run = self.args, self.run
        host, port, kid, secret = run.host, run.port, run.kid, run.secret
        shares = [args.pairs // args.procs] * args.procs
        for i in range(args.pairs % args.procs):
            shares[i] += 1
        run_id = secrets.token_hex(4)
        uid0 = args.uid_base if args.uid_base else (secrets.randbelow(1000) + 1) * UID_SPAN
        deadline_ns = time.monotonic_ns() + int(args.timeout * 1e9)
        self.shares = shares
        specs: list[WorkerSpec] = []
        for i, n in enumerate(shares):
            spec = WorkerSpec(
                idx=i, host=host, port=port, kid=kid, secret=secret, uid0=uid0, pairs=n,
                group_size=args.group_size,
                run_id=run_id, content_size=args.content_size,
                connect_concurrency=args.connect_concurrency, deadline_ns=deadline_ns,
                ws_path=run.ws_path, push_device=self.push_device,
            )  # fmt: skip
            uid0 += args.group_size * n
            specs.append(spec)
        self.workers.start(specs)
        t0 = time.monotonic()
        ready: set[int] = set()
        for msg in self.messages():
            if msg[0] == "ready":
                ready.add(msg[1])
                if len(ready) == self.workers.count:
                    break
        if self.push_device is not None:
            log(
                f"{args.group_size * args.pairs} push devices {self.push_device!r} "
                "registered and offline"
            )
        log(
            f"{args.group_size * args.pairs} connections logged in, {args.pairs} "
            f"{'p2p' if args.group_size == 2 else f'{args.group_size}-member group'} "
            "conversations open "
            f"({time.monotonic() - t0:.1f} s, {args.procs} generator processes)"
        )

    def run_step(self, index: int, rate: float) -> dict[str, Any]:
        args = self.args
        start_ns = time.monotonic_ns() + int(0.3e9)
        win_start_ns = start_ns + int(args.warmup * 1e9)
        win_end_ns = win_start_ns + int(args.duration * 1e9)
        if self.sink is not None:  # a new tally; latency of what commits in the window
            wall_ns = time.time_ns() - time.monotonic_ns()
            self.sink.window((win_start_ns + wall_ns) / 1e6, (win_end_ns + wall_ns) / 1e6)
            self.sink_seen = (0, time.monotonic())
        for i, share in enumerate(self.shares):
            step = StepSpec(index, rate * share / args.pairs, start_ns, win_start_ns,
                            win_end_ns, args.drain)  # fmt: skip
            self.workers.step(i, step)
        log(
            f"step {index + 1}: {rate:g} msg/s for {args.warmup:g} s warmup + "
            f"{args.duration:g} s measured "
            f"({rate / (args.group_size * args.pairs):.1f} msg/s per uid)"
        )
        self.progress = {}
        results: dict[int, dict[str, Any]] = {}
        fresh: set[int] = set()  # generators heard from since the last line
        self.scrape_at_ns, self.scraped = win_start_ns, None
        self.edges_ns = [win_start_ns, win_end_ns - int(0.25e9)]  # inside the window
        for msg in self.messages():
            if msg[0] == "progress" and msg[2] == index:
                self.progress[msg[1]] = msg
                fresh.add(msg[1])
                if len(fresh) == self.workers.count:
                    self.print_progress(rate, start_ns)
                    fresh.clear()
            elif msg[0] == "result" and msg[2] == index:
                results[msg[1]] = msg[3]
                if len(results) == self.workers.count:
                    break
        self.sampler.sample(force=True)
        summary = self.summarize(index, rate, win_start_ns, win_end_ns, results)
        summary["gateway_send_path"] = gateway_view(self.scraped, scrape(self.metrics_url))
        if self.sink is not None:
            acked = sum(r["total_acked"] for r in results.values())
            summary["push_sink"] = self.sink_figures(acked)
        return summary

    def sink_figures(self, acked: int) -> dict[str, Any]:
        """What the sink got of a step's events, once it has one per message acked in
        the step (warmup included), or has waited long enough."""
        assert self.sink is not None
        got = self.sink.wait_for(acked, timeout=min(30.0, self.remaining()))
        return {
            **got,
            "messages_acked": acked,
            "missing": max(0, acked - got["distinct"]),
            "repeated": got["events"] - got["distinct"],
            "recipients_per_event": round(got["recipients"] / got["events"], 3)
            if got["events"]
            else None,
        }

    def print_progress(self, rate: float, start_ns: int) -> None:
        """One line from each generator's latest report (its rates over its last second)."""
        rows = list(self.progress.values())
        hist = hist_of([r[8] for r in rows])
        phases = {r[3] for r in rows}
        phase = "drain" if "drain" in phases else "measure" if "measure" in phases else "warmup"
        elapsed = (time.monotonic_ns() - start_ns) / 1e9
        print(
            f"  [{rate:>7g}/s {phase:<7} {elapsed:5.1f}s] sent/s {sum(r[4] for r in rows):8.0f}"
            f"  acked/s {sum(r[5] for r in rows):8.0f}  errors {sum(r[6] for r in rows):5d}"
            f"  in-flight {sum(r[7] for r in rows):6d}  ack p50 {ms(hist, 50):8.2f} ms"
            f"  p99 {ms(hist, 99):8.2f} ms{self.sink_progress()}",
            file=sys.stderr,
            flush=True,
        )

    def sink_progress(self) -> str:
        """The sink's events/s since the last progress line, and its latency so far."""
        if self.sink is None:
            return ""
        try:
            got = self.sink.stats()
        except OSError:
            return "  push sink: not answering"
        mono = time.monotonic()
        events, then = self.sink_seen
        self.sink_seen = (got["events"], mono)
        rate = (got["events"] - events) / max(1e-3, mono - then)
        return f"  events/s {rate:7.0f}  event p99 {got['latency_p99_ms']:8.1f} ms"

    def summarize(
        self, index: int, rate: float, win_start_ns: int, win_end_ns: int,
        results: dict[int, dict[str, Any]],
    ) -> dict[str, Any]:  # fmt: skip
        rows = [results[i] for i in sorted(results)]
        ack = hist_of([r["ack_hist"] for r in rows])
        push = hist_of([r["push_hist"] for r in rows])
        lag = hist_of([r["lag_hist"] for r in rows])
        errors: dict[str, int] = {}
        kicks: dict[str, int] = {}
        for r in rows:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
            for k, v in r["kicks"].items():
                kicks[k] = kicks.get(k, 0) + v
        window_s = (win_end_ns - win_start_ns) / 1e9
        # Monotonic ns and time.monotonic() share CLOCK_MONOTONIC.
        t0, t1 = win_start_ns / 1e9, win_end_ns / 1e9
        gw_cpu, gw_rss = self.sampler.between("gateway", t0, t1)
        db_cpu, _ = self.sampler.between("mariadb", t0, t1)
        redis_cpu, _ = self.sampler.between("redis", t0, t1)
        host_cpu, _ = self.sampler.between("host", t0, t1)
        acks_in_time = sum(r["acks_in_window_time"] for r in rows)
        acked_per_s = acks_in_time / window_s
        pushes = sum(r["pushes"] for r in rows)
        loadgen_cpu = round(sum(r["cpu_percent"] for r in rows), 1)

        def per_msg(name: str) -> float | None:
            return self.sampler.cpu_us_per_op(name, t0, t1, acked_per_s)

        step: dict[str, Any] = {
            "step": index + 1,
            "rate_target": rate,
            "duration_s": window_s,
            "sent": sum(r["sent"] for r in rows),
            "acked": sum(r["acked"] for r in rows),
            "errors": errors,
            "acked_per_s": round(acked_per_s, 1),
            "ack_p50_ms": ms(ack, 50),
            "ack_p90_ms": ms(ack, 90),
            "ack_p99_ms": ms(ack, 99),
            "ack_p999_ms": ms(ack, 99.9),
            "ack_max_ms": ms(ack),
            "pushes": pushes,
            "push_p50_ms": ms(push, 50),
            "push_p99_ms": ms(push, 99),
            "push_max_ms": ms(push),
            "gateway_cpu_percent": gw_cpu,
            "gateway_rss_bytes": gw_rss,
            "mariadb_cpu_percent": db_cpu,
            "redis_cpu_percent": redis_cpu,
            "host_cpu_busy_percent": host_cpu,
            "host_cores": os.cpu_count(),
            "loadgen_cpu_percent": loadgen_cpu,
            # CPU per operation: steady where throughput on a shared machine swings.
            "gateway_cpu_us_per_msg": per_msg("gateway"),
            "gateway_kernel_percent": self.sampler.kernel_percent("gateway", t0, t1),
            "gateway_cpu_us_per_push": self.sampler.cpu_us_per_op(
                "gateway", t0, t1, pushes / window_s
            )
            if self.args.group_size > 2
            else None,
            "mariadb_cpu_us_per_msg": per_msg("mariadb"),
            "redis_cpu_us_per_msg": per_msg("redis"),
            "loadgen_cpu_us_per_msg": round(1e4 * loadgen_cpu / acked_per_s, 1)
            if acked_per_s
            else None,
            "host_cpu_us_per_msg": per_msg("host"),
            "loadgen_lag_p99_ms": ms(lag, 99),
            "loadgen_lag_max_ms": ms(lag),
            "kicks": kicks,
            "closed_connections": sum(r["closed_conns"] for r in rows),
            "loadgen_rss_bytes": sum(r.get("rss", 0) for r in rows),
        }
        return step

    def stop(self) -> None:
        """Stop the generator processes (bounded)."""
        clean = bool(self.steps) and len(self.steps) == len(self.args.steps)
        self.workers.stop(clean)

    def result(self) -> dict[str, Any]:
        """What the steps run so far measured: the last step's figures at the top level,
        every step under `steps` (errors counted, and by code in `errors_by_code`)."""
        args, run = self.args, self.run
        steps = [
            {**s, "errors": sum(s["errors"].values()), "errors_by_code": s["errors"]}
            for s in self.steps
        ]
        last = steps[-1] if steps else {}
        n = args.group_size * args.pairs
        gw = run.gateway
        spawned = gw is not None and gw.proc is not None
        backend: dict[str, Any] = (
            {"store": gw.store, "cache": gw.cache, "bus": args.bus or "local://",
             "workers": run.workers}
            if gw is not None and spawned
            else {"store": args.store, "cache": args.cache, "addr": args.addr}
        )  # fmt: skip
        closed = int(last.get("closed_connections") or 0)
        rss, gen_rss = last.get("gateway_rss_bytes"), last.get("loadgen_rss_bytes")
        result: dict[str, Any] = {
            "connections_target": n,
            "connections_held": n - closed if steps else 0,
            "drops": closed,
            "group_size": args.group_size,
            "conversations": args.pairs,
            "gateway_workers": backend.get("workers", 1),
            "pairs": args.pairs,
            "procs": args.procs,
            "warmup_s": args.warmup,
            "backend": backend,
            "gateway_rss_max_bytes": run.sampler.max_rss("gateway"),
            **{k: v for k, v in last.items() if k != "step"},
            "steps": steps,
            "gateway_rss_per_conn_bytes": round(rss / n) if rss and n else None,
            "generator_rss_per_conn_bytes": round(gen_rss / n) if gen_rss and n else None,
        }
        if self.steps:
            result["max_rate_p99_le_50ms"] = sustained(self.steps)
        if isinstance(self.workers, RemoteWorkers):
            result["agents"] = self.workers.results()
        if gw is not None:
            result["gateway_pids"] = gw.pids()
        return result


def print_step(s: dict[str, Any]) -> None:
    errors = ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "none"
    cpu = s["gateway_cpu_percent"]
    rss = s["gateway_rss_bytes"]
    db = s["mariadb_cpu_percent"]
    redis_cpu, host = s.get("redis_cpu_percent"), s.get("host_cpu_busy_percent")
    print(
        f"step {s['step']}: target {s['rate_target']:g} msg/s, {s['duration_s']:g} s measured\n"
        f"  sent {s['sent']}  acked {s['acked']}  errors: {errors}\n"
        f"  acked/s {s['acked_per_s']:.1f} (ACKs received inside the window)\n"
        f"  ack  ms: p50 {s['ack_p50_ms']:.2f}  p90 {s['ack_p90_ms']:.2f}  "
        f"p99 {s['ack_p99_ms']:.2f}  p99.9 {s['ack_p999_ms']:.2f}  max {s['ack_max_ms']:.2f}\n"
        f"  push ms: p50 {s['push_p50_ms']:.2f}  p99 {s['push_p99_ms']:.2f}  "
        f"max {s['push_max_ms']:.2f}  ({s['pushes']} pushes)\n"
        f"  gateway: cpu {'-' if cpu is None else f'{cpu:.0f}%'}  rss "
        f"{'-' if rss is None else f'{rss / 2**20:.0f} MiB'}"
        f"   mariadb cpu {'-' if db is None else f'{db:.0f}%'}"
        f"   load generator cpu {s['loadgen_cpu_percent']:.0f}%, pacing lag p99 "
        f"{s['loadgen_lag_p99_ms']:.2f} ms max {s['loadgen_lag_max_ms']:.2f} ms\n"
        f"  redis cpu {'-' if redis_cpu is None else f'{redis_cpu:.0f}%'}"
        f"   machine busy {'-' if host is None else f'{host:.0f}%'}"
        f" of {100 * (s.get('host_cores') or 0)}% ({s.get('host_cores')} cores)\n"
        f"  CPU µs per acked message: gateway {_us(s.get('gateway_cpu_us_per_msg'))}"
        + (
            f" ({s['gateway_kernel_percent']:.0f}% in the kernel)"
            if s.get("gateway_kernel_percent") is not None
            else ""
        )
        + f"  mariadb {_us(s.get('mariadb_cpu_us_per_msg'))}"
        f"  redis {_us(s.get('redis_cpu_us_per_msg'))}"
        f"  generators {_us(s.get('loadgen_cpu_us_per_msg'))}"
        f"  whole machine {_us(s.get('host_cpu_us_per_msg'))}"
        + (
            f"  (gateway per push {_us(s['gateway_cpu_us_per_push'])})"
            if s.get("gateway_cpu_us_per_push") is not None
            else ""
        )
    )
    if s.get("push_sink"):
        print(step_line(s["push_sink"]))
    view = s.get("gateway_send_path")
    if view and view["batches"]:
        print(
            f"  gateway send path: {view['batches']} group commits, mean "
            f"{view['batch_mean']} msgs, {view['commit_mean_ms']} ms each; "
            f"mean SEND-to-ACK inside the gateway {view['server_ack_mean_ms']} ms"
        )


def default_procs(rate: float, group_size: int) -> int:
    """Generator processes for `rate` msg/s: each message is a SEND, its ACK and a PUSH
    to each other member; one process handles ~15,000 such frames a second with low
    pacing lag, and fewer processes leave more of a small machine to the gateway (chat at
    3,000 msg/s embedded: p99 36 ms with one process, 53 ms with two)."""
    return max(1, math.ceil(rate * (group_size + 1) / FRAMES_PER_PROC_S))


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def sustained(steps: list[dict[str, Any]]) -> float | None:
    """The highest target rate met with p99 <= 50 ms, no errors and >= 95% of it acked/s."""
    ok = [
        s["rate_target"]
        for s in steps
        if s["ack_p99_ms"] <= P99_GOAL_MS
        and not s["errors"]
        and s["acked_per_s"] >= 0.95 * s["rate_target"]
    ]
    return float(max(ok)) if ok else None
