"""A run's outputs: the JSON result, PNG charts (connections over time, gateway memory,
latency percentiles) and a short report a person can read, all side by side:
`PATH.json`, `PATH-connections.png`, `PATH-memory.png`, `PATH-latency.png`, `PATH.md`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import log

MIB = 2**20


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {path}")


def charts(stem: Path, result: dict[str, Any]) -> list[str]:
    """Draw what the result holds; the files written. Needs matplotlib (in imgw[dev])."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no charts (pip install matplotlib)")
        return []
    written: list[str] = []
    timeline = result.get("timeline") or []
    title = f"imgw bench {result['scenario']}"
    if timeline:
        t = [p["t"] for p in timeline]
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot(t, [p["held"] for p in timeline], label="connections held")
        if any(p.get("drops") for p in timeline):
            ax.plot(t, [p["drops"] for p in timeline], label="drops (cumulative)")
        written.append(
            _save(fig, ax, plt, stem, "connections", "seconds", "connections",
                  f"{title}: connections over time")
        )  # fmt: skip
        fig, ax = plt.subplots(figsize=(8, 4))
        gw = [(p["t"], p["gateway_rss_bytes"] / MIB) for p in timeline if p["gateway_rss_bytes"]]
        if gw:
            ax.plot([x for x, _ in gw], [y for _, y in gw], label="gateway RSS (all workers)")
        ax.plot(t, [p["generator_rss_bytes"] / MIB for p in timeline], label="generators RSS")
        written.append(_save(fig, ax, plt, stem, "memory", "seconds", "MiB", f"{title}: memory"))
    steps = result.get("steps") or []
    if steps and "ack_p50_ms" in steps[0]:
        fig, ax = plt.subplots(figsize=(8, 4))
        rates = [s["rate_target"] for s in steps]
        for key, label in (
            ("ack_p50_ms", "send→ACK p50"), ("ack_p99_ms", "send→ACK p99"),
            ("push_p50_ms", "send→PUSH p50"), ("push_p99_ms", "send→PUSH p99"),
        ):  # fmt: skip
            ax.plot(rates, [max(s[key], 1e-3) for s in steps], marker="o", label=label)
        ax.axhline(50, color="grey", linestyle="--", linewidth=1, label="50 ms")
        ax.set_yscale("log")
        written.append(
            _save(fig, ax, plt, stem, "latency", "offered msg/s", "ms (log)",
                  f"{title}: latency percentiles")
        )  # fmt: skip
    return written


