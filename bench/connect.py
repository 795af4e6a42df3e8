"""`imgw bench connect` and `imgw bench storm`.

connect: ramp `--connections` logged-in connections at `--ramp` per second, hold them
for `--hold` seconds with heartbeats every `--hb` seconds, count every connection that
drops, and measure memory per connection: the gateway's RSS above its idle baseline,
the generators' RSS, and the kernel's (slab and TCP buffers, both socket ends on this
host).

storm: ramp and hold the same way (each login followed by a SYNC), then kill the
gateway (`--how kill`, SIGKILL: a crash) or restart it (`--how restart`, SIGTERM: a
drain), start it again on the same port, and measure the time until every client has
reconnected, logged in and synced, with the full-jitter backoff the clients used.

Both over the plain protocol or, with `--transport ws`, over WebSocket (bench.wsclient).
"""

from __future__ import annotations

import argparse
import math
import secrets
import time
from typing import Any

from bench.common import (
    BenchError,
    Gateway,
    Sampler,
    kernel_memory,
    log,
    proc_pss,
    somaxconn,
    tcp_ext,
)
from bench.fleet import Fleet, FleetView, gateway_alive, progress_line
from bench.preload import PRELOAD_UID0
from bench.remote import RemoteFleet
from bench.run import Run

UID_SPAN = 10_000_000


def _per_conn(total: int | None, base: int | None, n: int) -> int | None:
    if total is None or base is None or n <= 0:
        return None
    return round((total - base) / n)


def ramp_up(
    run: Run, fleet: Fleet | RemoteFleet, target: int, phase: str, timeout_s: float, t0: float
) -> tuple[FleetView, float]:
    """Wait until `target` connections are held, or held or given up after every try
    (or time runs out); the view and the seconds it took."""
    started = time.monotonic()
    last_logins, last_t = 0, started
    view = fleet.poll(0)
    while time.monotonic() - started < timeout_s:
        view = run.view = fleet.poll(1.0)
        run.sample()
        gateway_alive(run.gateway)
        now = time.monotonic()
        rate = (view.logins - last_logins) / max(1e-3, now - last_t)
        last_logins, last_t = view.logins, now
        run.timeline.append(run.point(now, view))
        progress_line(phase, now - t0, view, target, rate, run.sampler)
        if view.held >= target:
            break
        if view.gave_up and view.held + view.gave_up >= target:
            log(f"{view.gave_up} connections failed every try; going on without them")
            break
    return view, time.monotonic() - started


def make_fleet(args: argparse.Namespace, **fleet: Any) -> Fleet | RemoteFleet:
    """The generators of a connect or storm run: processes here, or with `--agents N`
    processes on N agents (bench.agent)."""
    if getattr(args, "agents", 0):
        return RemoteFleet(args.coordinator, args.agents, args.agents_wait, **fleet)
    return Fleet(**fleet)


def generator_cpu_us_per(
    run: Run, fleet: Fleet | RemoteFleet, t0: float, t1: float, ops: int
) -> float | None:
    """The generators' CPU µs per operation over [t0, t1]: sampled here, or as the
    agents reported it."""
    if isinstance(fleet, RemoteFleet):
        cpu = fleet.cpu_seconds(t0, t1)
        return round(1e6 * cpu / ops, 1) if cpu is not None and ops > 0 else None
    return cpu_us_per(run, t0, t1, ops, "generators")


def cpu_us_per(run: Run, t0: float, t1: float, ops: int, group: str = "gateway") -> float | None:
    """The CPU µs per operation of `group` (the gateway's processes, or the generators')
    over [t0, t1] (force-sampled at both ends)."""
    cpu = run.sampler.cpu_seconds(group, t0, t1)
    return round(1e6 * cpu / ops, 1) if cpu is not None and ops > 0 else None


def hold(
    run: Run, fleet: Fleet | RemoteFleet, seconds: float, target: int, t0: float
) -> dict[str, Any]:
    """Hold for `seconds`; the minimum held, the drops, memory at the end, and the
    gateway's CPU per PING answered meanwhile."""
    view = fleet.poll(0.5)
    t_start = time.monotonic()
    run.sample(force=True)
    drops0, pongs0 = view.drops, view.pongs
    held_min = view.held
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        view = run.view = fleet.poll(min(1.0, max(0.0, until - time.monotonic())))
        run.sample()
        gateway_alive(run.gateway)
        held_min = min(held_min, view.held)
        now = time.monotonic()
        run.timeline.append(run.point(now, view))
        progress_line("hold", now - t0, view, target, 0, run.sampler)
    run.sample(force=True)
    pongs = view.pongs - pongs0
    t_end = time.monotonic()
    return {
        "pings": pongs,
        "cpu_us_per_ping": cpu_us_per(run, t_start, t_end, pongs),
        "kernel_percent": run.sampler.kernel_percent("gateway", t_start, t_end),
        "generator_cpu_us_per_ping": generator_cpu_us_per(run, fleet, t_start, t_end, pongs),
        "view": view,
        "held_min": held_min,
        "drops": view.drops - drops0,
        "gateway_rss": run.sampler.latest_rss("gateway"),
        "gateway_pss": gateway_pss(run),
        "kernel": kernel_memory(),
    }


