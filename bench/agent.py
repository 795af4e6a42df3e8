"""`imgw bench agent`: a load machine's share of a bench run, run for a controller.

    imgw bench agent --coordinator redis://ctl-host:6379/0 [--name NAME] [--allow NET]
        [--source ADDRESS ...]

The agent registers with the coordinating Redis (bench.coordinator) and waits for work.
A controller (`imgw bench connect --agents N --coordinator URL ...`) sends it its share:
a count of connections, a uid range, a ramp rate, and a /16 of loopback source addresses
for its generator processes (bench.fleet, the same processes a single-machine run
starts); for a gateway on another machine the processes bind the addresses given with
`--source` instead, one each. The agent builds its fleet, reports `ready`, and starts it
when the controller sends `go` to every agent at once (the start barrier). Each second
it reports its counts, its generator processes' CPU seconds and RSS, and the machine's
kernel memory for sockets against its level at the start of the run.

Bounded: the agent stops its share and goes back to waiting when the controller asks,
when the run is aborted, when the controller's lease on the run lapses (a controller
that died), or at the work's deadline; and it only sends traffic to the addresses it is
allowed (`--allow`, loopback by default).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import multiprocessing as mp
import os
import queue
import signal
import socket
import threading
import time
import traceback
from typing import Any, Final

import msgpack
import uvloop

from bench.addresses import allowed, is_loopback
from bench.common import CLK_TCK, BenchError, Sampler, kernel_memory, log, set_log_name
from bench.coordinator import Coordinator, to_monotonic
from bench.fleet import Fleet, FleetView
from bench.offline import PHASES, OfflinePart, OfflineShare
from bench.senders import StepSpec, WorkerSpec, worker_main

GO_WAIT_S: Final = 120.0  # from `ready` to the controller's `go`
REPORT_EVERY_S: Final = 1.0
DEFAULT_ALLOW: Final = ("127.0.0.0/8", "::1/128")


class Agent:
    def __init__(
        self, coordinator: Coordinator, name: str, allow: list[str], sources: list[str]
    ) -> None:
        self.c = coordinator
        self.name = name
        self.allow = allow
        self.sources = sources
        self.state = "idle"
        self.run_id: str | None = None
        self.last_register = 0.0

    def info(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "cores": os.cpu_count(),
            "state": self.state,
            "run": self.run_id,
        }

    def heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_register >= 1.0:
            self.c.register(self.name, self.info())
            self.last_register = now

    def serve(self, once: bool = False) -> None:
        """Wait for work and run it, until interrupted (or after one run with `once`)."""
        log(f"agent {self.name} waiting for work on {self.c.prefix}* (allowed: {self.allow})")
        try:
            while True:
                self.heartbeat()
                msg = self.c.receive(self.name, 1.0)
                if msg is None or msg.get("kind") != "work":
                    continue  # a go or stop of a run that is over
                self.work(msg)
                if once:
                    return
        finally:
            self.c.unregister(self.name)

    def work(self, msg: dict[str, Any]) -> None:
        run = str(msg["run"])
        self.run_id, self.state = run, "busy"
        self.heartbeat(force=True)
        report: dict[str, Any] = {"state": "ready", "t": time.time()}
        fleet: Fleet | None = None
        try:
            if "workers" in msg:
                self._workers(run, msg["workers"], report)
                return
            if "offline" in msg:
                self._offline(run, msg, report)
                return
            share = msg["share"]
            self._check_target(share["host"])
            loopback = is_loopback(share["host"])
            if not loopback and not self.sources:
                raise BenchError(
                    f"the run targets {share['host']}, not loopback: start the agent with "
                    "--source ADDRESS (this machine's addresses, one per generator process)"
                )
            fleet = Fleet(**share["fleet"], sources=None if loopback else self.sources)
            target = f"{share['host']}:{share['port']}"
            n = share["fleet"]["connections"]
            log(f"run {run}: {n:,} connections to {target}, from {fleet.src_ip(0)}..")
            self.c.report(run, self.name, report)
            if not self._wait_go(run):
                return
            self._drive(run, fleet, share)
        except Exception as e:
            log(f"run {run} failed: {e}")
            self.c.report(run, self.name, {"state": "error", "error": str(e), "t": time.time(),
                                           "trace": traceback.format_exc(limit=5)})  # fmt: skip
        finally:
            if fleet is not None:
                fleet.stop()
            self.run_id, self.state = None, "idle"
            self.heartbeat(force=True)

    def _check_target(self, host: str) -> None:
        if not allowed(host, self.allow):
            raise BenchError(
                f"the run targets {host}, which this agent is not allowed to load "
                f"(--allow {' '.join(self.allow)})"
            )

    def _workers(self, run: str, specs: list[dict[str, Any]], report: dict[str, Any]) -> None:
        """A chat or group run's generator processes: started at `go`, told each step the
        controller sends, their messages relayed to it, until it says stop."""
        for d in specs:
            self._check_target(d["host"])
        log(f"run {run}: {len(specs)} generator processes to {specs[0]['host']}:"
            f"{specs[0]['port']}")  # fmt: skip
        self.c.report(run, self.name, report)
        if not self._wait_go(run):
            return
        ctx = mp.get_context("spawn")
        out: Any = ctx.Queue()
        procs: dict[int, Any] = {}
        ctrls: dict[int, Any] = {}
        for d in specs:
            worker = WorkerSpec(**{**d, "deadline_ns": to_monotonic(int(d["deadline_ns"]))})
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(worker, child_end, out), daemon=True)
            p.start()
            procs[worker.idx], ctrls[worker.idx] = p, parent_end
        sampler = Sampler()
        sampler.watch("generators", lambda: [p.pid for p in procs.values() if p.is_alive()])
        kernel0 = kernel_memory()
        state, seq, last_report = "running", 0, 0.0
        try:
            while True:
                batch: list[bytes] = []
                with contextlib.suppress(queue.Empty):
                    batch.append(msgpack.packb(out.get(timeout=0.05)))
                    while len(batch) < 500:
                        batch.append(msgpack.packb(out.get_nowait()))
                self.c.emit(run, batch)
                while (msg := self.c.receive(self.name, 0)) is not None:
                    if msg.get("run") != run:
                        continue
                    if msg["kind"] == "step":
                        step = dict(msg["step"])
                        for name in ("start_ns", "win_start_ns", "win_end_ns"):
                            step[name] = to_monotonic(int(step[name]))
                        ctrls[int(msg["idx"])].send(("step", StepSpec(**step)))
                    elif msg["kind"] == "stop":
                        state = "stopping"
                now = time.monotonic()
                if now - last_report < REPORT_EVERY_S and state == "running":
                    continue
                last_report = now
                self.heartbeat()
                if state == "running":
                    if ended := self._ended(run):
                        state = ended
                    elif any(p.exitcode not in (None, 0) for p in procs.values()):
                        raise BenchError("a generator process exited with an error")
                sampler.sample(force=True)
                seq += 1
                self.c.report(run, self.name, _report(seq, state, FleetView(), sampler, kernel0))
                if state != "running":
                    break
        finally:
            for ctrl in ctrls.values():
                with contextlib.suppress(OSError):
                    ctrl.send(("stop",))
            for p in procs.values():
                p.join(timeout=5)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
            with contextlib.suppress(queue.Empty):  # what the processes said last
                batch = []
                while True:
                    batch.append(msgpack.packb(out.get_nowait()))
            self.c.emit(run, batch)
        final = "stopped" if state == "stopping" else state
        self.c.report(run, self.name, _report(seq + 1, final, FleetView(), sampler, kernel0))

    def _offline(self, run: str, msg: dict[str, Any], report: dict[str, Any]) -> None:
        """An offline run's part (bench.offline): each phase run when the controller
        starts it, on an event loop in a thread of its own, while this thread reports."""
        share = OfflineShare(**msg["offline"])
        self._check_target(share.host)
        log(f"run {run}: {share.receivers:,} offline receivers on {share.host}:{share.port}")
        self.c.report(run, self.name, report)
        if not self._wait_go(run):
            return
        part = OfflinePart(share)
        loop = uvloop.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="offline", daemon=True)
        thread.start()
        sampler = Sampler()
        sampler.watch("generators", lambda: [os.getpid()])
        kernel0 = kernel_memory()
        deadline = time.monotonic() + float(msg["timeout_s"])
        phases: dict[str, Any] = {}
        running: tuple[str, concurrent.futures.Future[dict[str, Any]]] | None = None
        state, seq, last_report = "running", 0, 0.0
        try:
            while True:
                got = self.c.receive(self.name, 0.1)
                if got is not None and got.get("run") == run:
                    if got["kind"] == "step" and running is None and got["phase"] in PHASES:
                        phase = str(got["phase"])
                        coro = part.run_phase(phase)
                        running = (phase, asyncio.run_coroutine_threadsafe(coro, loop))
                    elif got["kind"] == "stop":
                        state = "stopping"
                finished = running is not None and running[1].done()
                if running is not None and finished:
                    phases[running[0]] = running[1].result()  # its error fails the run
                    running = None
                now = time.monotonic()
                if now - last_report < REPORT_EVERY_S and not finished and state == "running":
                    continue
                last_report = now
                self.heartbeat()
                if state == "running":
                    if ended := self._ended(run):
                        state = ended
                    elif now > deadline:
                        state = "timed out"
                sampler.sample(force=True)
                seq += 1
                out = _report(seq, state, FleetView(), sampler, kernel0)
                self.c.report(run, self.name, {**out, "phases": phases})
                if state != "running":
                    break
        finally:
            if running is not None:
                running[1].cancel()
            loop.call_soon_threadsafe(part.close)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        final = "stopped" if state == "stopping" else state
        out = _report(seq + 1, final, FleetView(), sampler, kernel0)
        self.c.report(run, self.name, {**out, "phases": phases})

    def _ended(self, run: str) -> str | None:
        """How the controller ended `run` other than with a stop: "orphaned" (its lease
        on the run lapsed) or "aborted"; None while the run goes on."""
        if not self.c.run_held(run):
            return "orphaned"
        if why := self.c.aborted(run):
            log(f"run {run} aborted by the controller: {why}")
            return "aborted"
        return None

    def _wait_go(self, run: str) -> bool:
        deadline = time.monotonic() + GO_WAIT_S
        while time.monotonic() < deadline:
            self.heartbeat()
            msg = self.c.receive(self.name, 0.2)
            if msg is not None and msg.get("run") == run:
                if msg["kind"] == "go":
                    return True
                if msg["kind"] == "stop":
                    return False
            if not self.c.run_held(run) or self.c.aborted(run):
                log(f"run {run}: the controller is gone; back to waiting")
                return False
        raise BenchError(f"no go from the controller within {GO_WAIT_S:g} s")

    def _drive(self, run: str, fleet: Fleet, share: dict[str, Any]) -> None:
        sampler = Sampler()
        sampler.watch("generators", fleet.pids)
        sources = [fleet.src_ip(i) for i in range(fleet.procs_n)]
        kernel0 = kernel_memory()
        fleet.start(share["host"], share["port"], share["kid"], share["secret"], share["uid0"])
        deadline = time.monotonic() + float(share["fleet"]["timeout_s"])
        state = "running"
        seq = 0
        while True:
            view = fleet.poll(REPORT_EVERY_S)
            sampler.sample(force=True)
            self.heartbeat()
            msg = self.c.receive(self.name, 0)
            if msg is not None and msg.get("run") == run and msg["kind"] == "stop":
                state = "stopping"
            elif ended := self._ended(run):
                state = ended
            elif time.monotonic() > deadline:
                state = "timed out"
            seq += 1
            self.c.report(run, self.name, _report(seq, state, view, sampler, kernel0, sources))
            if state != "running":
                break
        fleet.stop()
        if state == "orphaned":
            log(f"run {run}: the controller's lease lapsed; stopped")
        view = fleet.poll(0)
        sampler.sample(force=True)
        final = "stopped" if state == "stopping" else state
        self.c.report(run, self.name, _report(seq + 1, final, view, sampler, kernel0, sources))


def _report(
    seq: int,
    state: str,
    view: FleetView,
    sampler: Sampler,
    kernel0: dict[str, int],
    sources: list[str] | None = None,
) -> dict[str, Any]:
    rows = sampler.samples.get("generators", [])
    kernel = kernel_memory()
    return {
        "seq": seq,
        "state": state,
        "t": time.time(),
        "view": dataclasses.asdict(view),
        "cpu_s": rows[-1][1] / CLK_TCK if rows else 0.0,
        "rss": rows[-1][2] if rows else 0,
        "kernel": {k: kernel[k] - kernel0[k] for k in kernel0},
        "sources": sources or [],
    }


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "agent",
        help="run a share of bench runs on this machine, for a controller",
        description=(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--coordinator", required=True, metavar="URL",
        help="the Redis the controller uses: redis://host:port/db[?prefix=...]",
    )  # fmt: skip
    p.add_argument("--name", help="this agent's name (default: HOSTNAME-PID)")
    p.add_argument("--allow", action="append", metavar="NET|HOST",
                   help="an address (CIDR) or host name it may load; repeatable "
                        "(default: loopback only)")  # fmt: skip
    p.add_argument("--source", action="append", metavar="ADDRESS",
                   help="a source address of this machine for a generator process (one "
                        "per process, up to 18,000 connections each); repeatable. Needed "
                        "for a gateway that is not on loopback, where each process binds "
                        "a loopback address of its own otherwise")  # fmt: skip
    p.add_argument("--once", action="store_true", help="exit after one run")
    return p


def main(args: argparse.Namespace) -> int:
    set_log_name("bench agent")
    from gateway.net.openfiles import raise_nofile

    raise_nofile()
    try:
        coordinator = Coordinator(args.coordinator)
        coordinator.ping()
    except Exception as e:
        log(f"cannot reach the coordinator {args.coordinator}: {e}")
        return 1
    agent = Agent(
        coordinator, args.name or default_name(), args.allow or list(DEFAULT_ALLOW),
        args.source or [],
    )  # fmt: skip
    previous = signal.signal(signal.SIGTERM, _as_interrupt)
    try:
        agent.serve(once=args.once)
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        signal.signal(signal.SIGTERM, previous)
        coordinator.close()
    return 0


def _as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
