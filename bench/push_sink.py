"""A push-event sink that acknowledges everything, for measuring what push events cost
the gateway (`--push-url`, gateway/hooks/push.py) and how soon they arrive:
`imgw bench chat --push-sink` starts one (`SinkProcess`), or run it alone.

An aiohttp server in its own process, on uvloop, keeping connections alive and logging
no requests: every `POST /push` with the documented body (`{"node": …, "events":
[...]}`) is answered 200; anything else 400. It tallies each event as it arrives: the
events and the distinct event ids (sinks deduplicate by `id`), their recipients, and,
for the events of messages committed inside the measured window, the latency from the
message's `server_ms` to the sink's receive time (one host, one wall clock) in an
HdrHistogram. `POST /window {"start_ms": …, "end_ms": …}` starts a new tally for a
window of wall-clock ms; `GET /stats` answers the tally so far.

    python -m bench.push_sink --port 18778 &
    imgw serve ... --push-url http://127.0.0.1:18778/push
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any, Final

from bench.common import BenchError, log, ms, new_hist, record_us
from bench.serve import free_port

PATH: Final = "/push"
PUSH_DEVICE: Final = "bench-push"  # the device each bench uid registers, then leaves offline
# Goals the comparison reports against (docs/performance.md, "Push events").
CPU_RATIO_GOAL: Final = 1.15
EVENT_P99_GOAL_MS: Final = 2_000.0
WAIT_S: Final = 30.0  # after a step: how long the sink may take to get every event


class Tally:
    """What the sink received since the window was set."""

    def __init__(self, start_ms: float = 0.0, end_ms: float = 0.0) -> None:
        self.start_ms, self.end_ms = start_ms, end_ms
        self.posts = 0
        self.events = 0
        self.ids: set[str] = set()
        self.recipients = 0
        self.received_in_window = 0  # events that arrived inside the window
        self.latency = new_hist()  # of events whose server_ms is inside the window
        self.last_ms = 0.0

    def add(self, events: list[dict[str, Any]], now_ms: float) -> None:
        self.posts += 1
        self.events += len(events)
        self.last_ms = now_ms
        start, end = self.start_ms, self.end_ms
        if start <= now_ms < end:
            self.received_in_window += len(events)
        for e in events:
            self.ids.add(e["id"])
            self.recipients += len(e["recipients"])
            server_ms = e["server_ms"]
            if start <= server_ms < end:
                record_us(self.latency, int((now_ms - server_ms) * 1e6))

    def stats(self) -> dict[str, Any]:
        window_s = (self.end_ms - self.start_ms) / 1000
        h = self.latency
        return {
            "posts": self.posts,
            "events": self.events,
            "distinct": len(self.ids),
            "recipients": self.recipients,
            "events_per_s": round(self.received_in_window / window_s, 1) if window_s > 0 else None,
            "window_events": h.get_total_count(),
            "latency_p50_ms": ms(h, 50),
            "latency_p99_ms": ms(h, 99),
            "latency_max_ms": ms(h),
            "last_ms": self.last_ms,
        }


async def serve(host: str, port: int) -> Tally:
    """Serve until SIGINT or SIGTERM; the last window's tally."""
    from aiohttp import web

    state = {"tally": Tally()}

    async def push(request: web.Request) -> web.Response:
        body = await request.read()
        now_ms = time.time() * 1000
        try:
            events = json.loads(body)["events"]
            state["tally"].add(events, now_ms)
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text='expected {"events": [...]}\n')
        return web.Response()

    async def window(request: web.Request) -> web.Response:
        try:
            w = json.loads(await request.read())
            state["tally"] = Tally(float(w["start_ms"]), float(w["end_ms"]))
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text='expected {"start_ms": …, "end_ms": …}\n')
        return web.Response()

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(state["tally"].stats())

    app = web.Application()
    app.router.add_post(PATH, push)
    app.router.add_post("/window", window)
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"push_sink: serving http://{host}:{port}{PATH}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return state["tally"]


