"""`imgw bench SCENARIO`: load the gateway and report what it holds and how fast it moves
messages.

Scenarios: connect (hold N logged-in connections), chat (p2p sends at rising open-loop
rates), group (fan-out to groups), storm (kill or restart the gateway under N clients),
offline (receive while offline, then catch up). Every run writes `--json PATH` (default
bench-<scenario>.json), PNG charts and a short report beside it.

    imgw bench connect --connections 100000 --spawn-gateway
    imgw bench connect --connections 1000000 --hold 300 --ramp 10000 --spawn-gateway \\
        --store mysql://root:@127.0.0.1:3306/ --cache redis://127.0.0.1:6379/0 \\
        --bus amqp://guest:guest@127.0.0.1:5672/
    imgw bench chat --rates 2000,4000,6000 --spawn-gateway --store mysql://root:@127.0.0.1:3306/
    imgw bench storm --connections 100000 --how kill --spawn-gateway --store ... \
        --cache ... --bus ...

    imgw bench connect --connections 15000 --spawn-gateway --transport ws

    imgw bench agent --coordinator redis://ctl:6379/0          # on each load machine
    imgw bench connect --connections 1000000 --agents 8 --coordinator redis://ctl:6379/0 \
        --addr 10.0.0.5:7070 --token-key k1:SECRET

--agents N generates the load of every scenario on N agents instead of here: `imgw bench
agent` on each load machine waits on the --coordinator Redis for its share (connect and
storm: connections, uid range, ramp, source addresses; chat and group: generator
processes; offline: receivers and their senders, each phase started on all at once);
the controller starts them together and writes the same
progress lines and JSON, with a per-agent breakdown under `agents`.

--transport ws runs connect, storm, chat and group over WebSocket instead of the plain
TCP protocol: with --spawn-gateway the gateway also gets --ws-listen on a free port and
the load connects to ws://127.0.0.1:PORT/ws; with --addr, --addr names the WebSocket
listener (HOST:PORT, path /ws, or ws://HOST:PORT/PATH). Every result says its
`transport`.

With --spawn-gateway the bench starts `imgw serve` itself: on the embedded default, or on
the production backends when --store/--cache/--bus are given (a mysql:// URL without a
database gets a fresh database, dropped afterwards; a redis:// URL without ?prefix= gets
a private prefix, deleted afterwards) with enough --workers for the connections. Without
it, --addr HOST:PORT --token-key KID:SECRET names a running gateway, and --gateway-pid
(repeatable; workers are found as its children) lets the bench sample its memory and CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.calibrate import calibrate
from bench.common import BenchError, log, machine_info, set_log_name
from bench.preload import DEFAULT_CONVERSATIONS, DEFAULT_MESSAGES, Volume
from bench.send import CONNECT_CONCURRENCY, DRAIN_S
from bench.send import SCENARIOS as SEND_SCENARIOS
from bench.send import check as check_send
from bench.wsclient import parse_ws_addr
from gateway.net.hostport import split_host_port
from gateway.redact import redact_argv, redact_url

SCENARIOS = ("connect", "chat", "group", "storm", "offline")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="result file (default bench-SCENARIO.json)")
    p.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    p.add_argument("--timeout", type=float, help="hard limit for the whole run, s")
    g = p.add_argument_group("gateway under test")
    g.add_argument("--spawn-gateway", action="store_true", help="start imgw serve here")
    g.add_argument(
        "--addr", metavar="HOST:PORT",
        help="a running gateway instead: its TCP port, or with --transport ws its WebSocket "
        "listener (HOST:PORT for path /ws, or ws://HOST:PORT/PATH)",
    )  # fmt: skip
    g.add_argument(
        "--gateway-host", default="127.0.0.1", metavar="ADDR",
        help="with --spawn-gateway: the address it listens on and the load connects to "
        "(127.0.0.1); another address of this machine for agents elsewhere, such as the "
        "bridge of scripts/bench-netns",
    )  # fmt: skip
    g.add_argument("--token-key", metavar="KID:SECRET", help="its token key (with --addr)")
    g.add_argument("--gateway-pid", type=int, action="append", help="its pid(s), to sample")
    g.add_argument("--store", help="store URL (mysql://... ; default: embedded SQLite)")
    g.add_argument("--cache", help="cache URL (redis://... ; default memory://)")
    g.add_argument("--bus", help="bus URL (amqp://... ; default local://)")
    g.add_argument(
        "--workers", type=int,
        help="gateway workers (default: 1 per 16,000 connections on redis+amqp, else 1)",
    )  # fmt: skip
    g.add_argument("--shards", type=int, default=16, help="message shards of a fresh database")
    g.add_argument(
        "--servers", default="", metavar="HOST:PORT,...",
        help="spread a fresh database's message shards over --store's server and these "
        "MySQL servers (the same database name on each; imgw db migrate --servers)",
    )  # fmt: skip
    g.add_argument("--keep-data", action="store_true", help="keep the fresh database/keys")
    g.add_argument(
        "--gateway-arg", action="append", default=[], metavar="ARG",
        help="extra imgw serve argument, repeatable (--gateway-arg=--batch-max=256)",
    )  # fmt: skip
    g.add_argument(
        "--gateway-log", type=Path, metavar="PATH",
        help="keep the spawned gateway's log here (default: a temporary file, kept only "
        "when the run fails)",
    )  # fmt: skip
    # Settings of bench.run.Run without flags here (python -m bench.send_bench has some).
    p.set_defaults(gateway_port=0, metrics_url=None)


def _transport(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--transport", choices=("tcp", "ws"), default="tcp",
        help="tcp: the plain protocol (4-byte LEN, then the body); ws: WebSocket, one frame "
        "body per binary message, to the gateway's --ws-listen (default tcp)",
    )  # fmt: skip


def _agents(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--agents", type=int, default=0, metavar="N",
        help="generate the load on N agents (`imgw bench agent` on each load machine) "
        "instead of here, split evenly (needs --coordinator)",
    )  # fmt: skip
    p.add_argument(
        "--coordinator", metavar="URL",
        help="with --agents: the Redis the agents wait on, redis://host:port/db[?prefix=...]",
    )  # fmt: skip
    p.add_argument(
        "--agents-wait", type=float, default=60.0, metavar="S",
        help="with --agents: how long to wait for N idle agents to register (60)",
    )  # fmt: skip


def _holders(p: argparse.ArgumentParser, n: int, ramp: float) -> None:
    p.add_argument("--connections", type=int, default=n, help=f"connections ({n:,})")
    p.add_argument("--ramp", type=float, default=ramp, help=f"new connections per s ({ramp:g})")
    p.add_argument("--hb", type=int, default=30, help="heartbeat interval, s (30)")
    p.add_argument(
        "--per-proc", type=int, default=15_000, help="connections per generator process (15000)"
    )
    p.add_argument("--sock-buf", type=int, default=4096, help="generator socket buffers (4096)")
    p.add_argument(
        "--tls",
        action="store_true",
        help="connect with TLS (with --spawn-gateway the bench makes a test certificate; "
        "the generators do not verify it)",
    )


def _rates(p: argparse.ArgumentParser, rate: float) -> None:
    p.add_argument("--rate", type=float, default=rate, help=f"target msg/s ({rate:g})")
    p.add_argument("--rates", help="comma-separated rates, one step each (2000,4000,6000)")
    p.add_argument("--duration", type=float, default=20.0, help="measured s per step (20)")
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured s before each (3)")
    p.add_argument(
        "--procs", type=int,
        help="generator processes (one per 15,000 frames/s sent and received, at least 1)",
    )  # fmt: skip
    p.add_argument("--content-size", type=int, default=64, help="message bytes (64)")
    p.set_defaults(drain=DRAIN_S, connect_concurrency=CONNECT_CONCURRENCY, uid_base=0)


def _volume(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("volume (with --spawn-gateway)")
    g.add_argument(
        "--preload", type=int, nargs="?", const=DEFAULT_MESSAGES, default=0, metavar="N",
        help="store N messages (1,000,000 when N is left out) over many conversations and "
        "users before measuring; the scenario runs first on an empty store, then on the "
        "preloaded one, and the report gives both and their ratio",
    )  # fmt: skip
    g.add_argument(
        "--preload-convs", type=int, metavar="C",
        help=f"conversations the preloaded messages spread over "
        f"(min({DEFAULT_CONVERSATIONS:,}, N/10))",
    )  # fmt: skip
    g.add_argument(
        "--no-empty-baseline", action="store_true",
        help="with --preload: skip the run on the empty store",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="imgw bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="scenario", metavar="SCENARIO", required=True)
    from bench.agent import add_parser as add_agent

    add_agent(sub)
    c = sub.add_parser("connect", help="ramp and hold logged-in connections")
    _holders(c, 10_000, 5_000)
    c.add_argument("--hold", type=float, default=60.0, help="seconds to hold (60)")
    s = sub.add_parser("storm", help="kill/restart the gateway under N clients; time to recover")
    _holders(s, 10_000, 5_000)
    s.add_argument("--how", choices=["kill", "restart"], default="kill", help="kill -9 or SIGTERM")
    s.add_argument("--settle", type=float, default=5.0, help="seconds held before the storm")
    s.add_argument("--backoff-base", type=float, default=0.5, help="client backoff base, s")
    s.add_argument("--backoff-cap", type=float, default=10.0, help="client backoff cap, s")
    s.add_argument(
        "--fresh-sync", action="store_true",
        help="SYNC from 0 after every reconnect, as a client that lost its state would "
        "(default: from the next_since of its last pass, as apps do)",
    )  # fmt: skip
    s.add_argument(
        "--sync-after-login-ok", action="store_true",
        help="send SYNC once LOGIN_OK has come (default: in the LOGIN's write, right behind "
        "it, as docs/protocol.md allows)",
    )  # fmt: skip
    ch = sub.add_parser("chat", help="p2p sends at open-loop rates: send→ACK and send→PUSH")
    _rates(ch, 1000)
    ch.add_argument("--pairs", type=int, help="user pairs (default: <= 10 msg/s per user)")
    ch.add_argument(
        "--push-sink", action="store_true",
        help="what push events cost: every uid registers a push device it leaves offline, "
        "and the scenario runs twice, on a gateway without --push-url, then on one posting "
        "to a sink the bench starts; the report gives the gateway's CPU per message of "
        "both, their ratio, and the sink's events/s, events and latency (with "
        "--spawn-gateway)",
    )  # fmt: skip
    ch.add_argument(
        "--push-rounds", type=int, default=1, metavar="N",
        help="with --push-sink: the pair of runs (off, then on) N times in a row, each "
        "pair's CPU ratio reported and their median as cpu_ratio_median (1): on a shared "
        "machine two runs minutes apart differ by more than push events cost",
    )  # fmt: skip
    ch.set_defaults(group_size=2)
    gr = sub.add_parser("group", help="sends fanned out to groups")
    _rates(gr, 200)
    gr.add_argument("--group-size", type=int, default=20, help="members per group (20)")
    gr.add_argument("--groups", type=int, help="groups (default: <= 10 msg/s per member)")
    off = sub.add_parser("offline", help="receive while offline, then log in and catch up")
    off.add_argument("--receivers", type=int, default=1000, help="offline users (1000)")
    off.add_argument("--messages", type=int, default=50, help="messages each receives (50)")
    for sp in (s, ch, gr, off):
        _volume(sp)
    for sp in (c, s, ch, gr):
        _transport(sp)
    for sp in (c, s, ch, gr, off):
        _agents(sp)
    for sp in (c, s, ch, gr, off):
        _common(sp)
        sp.formatter_class = argparse.RawTextHelpFormatter
    return parser


def _check_agents(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not getattr(args, "agents", 0):
        if getattr(args, "coordinator", None):
            p.error("--coordinator is for runs on agents: add --agents N")
        return
    if args.agents < 1:
        p.error("--agents must be >= 1")
    if not args.coordinator:
        p.error("--agents needs --coordinator redis://host:port/db (where the agents wait)")
    if not args.coordinator.startswith(("redis://", "rediss://")):
        p.error("--coordinator takes a redis:// URL")
    if getattr(args, "transport", "tcp") == "ws":
        p.error("--agents runs the plain TCP protocol: leave out --transport ws")


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    _check_agents(p, args)
    if args.spawn_gateway == bool(args.addr):
        p.error("give exactly one of --spawn-gateway and --addr HOST:PORT")
    if args.gateway_host != "127.0.0.1" and not args.spawn_gateway:
        p.error("--gateway-host is where a spawned gateway listens: it needs --spawn-gateway")
    if args.addr and (not args.token_key or ":" not in args.token_key):
        p.error("--addr needs --token-key KID:SECRET (the gateway's key)")
    ws = getattr(args, "transport", "tcp") == "ws"
    if args.addr:
        if args.addr.startswith("ws://") and not ws:
            p.error("--addr ws://... is a WebSocket listener: add --transport ws")
        try:
            if ws:
                parse_ws_addr(args.addr)
            else:
                split_host_port(args.addr, default_host="127.0.0.1")
        except ValueError as e:
            p.error(f"--addr: {e}")
    if ws and getattr(args, "tls", False):
        p.error("--tls is for the plain TCP port: the bench speaks WebSocket without TLS")
    if ws and importlib.util.find_spec("websockets") is None:
        p.error("--transport ws needs the websockets library: pip install websockets")
    if args.scenario == "storm" and not args.spawn_gateway:
        p.error("storm kills and restarts the gateway: it needs --spawn-gateway")
    args.volume = None
    if getattr(args, "preload", 0):
        if not args.spawn_gateway:
            p.error("--preload fills a fresh store before the gateway starts: it needs "
                    "--spawn-gateway")  # fmt: skip
        try:
            args.volume = Volume.of(args.preload, args.preload_convs)
        except ValueError as e:
            p.error(str(e))
    if getattr(args, "push_rounds", 1) != 1 and not getattr(args, "push_sink", False):
        p.error("--push-rounds repeats the runs of --push-sink: add --push-sink")
    if getattr(args, "push_sink", False):
        if not args.spawn_gateway:
            p.error("--push-sink starts the gateway with and without --push-url: it needs "
                    "--spawn-gateway")  # fmt: skip
        if args.volume is not None:
            p.error("--push-sink and --preload each run the scenario twice: give one of them")
        if args.push_rounds < 1:
            p.error("--push-rounds must be >= 1")
        if any(a.startswith(("--push-url", "--push-amqp")) for a in args.gateway_arg):
            p.error("--push-sink gives the gateway its own --push-url: leave out "
                    "--gateway-arg=--push-url/--push-amqp")  # fmt: skip
    args.production = bool(
        args.cache and args.cache.startswith("redis") and args.bus and args.bus.startswith("amqp")
    )
    if args.scenario in ("connect", "storm"):
        if args.connections < 1 or args.ramp <= 0:
            p.error("need --connections >= 1 and --ramp > 0")
        if args.spawn_gateway and not args.production and args.connections > 16_000:
            p.error(
                f"{args.connections:,} connections need several gateway workers (a process "
                "holds at most 20,000 files here), which need a shared route store and bus: "
                "pass --store mysql://root:@127.0.0.1:3306/ --cache redis://127.0.0.1:6379/0 "
                "--bus amqp://guest:guest@127.0.0.1:5672/"
            )
    if args.scenario in SEND_SCENARIOS:
        if args.scenario == "group":
            args.pairs = args.groups
        procs_given = args.procs is not None
        error = check_send(args, "--pairs" if args.scenario == "chat" else "--groups")
        if error:
            p.error(error)
        if args.agents and args.procs < args.agents:
            if procs_given:
                p.error(f"--agents {args.agents} needs --procs {args.agents} or more (at "
                        "least one generator process on each agent)")  # fmt: skip
            args.procs = args.agents
            if args.pairs < args.procs:
                p.error(f"--agents {args.agents} needs at least {args.agents} units "
                        "(--pairs or --groups)")  # fmt: skip
    # The gateway's heartbeat settings: idle connections must outlive the hold.
    args.gateway_hb = getattr(args, "hb", 30)
    args.gateway_idle = max(75, 2 * args.gateway_hb + 15)
    if args.timeout is None:
        args.timeout = _default_timeout(args)


def _default_timeout(args: argparse.Namespace) -> float:
    if args.scenario == "connect":
        return float(args.connections / args.ramp + args.hold + 300 + args.connections / 2_000)
    if args.scenario == "storm":
        return float(2 * args.connections / args.ramp + 600 + args.connections / 1_000)
    if args.scenario in SEND_SCENARIOS:
        steps = len(args.steps)
        sink_wait = 30 if getattr(args, "push_sink", False) else 0  # bench.push_sink.WAIT_S
        return float(
            steps * (args.duration + args.warmup + 15 + sink_wait) + 180 + _preload_s(args)
        )
    return 900.0 + _preload_s(args)


def _preload_s(args: argparse.Namespace) -> float:
    return float(getattr(args, "preload", 0) or 0) / 5_000


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.scenario == "agent":
        from bench.agent import main as agent_main

        return agent_main(args)
    _check(parser, args)
    set_log_name(f"bench {args.scenario}")
    json_path = Path(args.json or f"bench-{args.scenario}.json")
    baseline: dict[str, Any] | None = None
    before = calibrate()  # the machine's speed, to compare this run with others
    if args.volume is not None and not args.no_empty_baseline:
        log("volume mode: the run on an empty store first, then on the preloaded one")
        volume, args.volume = args.volume, None
        baseline, status = run_scenario(args)
        args.volume = volume
        if status != 0:
            log("the run on the empty store failed; the preloaded run follows anyway")
        log(f"now with {volume.messages:,} messages preloaded")
    if getattr(args, "push_sink", False):
        result, status = run_push_sink(args)
    else:
        result, status = run_scenario(args)
    after = calibrate()
    if baseline is not None:
        from bench.volume import compare

        result["empty_store"] = baseline
        result["volume_ratio"] = compare(args.scenario, baseline, result)
    result = {"scenario": args.scenario, **result}
    given = argv if argv is not None else sys.argv[2:]
    result["command"] = redact_argv(["imgw", "bench", *given])  # no password in results
    result["machine"] = {**machine_info(), "calibration": {"before": before, "after": after}}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    if not args.no_charts:
        from bench.report import charts

        result["charts"] = charts(json_path.with_suffix(""), result)
    from bench.report import summary, write_json

    write_json(json_path, result)
    text = summary(result)
    json_path.with_suffix(".md").write_text(text)
    print(text)
    return status


def run_push_sink(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """--push-sink: the scenario on a gateway without push events, then on one that
    posts them to a sink started here, `--push-rounds` times; the last "on" run's
    result, with its "off" run's under `push_off`, the two compared under `push`, and
    with several rounds each round's figures and the median ratio there too."""
    from bench.push_sink import SinkProcess, compare, rounds_summary

    rounds: list[dict[str, Any]] = []
    status = 0
    for n in range(1, args.push_rounds + 1):
        of = f" (round {n} of {args.push_rounds})" if args.push_rounds > 1 else ""
        log(f"push sink: the run with push events off first, then with them on{of}")
        off, status_off = run_scenario(args)
        if status_off != 0:
            log("the run with push events off failed; the run with them on follows anyway")
        log(f"now with push events on{of}")
        sink = SinkProcess().start()
        given = args.gateway_arg
        args.sink, args.gateway_arg = sink, [*given, f"--push-url={sink.url}"]
        try:
            result, status_on = run_scenario(args)
        finally:
            args.sink, args.gateway_arg = None, given
            sink.stop()
        status = status or status_on or status_off
        result["push_off"] = off
        result["push"] = compare(off, result)
        rounds.append(result["push"])
    if len(rounds) > 1:
        result["push"].update(rounds_summary(rounds))
    return result, status


