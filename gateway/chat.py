"""`imgw chat` (placeholder until the client library lands)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser, *, default_key: str) -> None:
    p.add_argument("--uid", type=int, required=True)


def main(args: argparse.Namespace) -> int:
    raise SystemExit("imgw chat: not implemented yet")
