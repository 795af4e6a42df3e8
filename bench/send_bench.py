"""Durable SEND throughput and latency of one gateway worker, open loop.

Pairs of users, each user one logged-in connection, each pair one p2p conversation
(OPEN_P2P at setup). The two users of a pair take turns sending. Load comes from
--procs generator processes (multiprocessing spawn, uvloop), each with its own share
of the pairs and of the rate, and ONE pacing timer per process (every ~1 ms) that
writes every send whose intended time has come: the schedule never waits for replies,
so a slow gateway shows up as latency, not as a lower offered rate.

Latency is measured from the INTENDED send time (coordinated-omission safe) to the
SEND_ACK (durable: committed to the store) and to the PUSH at the peer. Both go into
HdrHistograms (1 us .. 60 s, 3 significant digits) that are reset when the warmup
ends and merged across processes at the end of each step.

Each step (--rate, or every rate of --rates) runs --warmup then --duration seconds
at its rate, then drains: the sends of the measured window that are still in flight
get up to --drain seconds for their ACK, after which they count as errors "timeout".

    python -m bench.send_bench --spawn-gateway --rate 2000 --duration 10
    python -m bench.send_bench --spawn-gateway --rates 2000,5000,10000 --json out.json
    python -m bench.send_bench --addr 127.0.0.1:7070 --token-key k:s --rate 1000

JSON fields (top level = the last step; `steps` holds every step): rate_target,
duration_s, sent, acked, errors (by code), acked_per_s (ACKs received inside the
measured window / its length), ack_p50/p90/p99/max_ms, push_p50/p99_ms,
gateway_cpu_percent (mean, 100 = one core), gateway_rss_bytes (max), and more.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.common import (
    BenchError,
    Gateway,
    GatewaySpec,
    Sampler,
    find_pid,
    hist_of,
    log,
    machine_info,
    ms,
    new_hist,
    proc_rss,
    record_us,
    run_generator,
)
from bench.limits import raise_nofile
from bench.loadclient import LoadConnection, RequestFailed, connect, stamp_of, stamped_content
from bench.preload import Volume
from protocol.frames import Push
from protocol.token import sign_token

UID_SPAN: Final = 1_000_000_000  # a run's uids: a random block of this size
DEVICE: Final = "bench"
P99_GOAL_MS: Final = 50.0
PER_UID_SAFE_RATE: Final = 80.0  # below the gateway's default 100 msg/s per uid
PING_EVERY_S: Final = 20.0  # keeps quiet connections under the gateway's idle timeout
PROGRESS_EVERY_S: Final = 1.0
TICK_S: Final = 0.001
PUSH_GRACE_S: Final = 2.0  # after the last ACK, how long to wait for missing PUSHes


# === Generator process ================================================================


@dataclass(frozen=True)
class WorkerSpec:
    """What one generator process needs; picklable (spawn)."""

    idx: int
    host: str
    port: int
    kid: str
    secret: str
    uid0: int  # unit u of this process is users uid0 + g*u + 1 .. uid0 + g*u + g
    pairs: int  # units: p2p pairs (group_size 2) or groups
    group_size: int
    run_id: str
    content_size: int
    connect_concurrency: int
    deadline_ns: int  # monotonic: give up after this


@dataclass(frozen=True)
class StepSpec:
    """One measured step, as a generator process runs it; times are monotonic ns."""

    index: int
    rate: float  # this process's share
    start_ns: int
    win_start_ns: int
    win_end_ns: int
    drain_s: float


class StepRecorder:
    """Counts and histograms of one step in one process; the `LoadSink` of every
    connection. Before the window opens it records the warmup (for the live progress
    line); when the window opens, everything is reset and only sends intended inside
    the window count."""

    def __init__(self, step: StepSpec, run_prefix: str) -> None:
        self.step = step
        self.run_prefix = run_prefix
        self.since_ns = step.start_ns  # sends intended before this are ignored
        self.in_window = False
        self.ack_hist = new_hist()
        self.push_hist = new_hist()
        self.lag_hist = new_hist()  # pacing lag of the oldest due send per tick
        self.sent = 0
        self.acked = 0
        self.pushes = 0
        self.errors: dict[str, int] = {}
        self.kicks: dict[str, int] = {}
        self.acks_in_window_time = 0
        # Totals since the step began (warmup too), for the progress line.
        self.total_sent = 0
        self.total_acked = 0
        self.total_errors = 0

    def open_window(self) -> None:
        self.in_window = True
        self.since_ns = self.step.win_start_ns
        self.ack_hist.reset()
        self.push_hist.reset()
        self.lag_hist.reset()
        self.sent = self.acked = self.pushes = 0
        self.errors = {}

    @property
    def window_pending(self) -> int:
        return self.sent - self.acked - sum(self.errors.values())

    # LoadSink -----------------------------------------------------------------------

    def on_ack(self, intended_ns: int, now_ns: int) -> None:
        self.total_acked += 1
        step = self.step
        if step.win_start_ns <= now_ns < step.win_end_ns:
            self.acks_in_window_time += 1
        if intended_ns >= self.since_ns:
            self.acked += 1
            record_us(self.ack_hist, now_ns - intended_ns)

    def on_error(self, intended_ns: int, reason: str) -> None:
        self.total_errors += 1
        if intended_ns >= self.since_ns:
            self.errors[reason] = self.errors.get(reason, 0) + 1

    def on_push(self, push: Push, now_ns: int) -> None:
        if not push.client_msg_id.startswith(self.run_prefix):
            return  # not one of this step's messages
        intended = stamp_of(push.content)
        if intended is not None and intended >= self.since_ns:
            self.pushes += 1
            record_us(self.push_hist, now_ns - intended)

    def on_kick(self, reason: str) -> None:
        self.kicks[reason] = self.kicks.get(reason, 0) + 1


class Generator:
    """The connections of one process and the pacing timer that drives them."""

    def __init__(self, spec: WorkerSpec, out: Any) -> None:
        self.spec = spec
        self.out = out  # multiprocessing queue to the driver
        self.loop = asyncio.get_running_loop()
        self.conns: list[LoadConnection] = []  # 2 per pair: [a0, b0, a1, b1, ...]
        self.convs: list[int] = []
        self.padding = b"x" * max(0, spec.content_size - 8)
        self.recorder: StepRecorder | None = None
        self._last_ping = time.monotonic()

    def remaining_s(self) -> float:
        return max(0.1, (self.spec.deadline_ns - time.monotonic_ns()) / 1e9)

    async def setup(self) -> None:
        spec = self.spec
        exp = int(time.time()) + 7 * 86_400
        sem = asyncio.Semaphore(spec.connect_concurrency)
        placeholder = StepRecorder(StepSpec(-1, 0, 0, 0, 0, 0), "")
        g = spec.group_size
        uids = [spec.uid0 + i + 1 for i in range(g * spec.pairs)]

        async def one(uid: int) -> LoadConnection:
            token = sign_token(spec.kid, spec.secret, uid, DEVICE, exp)
            async with sem:
                for attempt in range(5):
                    try:
                        return await connect(
                            spec.host, spec.port, uid, placeholder,
                            token=token, device=DEVICE, timeout=min(30.0, self.remaining_s()),
                        )  # fmt: skip
                    except OSError:
                        if attempt == 4:
                            raise
                        await asyncio.sleep(0.2 * (attempt + 1))
            raise AssertionError("unreachable")

        self.conns = list(await asyncio.gather(*(one(u) for u in uids)))

        async def open_pair(p: int) -> int:
            async with sem:
                members = self.conns[g * p : g * p + g]
                timeout = min(30.0, self.remaining_s())
                if g == 2:
                    return await members[0].open_p2p(members[1].uid, timeout=timeout)
                uids = [c.uid for c in members]
                return await members[0].group_create("bench", uids, timeout=timeout)

        self.convs = list(await asyncio.gather(*(open_pair(p) for p in range(spec.pairs))))

    async def run_step(self, step: StepSpec) -> dict[str, Any]:
        spec = self.spec
        prefix = f"{spec.run_id}.{step.index}.{spec.idx}."
        rec = self.recorder = StepRecorder(step, prefix)
        for c in self.conns:
            c.sink = rec
        interval = 1e9 / step.rate
        # Send k is intended at start + k * interval; the last is before the window ends.
        k_end = math.ceil((step.win_end_ns - step.start_ns) / interval)
        n, g = spec.pairs, spec.group_size
        conns, convs, padding = self.conns, self.convs, self.padding
        done = self.loop.create_future()
        state = {"k": 0}
        cpu_at_window: list[float] = []

        def tick() -> None:
            now = time.monotonic_ns()
            if not rec.in_window and now >= step.win_start_ns:
                rec.open_window()
                cpu_at_window.append(time.process_time())
            k = state["k"]
            due = min(k_end, int((now - step.start_ns) / interval) + 1)
            if k < due:
                record_us(rec.lag_hist, now - (step.start_ns + int(k * interval)))
            while k < due:
                intended = step.start_ns + int(k * interval)
                pair = k % n
                sender = conns[g * pair + (k // n) % g]
                sender.send(
                    convs[pair], f"{prefix}{k}", stamped_content(intended, padding), intended
                )
                if intended >= rec.since_ns:  # not a warmup send of the tick that opened it
                    rec.sent += 1
                rec.total_sent += 1
                k += 1
            state["k"] = k
            if k >= k_end and now >= step.win_end_ns:
                if not done.done():
                    done.set_result(None)
                return
            self.loop.call_later(TICK_S, tick)

        async def progress() -> None:
            last = (0, 0, time.monotonic())
            while True:
                await asyncio.sleep(PROGRESS_EVERY_S)
                mono = time.monotonic()
                dt = max(1e-3, mono - last[2])
                phase = "drain" if done.done() else "measure" if rec.in_window else "warmup"
                self.out.put(
                    ("progress", spec.idx, step.index, phase,
                     (rec.total_sent - last[0]) / dt, (rec.total_acked - last[1]) / dt,
                     rec.total_errors, rec.total_sent - rec.total_acked - rec.total_errors,
                     rec.ack_hist.encode())
                )  # fmt: skip
                last = (rec.total_sent, rec.total_acked, mono)
                if mono - self._last_ping >= PING_EVERY_S:
                    self._last_ping = mono
                    for c in conns:
                        c.ping()

        reporter = self.loop.create_task(progress())
        try:
            await asyncio.sleep(max(0.0, (step.start_ns - time.monotonic_ns()) / 1e9))
            tick()
            await asyncio.wait_for(done, self.remaining_s())
            cpu_end = time.process_time()
            # Drain: in-window sends get --drain seconds for their ACK; PUSHes a little more.
            # A bounded poll: an Event would cost a wakeup check on every ACK.
            drain_until = time.monotonic() + min(step.drain_s, self.remaining_s())
            while rec.window_pending > 0 and time.monotonic() < drain_until:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            push_until = min(drain_until, time.monotonic() + PUSH_GRACE_S)
            while rec.pushes < rec.acked * (g - 1) and time.monotonic() < push_until:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        undrained = rec.window_pending
        if undrained > 0:
            rec.errors["timeout"] = rec.errors.get("timeout", 0) + undrained
        # Late replies to timed-out sends must not count in the next step.
        for c in conns:
            c.pending.clear()
        window_s = (step.win_end_ns - step.win_start_ns) / 1e9
        cpu_s = cpu_end - cpu_at_window[0] if cpu_at_window else 0.0
        return {
            "sent": rec.sent,
            "acked": rec.acked,
            "pushes": rec.pushes,
            "errors": rec.errors,
            "kicks": rec.kicks,
            "acks_in_window_time": rec.acks_in_window_time,
            "ack_hist": rec.ack_hist.encode(),
            "push_hist": rec.push_hist.encode(),
            "lag_hist": rec.lag_hist.encode(),
            "cpu_percent": 100.0 * cpu_s / window_s if window_s > 0 else 0.0,
            "closed_conns": sum(1 for c in conns if c.closed),
            "rss": proc_rss() or 0,
        }

    def close(self) -> None:
        for c in self.conns:
            c.close()


async def _worker(spec: WorkerSpec, ctrl: Any, out: Any) -> None:
    gen = Generator(spec, out)
    try:
        await gen.setup()
        out.put(("ready", spec.idx))
        while True:
            timeout = gen.remaining_s()
            ready = await gen.loop.run_in_executor(None, ctrl.poll, timeout)
            if not ready:
                raise TimeoutError("no command from the driver before the deadline")
            cmd = ctrl.recv()
            if cmd[0] == "stop":
                break
            result = await gen.run_step(cmd[1])
            out.put(("result", spec.idx, cmd[1].index, result))
    finally:
        gen.close()
        await asyncio.sleep(0.2)  # let the FINs go out


def worker_main(spec: WorkerSpec, ctrl: Any, out: Any) -> None:
    run_generator(spec.idx, _worker(spec, ctrl, out), out)


# === Driver: gateway, database, resource sampling =====================================


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


# === Driver: steps, progress, results =================================================


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ctx = mp.get_context("spawn")
        self.out: Any = self.ctx.Queue()
        self.procs: list[Any] = []
        self.ctrls: list[Any] = []
        self.deadline = time.monotonic() + args.timeout
        self.sampler = Sampler()
        self.gateway: Gateway | None = None
        self.progress: dict[int, tuple[Any, ...]] = {}
        self.metrics_url: str | None = args.metrics_url
        self.scrape_at_ns = 1 << 62  # when to take the gateway's counters at window start
        # The measured window's edges: the sampler reads /proc right as each passes, so
        # CPU per operation covers the window even when it lasts a second or two.
        self.edges_ns: list[int] = []
        self.scraped: dict[str, float] | None = None

    def remaining(self) -> float:
        left: float = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"--timeout {self.args.timeout:.0f} s reached")
        return left

    def check_alive(self) -> None:
        gw = self.gateway
        if gw is not None and gw.proc is not None and gw.proc.poll() is not None:
            raise BenchError(f"gateway exited with status {gw.proc.returncode}:\n{gw.log_tail()}")
        dead = [p for p in self.procs if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"generator process exited with status {dead[0].exitcode}")

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
                msg = self.out.get(timeout=wait)
            except queue.Empty:
                self.check_alive()
                continue
            if msg[0] == "error":
                raise RuntimeError(f"generator {msg[1]}: {msg[2]}")
            yield msg

    def start_generators(self, host: str, port: int, kid: str, secret: str) -> None:
        args = self.args
        shares = [args.pairs // args.procs] * args.procs
        for i in range(args.pairs % args.procs):
            shares[i] += 1
        run_id = secrets.token_hex(4)
        uid0 = args.uid_base if args.uid_base else (secrets.randbelow(1000) + 1) * UID_SPAN
        deadline_ns = time.monotonic_ns() + int(args.timeout * 1e9)
        self.shares = shares
        for i, n in enumerate(shares):
            spec = WorkerSpec(
                idx=i, host=host, port=port, kid=kid, secret=secret, uid0=uid0, pairs=n,
                group_size=args.group_size,
                run_id=run_id, content_size=args.content_size,
                connect_concurrency=args.connect_concurrency, deadline_ns=deadline_ns,
            )  # fmt: skip
            uid0 += args.group_size * n
            parent_end, child_end = self.ctx.Pipe()
            p = self.ctx.Process(target=worker_main, args=(spec, child_end, self.out), daemon=True)
            p.start()
            self.procs.append(p)
            self.ctrls.append(parent_end)
        t0 = time.monotonic()
        ready: set[int] = set()
        for msg in self.messages():
            if msg[0] == "ready":
                ready.add(msg[1])
                if len(ready) == len(self.procs):
                    break
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
        for ctrl, share in zip(self.ctrls, self.shares, strict=True):
            step = StepSpec(index, rate * share / args.pairs, start_ns, win_start_ns,
                            win_end_ns, args.drain)  # fmt: skip
            ctrl.send(("step", step))
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
                if len(fresh) == len(self.procs):
                    self.print_progress(rate, start_ns)
                    fresh.clear()
            elif msg[0] == "result" and msg[2] == index:
                results[msg[1]] = msg[3]
                if len(results) == len(self.procs):
                    break
        self.sampler.sample(force=True)
        summary = self.summarize(index, rate, win_start_ns, win_end_ns, results)
        summary["gateway_send_path"] = gateway_view(self.scraped, scrape(self.metrics_url))
        return summary

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
            f"  p99 {ms(hist, 99):8.2f} ms",
            file=sys.stderr,
            flush=True,
        )

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
        f"  mariadb {_us(s.get('mariadb_cpu_us_per_msg'))}"
        f"  redis {_us(s.get('redis_cpu_us_per_msg'))}"
        f"  generators {_us(s.get('loadgen_cpu_us_per_msg'))}"
        f"  whole machine {_us(s.get('host_cpu_us_per_msg'))}"
        + (
            f"  (gateway per push {_us(s['gateway_cpu_us_per_push'])})"
            if s.get("gateway_cpu_us_per_push") is not None
            else ""
        )
    )
    view = s.get("gateway_send_path")
    if view and view["batches"]:
        print(
            f"  gateway send path: {view['batches']} group commits, mean "
            f"{view['batch_mean']} msgs, {view['commit_mean_ms']} ms each; "
            f"mean SEND-to-ACK inside the gateway {view['server_ack_mean_ms']} ms"
        )


FRAMES_PER_PROC_S: Final = 15_000


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


def run(args: argparse.Namespace) -> int:
    raise_nofile()  # inherited by the gateway
    driver = Driver(args)
    result: dict[str, Any] = {
        "scenario": "send",
        "pairs": args.pairs,
        "procs": args.procs,
        "warmup_s": args.warmup,
        "machine": machine_info(),
        "command": [sys.executable, "-m", "bench.send_bench", *sys.argv[1:]],
    }
    steps: list[dict[str, Any]] = []
    status = 0
    workdir = Path(tempfile.mkdtemp(prefix="imgw-send-bench-"))
    gw: Gateway | None = None
    try:
        if args.spawn_gateway:
            kid, secret = "bench", secrets.token_hex(16)
            spec = GatewaySpec(
                store=None if args.embedded else args.store or "mysql://root:@127.0.0.1:3306/",
                cache=args.cache or "memory://", bus=args.bus, workers=args.workers,
                shards=args.shards, port=args.port, extra=args.gateway_arg,
                keep_data=args.keep_db,
                log_path=Path(args.gateway_log) if args.gateway_log else None,
                preload=Volume.of(args.preload, args.preload_convs) if args.preload else None,
            )  # fmt: skip
            gw = driver.gateway = Gateway(spec, workdir, kid, secret)
            result["backend"] = {
                "store": gw.store,
                "cache": gw.cache,
                "bus": args.bus,
                "workers": args.workers,
            }
            gw.check_services()
            gw.migrate(min(60.0, driver.remaining()))
            result["preload"] = gw.preload()
            gw.start(min(120.0, driver.remaining()))
            host, port = gw.host, gw.port
            driver.sampler.watch("gateway", gw.pids)
            driver.metrics_url = gw.metrics_url
        else:
            host, _, port_s = args.addr.rpartition(":")
            host, port = host or "127.0.0.1", int(port_s)
            kid, _, secret = args.token_key.partition(":")
            result["backend"] = {"store": args.store, "cache": args.cache, "addr": args.addr}
            if args.gateway_pid:
                gw = driver.gateway = Gateway.attach(args.gateway_pid)
                driver.sampler.watch("gateway", gw.pids)
        store = gw.store if gw is not None else args.store or ""
        if store.startswith("mysql://"):  # a local MariaDB serves it: sample that too
            db_pid = find_pid("mariadbd", "mysqld")
            if db_pid is not None:
                driver.sampler.watch("mariadb", lambda: [db_pid])
        cache = gw.cache if gw is not None else args.cache or ""
        if cache.startswith("redis://"):
            redis_pid = find_pid("redis-server")
            if redis_pid is not None:
                driver.sampler.watch("redis", lambda: [redis_pid])
        driver.sampler.sample(force=True)
        driver.start_generators(host, port, kid, secret)
        for i, rate in enumerate(args.rates):
            steps.append(driver.run_step(i, rate))
            print_step(steps[-1])
    except KeyboardInterrupt:
        log("interrupted")
        status = 130
        result["error"] = "interrupted"
    except (
        BenchError,
        RuntimeError,
        TimeoutError,
        OSError,
        RequestFailed,
        subprocess.SubprocessError,
    ) as e:
        log(f"failed: {e}")
        status = 1
        result["error"] = str(e)
    finally:
        signal.alarm(90)  # a fresh backstop for the cleanup, whose every wait is bounded
        for ctrl in driver.ctrls:
            with contextlib.suppress(OSError):
                ctrl.send(("stop",))
        for p in driver.procs:
            p.join(timeout=5 if status == 0 else 1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        if gw is not None and gw.proc is not None:
            result["gateway_pids"] = gw.pids()
            code = gw.stop(timeout=60.0)
            result["gateway_exit_code"] = code
            if code != 0:
                log(f"gateway exited with status {code}:\n{gw.log_tail()}")
                status = status or 1
            gw.cleanup()
        elif gw is not None:
            result["gateway_pids"] = gw.pids()
        if gw is not None and gw.proc is not None and status in (0, 130) and not args.gateway_log:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
        elif gw is not None and gw.proc is not None:
            log(f"gateway log: {gw.log_path}")
    result["gateway_rss_max_bytes"] = driver.sampler.max_rss("gateway")
    result["steps"] = steps
    if steps:
        result.update({k: v for k, v in steps[-1].items() if k != "step"})
        result["max_rate_p99_le_50ms"] = sustained(steps)
    if len(steps) > 1:
        best = result["max_rate_p99_le_50ms"]
        print(
            f"highest rate with p99 <= {P99_GOAL_MS:g} ms, no errors, >= 95% acked/s: "
            f"{'none' if best is None else f'{best:g} msg/s'}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {args.json}")
    return status


# === Command line ======================================================================


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.send_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = p.add_argument_group("gateway under test (one of)")
    target.add_argument(
        "--spawn-gateway",
        action="store_true",
        help="start `imgw serve` here on a fresh backend (a new MariaDB database "
        "imgw_bench_<random>, migrated with --shards, dropped afterwards unless --keep-db), "
        "sample its CPU and RSS, and stop it with SIGTERM at the end",
    )
    target.add_argument("--addr", metavar="HOST:PORT", help="a gateway that is already running")
    p.add_argument("--token-key", metavar="KID:SECRET", help="its token key (with --addr)")
    p.add_argument(
        "--gateway-pid", type=int, action="append",
        help="its pid(s), to sample CPU/RSS (with --addr; workers are found as children)",
    )  # fmt: skip
    p.add_argument(
        "--metrics-url",
        metavar="URL",
        help="its Prometheus /metrics, for batch and commit figures (with --addr)",
    )
    backend = p.add_argument_group("backend (with --spawn-gateway)")
    backend.add_argument(
        "--store", help="store URL to use as is (default: a fresh MariaDB database)"
    )
    backend.add_argument("--cache", help="cache URL passed to the gateway (default memory://)")
    backend.add_argument("--bus", default="local://", help="bus URL (default local://)")
    backend.add_argument(
        "--workers", type=int, default=1, help="gateway worker processes (needs redis and amqp)"
    )
    backend.add_argument(
        "--embedded", action="store_true", help="embedded SQLite store in a temporary directory"
    )
    backend.add_argument("--shards", type=int, default=16, help="message shards (default 16)")
    backend.add_argument("--keep-db", action="store_true", help="keep the bench database")
    backend.add_argument("--port", type=int, default=0, help="gateway port (default: free)")
    backend.add_argument("--gateway-log", metavar="PATH", help="gateway log file (kept)")
    backend.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra `imgw serve` argument, repeatable (--gateway-arg=--batch-max=256)",
    )
    load = p.add_argument_group("load")
    load.add_argument("--rate", type=float, default=1000.0, help="target msg/s (default 1000)")
    load.add_argument("--rates", help="comma-separated rates: one step each, on the same gateway")
    load.add_argument(
        "--pairs",
        type=int,
        help="user pairs, one p2p conversation each (default: enough that each uid "
        "sends <= 10 msg/s; the gateway limits a uid to 100 msg/s)",
    )
    load.add_argument(
        "--group-size", type=int, default=2,
        help="members per conversation: 2 = p2p pairs (default), more = groups",
    )  # fmt: skip
    load.add_argument(
        "--procs", type=int,
        help="generator processes (default: one per 15,000 frames a second it sends and "
        "receives, at least 1: on a small machine every extra process takes CPU from "
        "the gateway under test)",
    )  # fmt: skip
    load.add_argument("--duration", type=float, default=30.0, help="measured seconds (30)")
    load.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first (5)")
    load.add_argument(
        "--drain", type=float, default=10.0, help="seconds to wait for late ACKs per step (10)"
    )
    load.add_argument(
        "--content-size", type=int, default=64, help="message content bytes (>= 8; 64)"
    )
    load.add_argument(
        "--preload", type=int, default=0, metavar="N",
        help="store N messages over many conversations before the gateway starts (with "
        "--spawn-gateway): measure the store at volume, not empty",
    )  # fmt: skip
    load.add_argument(
        "--preload-convs", type=int, metavar="C",
        help="conversations the preloaded messages spread over (min(100000, N/10))",
    )  # fmt: skip
    load.add_argument("--connect-concurrency", type=int, default=200, help=argparse.SUPPRESS)
    load.add_argument("--uid-base", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument(
        "--timeout",
        type=float,
        help="hard limit for the whole run, s (default: steps x (duration + warmup) + 60)",
    )
    p.add_argument("--json", metavar="PATH", help="write the results here")
    args = p.parse_args(argv)

    if args.spawn_gateway == bool(args.addr):
        p.error("give exactly one of --spawn-gateway and --addr HOST:PORT")
    if args.addr and not args.token_key:
        p.error("--addr needs --token-key KID:SECRET (the gateway's key)")
    if args.token_key and ":" not in args.token_key:
        p.error("--token-key must be KID:SECRET")
    if args.embedded and args.store:
        p.error("--embedded and --store exclude each other")
    if args.preload and not args.spawn_gateway:
        p.error("--preload writes into a fresh store before the gateway starts: "
                "it needs --spawn-gateway")  # fmt: skip
    try:
        args.rates = [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]
    except ValueError:
        p.error("--rates must be numbers separated by commas, e.g. 2000,5000,10000")
    if any(r <= 0 for r in args.rates):
        p.error("rates must be positive")
    top = max(args.rates)
    if args.procs is None:
        args.procs = default_procs(top, args.group_size)
    if args.pairs is None:
        args.pairs = max(10, math.ceil(top / 20))
    if args.procs < 1 or args.pairs < args.procs:
        p.error("need 1 <= --procs <= --pairs")
    if args.duration <= 0 or args.warmup < 0 or args.drain < 0:
        p.error("need --duration > 0, --warmup >= 0, --drain >= 0")
    if args.content_size < 8:
        p.error("--content-size must be >= 8 (the send time travels in the content)")
    if not 2 <= args.group_size <= 1000:
        p.error("--group-size must be 2..1000")
    per_uid = top / (args.group_size * args.pairs)
    if per_uid > PER_UID_SAFE_RATE:
        log(
            f"warning: {per_uid:.0f} msg/s per uid; the gateway's default limit is 100/s "
            f"(burst 200): use more --pairs or --gateway-arg=--rate-per-s=..."
        )
    if args.timeout is None:
        args.timeout = len(args.rates) * (args.duration + args.warmup + args.drain) + 60
        args.timeout += args.preload / 5_000  # bulk loading runs at >= 10,000 rows/s
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    previous = signal.getsignal(signal.SIGALRM)

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"--timeout {args.timeout:.0f} s reached (alarm)")

    # The driver checks its deadline everywhere; the alarm is the backstop (a bit later).
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.timeout) + 30)
    try:
        return run(args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


if __name__ == "__main__":
    sys.exit(main())