def run_scenario(args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Run scenario `args.scenario` once, on the gateway under test that `Run` spawns or
    attaches to; its result and exit status."""
    from bench.connect import default_workers, run_connect, run_storm
    from bench.offline import run_offline
    from bench.run import Run
    from bench.send import run_send
    from gateway.net.openfiles import raise_nofile

    raise_nofile()  # inherited by the gateway
    send = args.scenario in SEND_SCENARIOS
    n = getattr(args, "connections", 0)
    workers = args.workers or default_workers(n, args.production)
    run = Run(args, workers)
    result: dict[str, Any] = {
        "transport": getattr(args, "transport", "tcp"),
        "gateway_workers": workers,
        "backend": {"store": redact_url(args.store or "embedded"),
                    "cache": redact_url(args.cache or "memory://"),
                    "bus": redact_url(args.bus or "local://")},
    }  # fmt: skip
    status = 0
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _as_interrupt)
    try:
        run.start()
        scenario = {"connect": run_connect, "storm": run_storm, "offline": run_offline,
                    "chat": run_send, "group": run_send}  # fmt: skip
        result.update(scenario[args.scenario](args, run))
    except KeyboardInterrupt:
        log("interrupted")
        result.update(run.partial)
        result["error"], status = "interrupted", 130
    except (BenchError, OSError, TimeoutError, subprocess.SubprocessError) as e:
        log(f"failed: {e}")
        result.update(run.partial)
        result["error"], status = str(e), 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        result["preload"] = run.preloaded
        pids = result.get("gateway_pids")
        result.update(run.finish(status))
        if pids:
            result["gateway_pids"] = pids
    if send:
        # A gateway that does not exit cleanly after the sends fails the run.
        if result.get("gateway_exit_code") not in (0, None):
            status = status or 1
        result.setdefault("gateway_pids", [])
        return result, status
    result["duration_s"] = round(time.monotonic() - started, 1)
    result["timeline"] = run.timeline
    result.setdefault("connections_target", n or None)
    for key in ("connections_held", "drops", "gateway_rss_bytes", "gateway_rss_per_conn_bytes",
                "generator_rss_per_conn_bytes"):  # fmt: skip
        result.setdefault(key, None)
    return result, status


def _as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