def gateway_pss(run: Run) -> int | None:
    if run.gateway is None:
        return None
    return sum(proc_pss(p) or 0 for p in run.gateway.pids()) or None


def run_connect(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    n = args.connections
    fleet = make_fleet(
        args, connections=n, per_proc=args.per_proc, ramp=args.ramp, hb_s=args.hb,
        sock_buf=args.sock_buf, tls=args.tls, timeout_s=args.timeout, ws_path=run.ws_path,
    )  # fmt: skip
    result: dict[str, Any] = {
        "connections_target": n, "ramp_per_s": args.ramp, "hold_s": args.hold,
        "heartbeat_s": args.hb, "generator_procs": fleet.procs_n, "tls": args.tls,
    }  # fmt: skip
    run.sample(force=True)
    base_rss = run.sampler.latest_rss("gateway")
    base_pss = gateway_pss(run)
    base_kernel = kernel_memory()
    t0 = time.monotonic()
    run.t0 = t0
    run.sample(force=True)
    log(
        f"ramping {n:,} connections at {args.ramp:,.0f}/s from {fleet.procs_n} generator "
        f"processes ({fleet.sources_text(run.host)}), heartbeat every {args.hb} s"
    )
    fleet.start(run.host, run.port, run.kid, run.secret, uid0=_uid0())
    # The generators' CPU per PING too: on loopback each side pays for the other end's
    # TCP receive path, and at a million connections they need as much as the gateway.
    run.sampler.watch("generators", fleet.pids)
    try:
        ramp_s = n / args.ramp + 60 + n / 5_000
        view, took = ramp_up(run, fleet, n, "ramp", ramp_s, t0)
        result["ramp_s"] = round(took, 1)
        run.sample(force=True)
        result["logins"] = view.logins
        result["gateway_cpu_us_per_login"] = cpu_us_per(run, t0, time.monotonic(), view.logins)
        result["connections_reached"] = view.held
        if view.held < n:
            log(f"only {view.held:,} of {n:,} connections held after {took:.0f} s; holding those")
        log(f"holding {view.held:,} connections for {args.hold:g} s")
        h = hold(run, fleet, args.hold, n, t0)
        result["pings_answered"] = h["pings"]
        result["gateway_cpu_us_per_ping"] = h["cpu_us_per_ping"]
        result["gateway_kernel_percent_hold"] = h["kernel_percent"]
        result["generator_cpu_us_per_ping"] = h["generator_cpu_us_per_ping"]
        gen_rss, gen_base = h["view"].rss, h["view"].rss_baseline
    finally:
        fleet.stop()
        if isinstance(fleet, RemoteFleet):
            result["agents"] = fleet.results()
    # Memory was sampled at the end of the hold: per connection held at that moment.
    held = h["view"].held
    kernel = {k: h["kernel"][k] - base_kernel[k] for k in base_kernel}
    result.update(
        connections_held=h["held_min"],
        connections_held_at_end=held,
        drops=h["drops"],
        errors=h["view"].error_count,
        errors_by_kind=h["view"].errors,
        kicks=h["view"].kicks,
        gateway_rss_bytes=h["gateway_rss"],
        gateway_rss_baseline_bytes=base_rss,
        gateway_rss_per_conn_bytes=_per_conn(h["gateway_rss"], base_rss, held),
        gateway_rss_total_per_conn_bytes=_per_conn(h["gateway_rss"], 0, held),
        gateway_pss_bytes=h["gateway_pss"],
        gateway_pss_baseline_bytes=base_pss,
        gateway_pss_total_per_conn_bytes=_per_conn(h["gateway_pss"], 0, held),
        generator_rss_bytes=gen_rss,
        generator_rss_per_conn_bytes=_per_conn(gen_rss, gen_base, held),
        generator_rss_total_per_conn_bytes=_per_conn(gen_rss, 0, held),
        kernel_slab_per_conn_bytes=_per_conn(kernel["slab"], 0, held),
        kernel_tcp_buffers_per_conn_bytes=_per_conn(kernel["tcp_buffers"], 0, held),
    )
    return result


def run_storm(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    n = args.connections
    fleet = make_fleet(
        args, connections=n, per_proc=args.per_proc, ramp=args.ramp, hb_s=args.hb, sync=True,
        reconnect=True, backoff_base_s=args.backoff_base, backoff_cap_s=args.backoff_cap,
        sock_buf=args.sock_buf, tls=args.tls, timeout_s=args.timeout,
        keep_since=not args.fresh_sync, pipeline_sync=not args.sync_after_login_ok,
        ws_path=run.ws_path,
    )  # fmt: skip
    result: dict[str, Any] = {
        "connections_target": n, "how": args.how, "sync_since": "0" if args.fresh_sync else "kept",
        "sync_sent": "after LOGIN_OK" if args.sync_after_login_ok else "with LOGIN",
        "reconnect_backoff": {"base_s": args.backoff_base, "cap_s": args.backoff_cap,
                              "jitter": "full"},
    }  # fmt: skip
    gw = run.gateway
    assert gw is not None and gw.proc is not None, "storm needs --spawn-gateway"
    result["somaxconn"] = somaxconn()
    t0 = run.t0 = time.monotonic()
    # With --preload the clients are the preloaded users, each in two conversations with
    # messages: their first SYNC lists them, and a SYNC after the storm has work to do.
    uid0 = _uid0()
    if run.preloaded is not None:
        users = int(run.preloaded["users"])
        if users < n:
            raise BenchError(f"--preload-convs {users - 1:,} makes {users:,} users: fewer "
                             f"than --connections {n:,}")  # fmt: skip
        uid0 = PRELOAD_UID0
    fleet.start(run.host, run.port, run.kid, run.secret, uid0=uid0)
    try:
        view, took = ramp_up(run, fleet, n, "ramp", 3 * n / args.ramp + 120, t0)
        if view.held < n:
            raise_short(view, n, took)
        view = hold(run, fleet, args.settle, n, t0)["view"]
        result["gateway_pids_before"] = gw.pids()
        logins_before = view.logins
        log(f"{view.held:,} held and synced; {args.how} the gateway now")
        overflows_before = tcp_ext("ListenOverflows")
        storm_t = time.monotonic()
        if args.how == "kill":
            gw.kill()
        else:
            gw.stop(timeout=args.timeout)
        down_s = time.monotonic() - storm_t
        gw.start(timeout=120)
        run.wait_ws_listener()
        t_up = time.monotonic()
        run.sample(force=True)
        up_s = t_up - storm_t
        syncs_before = view.syncs
        log(f"gateway back after {up_s:.1f} s; waiting for every client")
        deadline = max(120.0, 3 * args.backoff_cap + n / 500)
        view, _ = ramp_up(run, fleet, n, "storm", deadline, t0)
        recovered_s = time.monotonic() - storm_t
        overflows = tcp_ext("ListenOverflows")
        if overflows is not None and overflows_before is not None:
            # machine-wide: handshakes dropped on full accept queues (clients retry them)
            result["listen_overflows"] = overflows - overflows_before
        run.sample(force=True)
        # Every reconnect is a login and a SYNC: CPU per pair, on the restarted gateway.
        result["syncs"] = view.syncs - syncs_before
        result["gateway_cpu_us_per_sync"] = cpu_us_per(
            run, t_up, time.monotonic(), view.syncs - syncs_before
        )
        result["gateway_pids"] = gw.pids()
    finally:
        fleet.stop()
        if isinstance(fleet, RemoteFleet):
            result["agents"] = fleet.results()
    result.update(
        connections_held=view.held,
        recovered=view.held >= n,
        drops=view.drops,
        errors=view.error_count,
        errors_by_kind=view.errors,
        kicks=view.kicks,
        relogins=view.logins - logins_before,
        gateway_down_s=round(down_s, 2),
        gateway_restart_s=round(up_s, 2),
        recovery_s=round(recovered_s, 2) if view.held >= n else None,
        told_unavailable_max=view.unavailable_max,  # per client, over the run
        clients_told_unavailable_over_2=view.unavailable_over_2,
        gateway_rss_bytes=run.sampler.latest_rss("gateway"),
        generator_rss_per_conn_bytes=_per_conn(view.rss, view.rss_baseline, max(1, view.held)),
    )
    result["gateway_rss_per_conn_bytes"] = _per_conn(result["gateway_rss_bytes"], 0, n)
    return result


def raise_short(view: FleetView, n: int, took: float) -> None:
    from bench.common import BenchError

    raise BenchError(
        f"only {view.held:,} of {n:,} connections held after {took:.0f} s "
        f"(errors: {view.errors or 'none'})"
    )


def _uid0() -> int:
    return (secrets.randbelow(1000) + 1) * UID_SPAN * 10


def default_workers(connections: int, production: bool) -> int:
    """Enough gateway workers that none holds more than ~16,000 connections (20,000
    files a process here)."""
    return max(1, math.ceil(connections / 16_000)) if production else 1


__all__ = ["Gateway", "Sampler", "default_workers", "run_connect", "run_storm"]
