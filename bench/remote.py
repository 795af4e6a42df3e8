"""The controller's side of a run on agents (bench.agent).

- `RemoteFleet` (connect, storm): a fleet whose holder processes run on other machines,
  with the interface of the local one (bench.fleet.Fleet), so the scenarios drive
  either. The connections, the uid range, the ramp and the source addresses are split
  between the agents; `poll` sums every agent's latest report into one view.
- `RemoteWorkers` (chat, group): the driver's generator processes (bench.senders) placed
  on agents instead of spawned here. The driver keeps every decision (units, uid ranges,
  steps, rates); the agents relay its steps to the processes and the processes'
  messages, histograms included, back to it unchanged, so latencies merge exactly as
  they do from local processes.

Both wait for enough idle agents, send each its share, wait until every one is ready
and send them all `go` (the start barrier). An agent that reports an error, stops
reporting (killed, its machine gone) or stops on its own fails the run, loudly, rather
than leaving its share out of the figures; the run is then aborted and the other agents
stop. The controller holds a lease on the run while it lives: agents whose controller
died stop by themselves.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from bench.addresses import is_loopback
from bench.common import BenchError, log
from bench.coordinator import Coordinator, to_wall
from bench.fleet import MAX_PER_PROC, FleetView
from bench.senders import StepSpec, WorkerSpec

READY_WAIT_S: Final = 60.0  # from the work sent to every agent ready
STALE_S: Final = 5.0  # an agent whose report has not changed this long is taken for dead
STOP_WAIT_S: Final = 60.0
_LIVE: Final = ("ready", "running", "stopping", "stopped")  # an agent's states in a run


@dataclass
class _Agent:
    name: str
    host: str
    connections: int
    net: int
    seq: int = -1
    changed_at: float = field(default_factory=time.monotonic)
    report: dict[str, Any] | None = None
    tcp_sockets_peak: int = 0  # the most TCP sockets its network stack had in use
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, CPU s)


class _Controller:
    """What both kinds of runs on agents share: finding the agents, the run's lease,
    the start barrier, watching the agents' reports, and stopping them."""

    def __init__(self, coordinator: str, agents: int, agents_wait_s: float) -> None:
        if agents < 1:
            raise BenchError("--agents must be >= 1")
        self.c = Coordinator(coordinator)
        self.n = agents
        self.agents_wait_s = agents_wait_s
        self.run = secrets.token_hex(6)
        self.agents: list[_Agent] = []
        self._lease_stop = threading.Event()
        self._lease: threading.Thread | None = None
        self.failed: str | None = None

    def _idle_agents(self) -> list[tuple[str, str]]:
        """(name, host) of N idle agents, waiting for them up to `agents_wait_s`."""
        deadline = time.monotonic() + self.agents_wait_s
        while True:
            idle = {n: a for n, a in self.c.agents().items() if a.get("state") == "idle"}
            if len(idle) >= self.n:
                return [(n, str(idle[n].get("host", "?"))) for n in sorted(idle)[: self.n]]
            if time.monotonic() > deadline:
                raise BenchError(
                    f"{len(idle)} idle agents of the {self.n} needed registered on "
                    f"{self.c.prefix}* after {self.agents_wait_s:g} s: start "
                    f"`imgw bench agent --coordinator URL` on each load machine"
                )
            time.sleep(0.5)

    def _begin(self, shares: list[dict[str, Any]], sizes: list[int]) -> None:
        """Send agent i its work `shares[i]` (`sizes[i]`: connections or processes), wait
        until all are ready, then send them all `go`."""
        found = self._idle_agents()
        self.c.hold_run(self.run)
        self._lease = threading.Thread(target=self._hold, name="bench-run-lease", daemon=True)
        self._lease.start()
        for (name, host), share, size in zip(found, shares, sizes, strict=True):
            self.agents.append(_Agent(name, host, size, int(share.get("net", 0))))
            self.c.send(name, {"kind": "work", "run": self.run, **share})
        log(f"run {self.run} on agents {', '.join(a.name for a in self.agents)}; "
            "waiting for every one to be ready")  # fmt: skip
        deadline = time.monotonic() + READY_WAIT_S
        while True:
            reports = self.c.reports(self.run, [a.name for a in self.agents])
            for name, r in reports.items():
                if r is not None and r.get("state") == "error":
                    self._fail(f"agent {name} refused the run: {r.get('error')}")
            if all(r is not None for r in reports.values()):
                break
            if time.monotonic() > deadline:
                late = [n for n, r in reports.items() if r is None]
                self._fail(f"agents {', '.join(late)} not ready after {READY_WAIT_S:g} s")
            time.sleep(0.1)
        for a in self.agents:  # the start barrier
            self.c.send(a.name, {"kind": "go", "run": self.run})
        now = time.monotonic()
        for a in self.agents:
            a.changed_at = now

    def _hold(self) -> None:
        while not self._lease_stop.wait(1.0):
            try:
                self.c.hold_run(self.run)
            except Exception as e:  # the next renewal may get through
                log(f"renewing the run's lease failed: {e}")

    def _fail(self, why: str) -> None:
        self.failed = why
        raise BenchError(why)

    def _watch(self) -> dict[str, dict[str, Any] | None]:
        """Read every agent's latest report; fail the run if one erred, stopped on its
        own or went silent. The reports, by agent."""
        now = time.monotonic()
        reports = self.c.reports(self.run, [a.name for a in self.agents])
        for a in self.agents:
            r = reports[a.name]
            if r is not None and r.get("seq", 0) != a.seq:
                a.seq, a.report, a.changed_at = r.get("seq", 0), r, now
                if "cpu_s" in r:
                    a.cpu.append((now, float(r["cpu_s"])))
                sockets = int(r.get("kernel", {}).get("tcp_sockets", 0))
                a.tcp_sockets_peak = max(a.tcp_sockets_peak, sockets)
            r = a.report
            if r is not None and r.get("state") == "error":
                self._fail(f"agent {a.name} failed: {r.get('error')}")
            if r is not None and r.get("state") not in _LIVE:
                self._fail(f"agent {a.name} stopped on its own: {r.get('state')}")
            if now - a.changed_at > STALE_S:
                alive = self.c.alive([a.name])[a.name]
                self._fail(
                    f"agent {a.name} ({a.host}) sent no report for {now - a.changed_at:.0f} s"
                    + ("" if alive else ", and its registration lapsed: it died")
                )
        return {a.name: a.report for a in self.agents}

    def _stop_agents(self) -> None:
        if not self.agents:
            self.c.close()
            return
        if self.failed:
            self.c.abort(self.run, self.failed)
        for a in self.agents:
            self.c.send(a.name, {"kind": "stop", "run": self.run})
        deadline = time.monotonic() + STOP_WAIT_S
        waiting = {a.name for a in self.agents}
        while waiting and time.monotonic() < deadline:
            for name, r in self.c.reports(self.run, sorted(waiting)).items():
                if r is None or r.get("state") not in ("ready", "running", "stopping"):
                    waiting.discard(name)
                    agent = next(a for a in self.agents if a.name == name)
                    agent.report = r or agent.report
            time.sleep(0.2)
        if waiting:
            log(f"agents {', '.join(sorted(waiting))} did not confirm the stop")
        self._lease_stop.set()
        self.c.end_run(self.run)
        self.c.drop_output(self.run)
        self.c.close()


