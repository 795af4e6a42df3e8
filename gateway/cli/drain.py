"""`imgw drain`: make a node stop accepting, move its clients away at a set rate and
exit, by signal (--pid) or over its admin port (--admin); gateway/cli/adminclient.py does it."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Final

from gateway.cli.common import bad_address, usage_error

NAME: Final = "drain"
HELP: Final = "drain a node: stop accepting, move its clients away at a set rate, exit"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    drain = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Make a node stop accepting, KICK its clients with reason draining (they "
            "reconnect elsewhere, to --hint if given) at --rate per second, commit its "
            "pending sends and exit 0. --pid signals the process (SIGTERM; a supervisor "
            "drains all its workers); --admin asks one node over its admin port."
        ),
    )
    where = drain.add_mutually_exclusive_group()
    where.add_argument("--admin", metavar="HOST:PORT", help="the node's admin address")
    where.add_argument("--pid", type=int, help="the node's (or supervisor's) process id")
    drain.add_argument("--rate", type=float, help="KICKs per second (default: the node's own)")
    drain.add_argument("--hint", metavar="HOST:PORT", help="where clients should reconnect")
    drain.add_argument(
        "--admin-token", help="the node's admin token, with --admin (env IMGW_ADMIN_TOKEN)"
    )
    drain.add_argument(
        "--no-wait", dest="wait", action="store_false", help="return once the drain started"
    )
    drain.add_argument("--timeout", type=float, default=600, help="seconds to wait (600)")
    drain.set_defaults(command_parser=drain, func=run)


def _drain_problem(args: argparse.Namespace) -> str | None:
    if args.pid is not None and args.pid < 1:
        return "--pid must be a positive process id"
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate >= 0):
        return "--rate must be a finite number >= 0 (0 = all at once)"
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        return "--timeout must be a number of seconds above 0"
    return bad_address("--admin", args.admin) or bad_address("--hint", args.hint)


def run(args: argparse.Namespace) -> int:
    from gateway.cli.adminclient import DrainError, drain_by_admin, drain_by_pid

    if rc := usage_error("drain", _drain_problem(args)):
        return rc
    try:
        if args.pid is not None:
            if args.rate is not None or args.hint is not None:
                raise DrainError(
                    "--rate and --hint need --admin; with --pid the node uses its own "
                    "--drain-rate and --reconnect-hint"
                )
            drain_by_pid(args.pid, wait=args.wait, timeout=args.timeout)
        elif args.admin is not None:
            drain_by_admin(
                args.admin,
                rate=args.rate,
                hint=args.hint,
                wait=args.wait,
                timeout=args.timeout,
                token=args.admin_token or os.environ.get("IMGW_ADMIN_TOKEN", ""),
            )
        else:
            raise DrainError("say which node: --admin HOST:PORT or --pid PID")
    except DrainError as e:
        print(f"imgw drain: {e}", file=sys.stderr)
        return 1
    return 0
