"""`imgw token`: mint a login token, for testing (the development key by default)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Final

from gateway.cli.common import DEV_KEY
from protocol.token import DEVICE_RE, KID_RE, sign_token

NAME: Final = "token"
HELP: Final = "mint a login token (for testing)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev_kid, dev_secret = DEV_KEY.split(":", 1)
    token = sub.add_parser(NAME, help=HELP)
    token.add_argument("--uid", type=int, required=True, help="user id the token is for")
    token.add_argument(
        "--device", required=True,
        help="device name, [A-Za-z0-9_-]{1,32}; a second login with the same uid and "
        "device logs the first one out",
    )  # fmt: skip
    token.add_argument("--kid", default=dev_kid, help=f"key id (default {dev_kid})")
    token.add_argument("--secret", default=dev_secret, help="signing secret (default: dev key)")
    token.add_argument(
        "--ttl",
        type=int,
        default=86_400,
        help="seconds of validity (86400; gateways refuse more than their "
        "token_max_lifetime, 30 days by default)",
    )
    token.set_defaults(command_parser=token, func=run)


def run(args: argparse.Namespace) -> int:
    if KID_RE.fullmatch(args.kid) is None:
        print("imgw token: --kid must match [A-Za-z0-9_-]{1,16}", file=sys.stderr)
        return 2
    if DEVICE_RE.fullmatch(args.device) is None:
        print("imgw token: --device must match [A-Za-z0-9_-]{1,32}", file=sys.stderr)
        return 2
    if args.uid < 1:
        print("imgw token: --uid must be a positive integer", file=sys.stderr)
        return 2
    if args.ttl < 1:
        print("imgw token: --ttl must be a positive number of seconds", file=sys.stderr)
        return 2
    now = int(time.time())
    print(sign_token(args.kid, args.secret, args.uid, args.device, now + args.ttl, iat=now))
    return 0
