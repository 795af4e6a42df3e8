"""`python -m bench.send_bench`: the send benchmark's first command line. It runs the
same scenario as `imgw bench chat` (`imgw bench group` with --group-size > 2; bench.send),
with its own flags and defaults (a fresh MariaDB database unless --embedded or --store,
--port, --gateway-log, --metrics-url, --drain) and its own JSON: "scenario": "send",
`errors` by code, and no connection figures.

    python -m bench.send_bench --spawn-gateway --rate 2000 --duration 10
    python -m bench.send_bench --spawn-gateway --rates 2000,5000,10000 --json out.json
    python -m bench.send_bench --addr 127.0.0.1:7070 --token-key k:s --rate 1000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from bench.cli import run_scenario
from bench.common import log, machine_info, set_log_name
from bench.preload import Volume
from bench.send import CONNECT_CONCURRENCY, DRAIN_S, check
from gateway.redact import redact_argv

MARIADB: Final = "mysql://root:@127.0.0.1:3306/"
IMGW_BENCH_ONLY: Final = (
    "connections_target", "connections_held", "drops", "group_size", "conversations",
    "gateway_workers", "gateway_rss_per_conn_bytes", "generator_rss_per_conn_bytes",
    "errors_by_code",
)  # fmt: skip
"""Fields of `imgw bench chat|group` that this command's JSON never had."""


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
        "--drain", type=float, default=DRAIN_S, help="seconds to wait for late ACKs per step (10)"
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
    load.add_argument(
        "--connect-concurrency", type=int, default=CONNECT_CONCURRENCY, help=argparse.SUPPRESS
    )
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
    error = check(args, "--pairs")
    if error:
        p.error(error)
    if args.timeout is None:
        args.timeout = len(args.steps) * (args.duration + args.warmup + args.drain) + 60
        args.timeout += args.preload / 5_000  # bulk loading runs at >= 10,000 rows/s
    # The settings of the `imgw bench` scenario (bench.cli) that this command has no
    # flags for, or names differently.
    args.scenario = "chat" if args.group_size == 2 else "group"
    if args.spawn_gateway and not args.embedded:
        args.store = args.store or MARIADB
    args.keep_data = args.keep_db
    args.gateway_port = args.port
    args.gateway_log = Path(args.gateway_log) if args.gateway_log else None
    args.volume = Volume.of(args.preload, args.preload_convs) if args.preload else None
    args.production = False  # only picks a default for --workers, which has one here
    args.gateway_hb, args.gateway_idle = 30, 75
    return args


def legacy_result(result: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """An `imgw bench chat|group` result in this command's shape."""
    out = {k: v for k, v in result.items() if k not in IMGW_BENCH_ONLY}
    out["steps"] = [
        {**{k: v for k, v in s.items() if k != "errors_by_code"}, "errors": s["errors_by_code"]}
        for s in result.get("steps", [])
    ]
    if out["steps"]:
        out["errors"] = out["steps"][-1]["errors"]
    return {
        "scenario": "send",
        **out,
        "machine": machine_info(),
        "command": redact_argv([sys.executable, "-m", "bench.send_bench", *argv]),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    set_log_name("send_bench")
    result, status = run_scenario(args)
    if args.json:
        Path(args.json).write_text(json.dumps(legacy_result(result, argv), indent=2) + "\n")
        log(f"wrote {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