class RemoteFleet(_Controller):
    """A fleet of `agents` agents found through `coordinator`; `fleet` is what a local
    Fleet would be given (connections, per_proc, ramp, hb_s, ... timeout_s)."""

    def __init__(self, coordinator: str, agents: int, agents_wait_s: float, **fleet: Any) -> None:
        if int(fleet["per_proc"]) > MAX_PER_PROC:
            raise BenchError(f"--per-proc must be <= {MAX_PER_PROC} (20,000 files a process)")
        super().__init__(coordinator, agents, agents_wait_s)
        self.fleet = fleet
        self.connections = int(fleet["connections"])
        self.shares = [self.connections // agents] * agents
        for i in range(self.connections % agents):
            self.shares[i] += 1
        per_proc = int(fleet["per_proc"])
        self.procs_n = sum(max(1, math.ceil(n / per_proc)) for n in self.shares)
        self.base_net = 100 + secrets.randbelow(150 - agents)

    def src_ip(self, i: int) -> str:
        return f"127.{self.base_net}.{i // 250}.{1 + i % 250}"

    def sources_text(self, host: str) -> str:
        if is_loopback(host):
            return f"on {self.n} agents, from 127.{self.base_net}.0.0/16 and up"
        return f"on {self.n} agents, from each agent's own --source addresses"

    def pids(self) -> list[int]:
        return []  # the generators run on the agents' machines: they report their CPU

    def start(self, host: str, port: int, kid: str, secret: str, uid0: int) -> None:
        shares: list[dict[str, Any]] = []
        for i, n in enumerate(self.shares):
            fleet = {**self.fleet, "connections": n, "net": self.base_net + i,
                     "ramp": float(self.fleet["ramp"]) * n / self.connections}  # fmt: skip
            share = {"host": host, "port": port, "kid": kid, "secret": secret, "uid0": uid0,
                     "fleet": fleet}  # fmt: skip
            shares.append({"share": share, "net": self.base_net + i})
            uid0 += n
        self._begin(shares, self.shares)

    def poll(self, wait_s: float) -> FleetView:
        if wait_s > 0:
            time.sleep(wait_s)
        view = FleetView()
        for r in self._watch().values():
            if r is not None and "view" in r:
                _add(view, r["view"])
        return view

    def cpu_seconds(self, t0: float, t1: float) -> float | None:
        """The agents' generator CPU seconds between their first report at or after `t0`
        and their last at or before `t1` (controller time), summed."""
        total = 0.0
        for a in self.agents:
            rows = [c for t, c in a.cpu if t0 <= t <= t1]
            if len(rows) < 2:
                return None
            total += rows[-1] - rows[0]
        return total

    def stop(self) -> None:
        self._stop_agents()

    def results(self) -> list[dict[str, Any]]:
        """One entry per agent for the result's `agents` key: its share and what it
        reported last. Kernel memory is a machine's, whatever the network namespace:
        agents on one host divide it among all their connections."""
        out: list[dict[str, Any]] = []
        on_host: dict[str, int] = {}
        for a in self.agents:
            held = int((a.report or {}).get("view", {}).get("held", 0))
            on_host[a.host] = on_host.get(a.host, 0) + held
        for a in self.agents:
            r = a.report or {}
            v = r.get("view", {})
            held = int(v.get("held", 0))
            kernel = r.get("kernel", {})
            out.append({
                "name": a.name, "host": a.host, "sources": r.get("sources", []),
                "connections_target": a.connections, "connections_held": held,
                "logins": v.get("logins"), "drops": v.get("drops"),
                "errors": sum(v.get("errors", {}).values()), "state": r.get("state"),
                "generator_rss_bytes": r.get("rss"),
                "generator_rss_per_conn_bytes": _per(r.get("rss"), v.get("rss_baseline"), held),
                "generator_cpu_s": r.get("cpu_s"),
                "kernel_slab_per_conn_bytes": _per(kernel.get("slab"), 0, on_host[a.host]),
                "kernel_tcp_buffers_per_conn_bytes":
                    _per(kernel.get("tcp_buffers"), 0, on_host[a.host]),
                "tcp_sockets_peak": a.tcp_sockets_peak,
            })  # fmt: skip
        return out


def _per(total: int | None, base: int | None, n: int) -> int | None:
    if total is None or base is None or n <= 0:
        return None
    return round((total - base) / n)


def _add(view: FleetView, v: dict[str, Any]) -> None:
    """Add one agent's view to the sum."""
    for name in ("started", "held", "logins", "drops", "rss", "rss_baseline", "gave_up",
                 "pongs", "syncs", "unavailable_over_2"):  # fmt: skip
        setattr(view, name, getattr(view, name) + int(v.get(name, 0)))
    for name in ("errors", "kicks"):
        mine: dict[str, int] = getattr(view, name)
        for k, n in v.get(name, {}).items():
            mine[k] = mine.get(k, 0) + int(n)
    view.unavailable_max = max(view.unavailable_max, int(v.get("unavailable_max", 0)))


class RemoteWorkers(_Controller):
    """The generator processes of a chat or group run (bench.senders), on `agents`
    agents: the interface of bench.send.LocalWorkers."""

    def __init__(self, coordinator: str, agents: int, agents_wait_s: float) -> None:
        super().__init__(coordinator, agents, agents_wait_s)
        self.placement: list[str] = []  # process index -> the agent running it
        self._last_watch = 0.0

    @property
    def count(self) -> int:
        return len(self.placement)

    def start(self, specs: list[WorkerSpec]) -> None:
        """Place the processes on the agents, contiguous and as even as can be (a run
        with fewer processes than agents uses fewer agents)."""
        if len(specs) < self.n:
            raise BenchError(
                f"{len(specs)} generator processes cannot spread over {self.n} agents: "
                f"give --procs {self.n} or more"
            )
        groups: list[list[WorkerSpec]] = [[] for _ in range(self.n)]
        for i, spec in enumerate(specs):
            groups[i * self.n // len(specs)].append(spec)
        shares = [
            {
                "workers": [
                    {**dataclasses.asdict(s), "deadline_ns": to_wall(s.deadline_ns)} for s in group
                ]
            }
            for group in groups
        ]
        self._begin(shares, [len(g) for g in groups])
        for agent, group in zip(self.agents, groups, strict=True):
            self.placement.extend(agent.name for _ in group)

    def get(self, wait_s: float) -> tuple[Any, ...]:
        """The next message of any process (queue.Empty after `wait_s`)."""
        now = time.monotonic()
        if now - self._last_watch >= 1.0:
            self._last_watch = now
            self._watch()
        raw = self.c.collect(self.run, wait_s)
        if raw is None:
            raise queue.Empty
        return tuple(msgpack.unpackb(raw))

    def step(self, i: int, step: StepSpec) -> None:
        wall = {**dataclasses.asdict(step)}
        for name in ("start_ns", "win_start_ns", "win_end_ns"):
            wall[name] = to_wall(wall[name])
        self.c.send(self.placement[i], {"kind": "step", "run": self.run, "idx": i, "step": wall})

    def check_alive(self) -> None:
        self._watch()

    def results(self) -> list[dict[str, Any]]:
        """One entry per agent for the result's `agents` key."""
        return [
            {"name": a.name, "host": a.host, "generator_processes": a.connections,
             "state": (a.report or {}).get("state"),
             "generator_rss_bytes": (a.report or {}).get("rss"),
             "generator_cpu_s": (a.report or {}).get("cpu_s")}
            for a in self.agents
        ]  # fmt: skip

    def stop(self, clean: bool) -> None:
        self._stop_agents()


class RemoteOffline(_Controller):
    """An offline run's parts (bench.offline.OfflineShare) on `agents` agents: each gets
    an even share of the receivers and a disjoint uid range, and runs each phase when
    `phase` starts it on all of them at once."""

    def __init__(self, coordinator: str, agents: int, agents_wait_s: float) -> None:
        super().__init__(coordinator, agents, agents_wait_s)
        self.receivers: list[int] = []

    def start(
        self, host: str, port: int, kid: str, secret: str, uid0: int, receivers: int,
        messages: int, timeout_s: float,
    ) -> None:  # fmt: skip
        if receivers < self.n:
            raise BenchError(f"--agents {self.n} needs --receivers {self.n} or more")
        self.receivers = [receivers // self.n] * self.n
        for i in range(receivers % self.n):
            self.receivers[i] += 1
        shares: list[dict[str, Any]] = []
        for n in self.receivers:
            part = {"host": host, "port": port, "kid": kid, "secret": secret, "uid0": uid0,
                    "receivers": n, "messages": messages}  # fmt: skip
            shares.append({"offline": part, "timeout_s": timeout_s})
            uid0 += 2 * n
        self._begin(shares, self.receivers)

    def phase(self, name: str) -> list[dict[str, Any]]:
        """Start phase `name` on every agent at once; what each reported of it, by agent,
        once all have (the run fails if one errs or goes silent meanwhile)."""
        for a in self.agents:
            self.c.send(a.name, {"kind": "step", "run": self.run, "phase": name})
        while True:
            reports = self._watch()
            done = [((r or {}).get("phases") or {}).get(name) for r in reports.values()]
            if all(d is not None for d in done):
                return [d for d in done if d is not None]
            time.sleep(0.1)

    def results(self) -> list[dict[str, Any]]:
        """One entry per agent for the result's `agents` key."""
        out: list[dict[str, Any]] = []
        for a, n in zip(self.agents, self.receivers, strict=True):
            r = a.report or {}
            phases = r.get("phases") or {}
            caught = phases.get("catch_up") or {}
            out.append({
                "name": a.name, "host": a.host, "receivers": n, "state": r.get("state"),
                "acked": (phases.get("send") or {}).get("acked"),
                "messages_pulled": caught.get("pulled"), "missing": caught.get("missing"),
                "duplicates": caught.get("duplicates"),
                "generator_rss_bytes": r.get("rss"), "generator_cpu_s": r.get("cpu_s"),
            })  # fmt: skip
        return out

    def stop(self) -> None:
        self._stop_agents()
