"""`imgw revoke`: over a node's admin port, refuse the tokens of a user (or of one of its
devices) minted until now, and kick its sessions on every node."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Final

from gateway.cli.common import bad_address, usage_error
from protocol.token import DEVICE_RE

NAME: Final = "revoke"
HELP: Final = "revoke a user's tokens (or one device's) and kick its sessions on every node"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    revoke = sub.add_parser(
        NAME,
        help=HELP,
        description=(
            "Ask a node over its admin port to refuse the tokens of --uid (all devices, or "
            "--device) minted until now, for the longest token lifetime, and to kick its "
            "sessions on every node with auth_revoked. Logging in again needs a v2 token "
            "(with iat) minted after the revocation; v1 tokens of the user stay refused."
        ),
    )
    revoke.add_argument(
        "--admin", metavar="HOST:PORT", required=True, help="a node's admin address"
    )
    revoke.add_argument("--uid", type=int, required=True, help="user id whose tokens are refused")
    revoke.add_argument("--device", help="only this device (default: all of them)")
    revoke.add_argument("--admin-token", help="the node's admin token (env IMGW_ADMIN_TOKEN)")
    revoke.set_defaults(command_parser=revoke, func=run)


def _revoke_problem(args: argparse.Namespace) -> str | None:
    if args.uid < 1:
        return "--uid must be a positive integer"
    if args.device is not None and DEVICE_RE.fullmatch(args.device) is None:
        return "--device must match [A-Za-z0-9_-]{1,32}"
    return bad_address("--admin", args.admin)


def run(args: argparse.Namespace) -> int:
    from gateway.cli.adminclient import DrainError, revoke_by_admin

    if rc := usage_error("revoke", _revoke_problem(args)):
        return rc
    token = args.admin_token or os.environ.get("IMGW_ADMIN_TOKEN", "")
    try:
        print(revoke_by_admin(args.admin, args.uid, args.device, token=token))
    except DrainError as e:
        print(f"imgw revoke: {e}", file=sys.stderr)
        return 1
    return 0