class SinkProcess:
    """A sink in its own process (`python -m bench.push_sink`), driven over HTTP: the
    bench's side of it."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}{PATH}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> SinkProcess:
        cmd = [sys.executable, "-m", "bench.push_sink", "--host", self.host,
               "--port", str(self.port)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.stats()
                break
            except OSError as e:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise BenchError(f"the push sink did not start: {e}") from None
            time.sleep(0.05)  # polling a port that has no event to await
        log(f"push sink on {self.url} (pid {self.proc.pid})")
        return self

    def _call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        url = f"http://{self.host}:{self.port}{path}"
        with urllib.request.urlopen(url, data=data, timeout=5) as resp:
            raw = resp.read()
        out: dict[str, Any] = json.loads(raw) if raw else {}
        return out

    def window(self, start_ms: float, end_ms: float) -> None:
        """Start a new tally; the latency counts events committed in [start_ms, end_ms)."""
        self._call("/window", {"start_ms": start_ms, "end_ms": end_ms})

    def stats(self) -> dict[str, Any]:
        return self._call("/stats")

    def wait_for(self, events: int, timeout: float = WAIT_S) -> dict[str, Any]:
        """The tally once `events` distinct events came, or nothing came for 5 s, or
        after `timeout` s."""
        deadline = time.monotonic() + timeout
        seen, quiet_since = -1, time.monotonic()
        while True:
            got = self.stats()
            now = time.monotonic()
            if got["distinct"] >= events or now > deadline or now - quiet_since > 5:
                return got
            if got["events"] != seen:
                seen, quiet_since = got["events"], now
            time.sleep(0.1)  # polling another process's counter

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


# === The comparison: push off against push on ============================================


def _ratio(off: Any, on: Any) -> float | None:
    if not isinstance(off, int | float) or not isinstance(on, int | float) or not off:
        return None
    return round(on / off, 3)


def compare_step(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """One rate's figures: the gateway's CPU per message with push events off and on,
    and what the sink saw of the "on" run."""
    sink = on.get("push_sink") or {}
    cpu_off, cpu_on = off.get("gateway_cpu_us_per_msg"), on.get("gateway_cpu_us_per_msg")
    ratio = _ratio(cpu_off, cpu_on)
    p99 = sink.get("latency_p99_ms")
    # The gateway's extra CPU a second over the events delivered a second: what an event
    # costs, even where the sink falls behind the messages (then CPU per message hides it).
    extra: float | None = None
    rate_off, rate_on = off.get("acked_per_s"), on.get("acked_per_s")
    events_s = sink.get("events_per_s")
    if cpu_off and cpu_on and rate_off and rate_on and events_s:
        extra = round((cpu_on * rate_on - cpu_off * rate_off) / events_s, 1)
    return {
        "rate_target": on.get("rate_target"),
        "off": {
            "gateway_cpu_us_per_msg": cpu_off,
            "acked": off.get("acked"),
            "ack_p99_ms": off.get("ack_p99_ms"),
        },
        "on": {
            "gateway_cpu_us_per_msg": cpu_on,
            "acked": on.get("acked"),
            "ack_p99_ms": on.get("ack_p99_ms"),
            **{k: v for k, v in sink.items() if k != "last_ms"},
        },
        "cpu_ratio": ratio,
        "extra_gateway_cpu_us_per_event": extra,
        "cpu_ratio_le_goal": None if ratio is None else ratio <= CPU_RATIO_GOAL,
        "event_p99_le_goal": None
        if p99 is None
        else p99 <= EVENT_P99_GOAL_MS and sink.get("missing") == 0,
    }


def compare(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """Push off against push on, rate by rate (the last at the top level)."""
    by_rate = {s["rate_target"]: s for s in off.get("steps", [])}
    steps = [compare_step(by_rate.get(s["rate_target"], {}), s) for s in on.get("steps", [])]
    return {
        "arrangement": "every uid registered a push device it then left offline "
        f"({PUSH_DEVICE!r}) and is online on another ('bench'): each message has two "
        "recipient devices, one of them offline",
        "goals": {"cpu_ratio_max": CPU_RATIO_GOAL, "event_p99_ms_max": EVENT_P99_GOAL_MS},
        **(steps[-1] if steps else {}),
        "steps": steps,
    }


def rounds_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Several rounds' comparisons (`compare`, one per off/on pair, in order): each
    round's CPU per message off and on and their ratio, and the median ratio."""
    rows = [
        {"off_us_per_msg": r["off"]["gateway_cpu_us_per_msg"],
         "on_us_per_msg": r["on"]["gateway_cpu_us_per_msg"], "cpu_ratio": r["cpu_ratio"]}
        for r in rounds
    ]  # fmt: skip
    ratios = [r["cpu_ratio"] for r in rows if r["cpu_ratio"] is not None]
    median = round(statistics.median(ratios), 3) if ratios else None
    return {
        "rounds": rows,
        "cpu_ratio_median": median,
        "cpu_ratio_median_le_goal": None if median is None else median <= CPU_RATIO_GOAL,
    }


def step_line(sink: dict[str, Any]) -> str:
    """The sink's figures of one step, for the live output."""
    return (
        f"  push sink: {sink['events_per_s']} events/s; {sink['distinct']} events for "
        f"{sink['messages_acked']} messages acked (missing {sink['missing']}, repeated "
        f"{sink['repeated']}); server_ms→sink ms: p50 {sink['latency_p50_ms']:.1f}  "
        f"p99 {sink['latency_p99_ms']:.1f}  max {sink['latency_max_ms']:.1f}"
    )


def lines(cmp: dict[str, Any]) -> list[str]:
    """The comparison as report lines."""
    g = cmp["goals"]
    out = [f"- push events: {cmp['arrangement']}"]
    for st in cmp["steps"]:
        off, on = st["off"], st["on"]
        out.append(
            f"  - {st['rate_target']:g} msg/s: gateway CPU µs per message "
            f"{off['gateway_cpu_us_per_msg']} off → {on['gateway_cpu_us_per_msg']} on "
            f"(ratio {st['cpu_ratio']}, goal ≤ {g['cpu_ratio_max']}; "
            f"{st['extra_gateway_cpu_us_per_event']} µs more per event delivered); sink "
            f"{on.get('events_per_s')} events/s, {on.get('distinct')} events for "
            f"{on.get('messages_acked')} messages acked (missing {on.get('missing')}); "
            f"server_ms→sink p50 / p99 / max {on.get('latency_p50_ms')} / "
            f"{on.get('latency_p99_ms')} / {on.get('latency_max_ms')} ms "
            f"(goal p99 ≤ {g['event_p99_ms_max']:g} ms)"
        )
    if cmp.get("rounds"):
        ratios = ", ".join(str(r["cpu_ratio"]) for r in cmp["rounds"])
        out.append(
            f"  - {len(cmp['rounds'])} rounds of off then on: CPU ratios {ratios}; median "
            f"{cmp['cpu_ratio_median']} (goal ≤ {g['cpu_ratio_max']})"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.push_sink",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="listen port")
    args = p.parse_args(argv)
    import uvloop

    tally = uvloop.run(serve(args.host, args.port))
    print(
        f"push_sink: {tally.posts} posts, {tally.events} events ({len(tally.ids)} distinct) "
        "in the last window",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