def _save(
    fig: Any, ax: Any, plt: Any, stem: Path, name: str, xlabel: str, ylabel: str, title: str
) -> str:
    """Label, title and grid the axes, write `<stem>-<name>.png`; its path."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    path = stem.parent / f"{stem.name}-{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def _b(n: Any) -> str:
    return "-" if n is None else f"{n:,} B"


CPU_FIGURES = (
    ("gateway_cpu_us_per_msg", "gateway per acked message"),
    ("gateway_cpu_us_per_push", "gateway per push"),
    ("mariadb_cpu_us_per_msg", "MariaDB per message"),
    ("redis_cpu_us_per_msg", "Redis per message"),
    ("loadgen_cpu_us_per_msg", "generators per message"),
    ("gateway_cpu_us_per_login", "gateway per login"),
    ("gateway_cpu_us_per_ping", "gateway per PING"),
    ("generator_cpu_us_per_ping", "generators per PING (and its PONG)"),
    ("gateway_cpu_us_per_sync", "gateway per SYNC"),
    ("gateway_cpu_us_per_catch_up", "gateway per receiver caught up"),
)


def _cpu_lines(result: dict[str, Any]) -> list[str]:
    got = [f"{label} {result[k]:g}" for k, label in CPU_FIGURES if result.get(k) is not None]
    lines = [f"- CPU µs per operation: {', '.join(got)}"] if got else []
    kernel = result.get("gateway_kernel_percent_hold", result.get("gateway_kernel_percent"))
    if kernel is not None:
        lines.append(f"- the gateway's CPU in the kernel (socket system calls): {kernel:g} %")
    return lines


def summary(result: dict[str, Any]) -> str:
    """A few lines a person can read."""
    s = result["scenario"]
    lines = [f"# imgw bench {s}", "", f"`{' '.join(result.get('command', []))}`", ""]
    lines.append(f"- gateway: {result.get('gateway_workers', '?')} worker(s), backend "
                 f"{result.get('backend', {})}, transport "
                 f"{result.get('transport', 'tcp')}")  # fmt: skip
    lines.append(f"- status: {result.get('error') or 'ok'}")
    if result.get("last_view"):
        lines.append(f"- last view of the generators: {result['last_view']}")
    if s in ("connect", "storm"):
        lines.append(
            f"- connections: target {result.get('connections_target') or 0:,}, held "
            f"{result.get('connections_held') or 0:,} (minimum over the hold), drops "
            f"{result.get('drops')}, errors {result.get('errors')}"
        )
    if s == "connect":
        lines.append(
            f"- memory per connection: gateway {_b(result.get('gateway_rss_per_conn_bytes'))} "
            f"above its idle baseline ({_b(result.get('gateway_rss_total_per_conn_bytes'))} "
            f"including it; PSS, shared pages once: "
            f"{_b(result.get('gateway_pss_total_per_conn_bytes'))}), generator "
            f"{_b(result.get('generator_rss_per_conn_bytes'))}, kernel "
            f"slab {_b(result.get('kernel_slab_per_conn_bytes'))} (both socket ends)"
        )
        lines.append(f"- ramp took {result.get('ramp_s')} s at {result.get('ramp_per_s')}/s")
    if s == "storm":
        lines.append(
            f"- {result.get('how')}: gateway back after {result.get('gateway_restart_s')} s; "
            f"all clients back and synced after {result.get('recovery_s')} s "
            f"({result.get('relogins')} logins; backoff {result.get('reconnect_backoff')}); "
            f"unavailable at most {result.get('told_unavailable_max')} times to one client, "
            f"more than twice to {result.get('clients_told_unavailable_over_2')}"
        )
        lines.append(
            f"- handshakes dropped on full accept queues (machine-wide, retried by the "
            f"clients' kernels after 1, 3, 7 s): {result.get('listen_overflows')} "
            f"(gateway backlog 4,096, net.core.somaxconn {result.get('somaxconn')})"
        )
    if s in ("chat", "group"):
        lines.append(
            f"- highest rate with p99 send→ACK ≤ 50 ms: {result.get('max_rate_p99_le_50ms')}"
        )
        for st in result.get("steps", []):
            lines.append(
                f"  - {st['rate_target']:g} msg/s: acked/s {st['acked_per_s']}, ack p50/p99 "
                f"{st['ack_p50_ms']}/{st['ack_p99_ms']} ms, push p50/p99 "
                f"{st['push_p50_ms']}/{st['push_p99_ms']} ms, errors {st['errors']}"
            )
    if s == "offline":
        lines.append(
            f"- {result.get('receivers')} receivers caught up on "
            f"{result.get('messages_per_receiver')} messages each: p50 "
            f"{result.get('catch_up_p50_ms')} ms, p99 {result.get('catch_up_p99_ms')} ms; "
            f"missing {result.get('missing')}, duplicates {result.get('duplicates')}"
        )
    if result.get("preload"):
        pre = result["preload"]
        lines.append(
            f"- preloaded {pre['messages']:,} messages in {pre['conversations']:,} "
            f"conversations ({pre['seconds']} s) before measuring"
        )
    if result.get("volume_ratio"):
        from bench.volume import lines as volume_lines

        lines.extend(volume_lines(result["volume_ratio"]))
    if result.get("push"):
        from bench.push_sink import lines as push_lines

        lines.extend(push_lines(result["push"]))
    lines.extend(_cpu_lines(result))
    if cal := (result.get("machine") or {}).get("calibration"):
        b, a = cal["before"], cal["after"]
        lines.append(
            f"- machine speed (bench.calibrate; compare runs only at like speeds): a Python "
            f"loop step {b['python_loop_ns']} ns before, {a['python_loop_ns']} ns after; a "
            f"loopback send+recv {b['loopback_rtt_us']} µs before, {a['loopback_rtt_us']} "
            f"µs after"
        )
    lines.append(f"- gateway RSS {_b(result.get('gateway_rss_bytes'))}, pids "
                 f"{len(result.get('gateway_pids') or [])}")  # fmt: skip
    for chart in result.get("charts", []):
        lines.append(f"- chart: {Path(chart).name}")
    return "\n".join(lines) + "\n"
