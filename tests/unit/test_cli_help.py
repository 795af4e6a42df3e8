"""Every option of every `imgw` command says what it is in `--help`."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from gateway.cli import build_parser


def options(parser: argparse.ArgumentParser, command: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from options(sub, f"{command} {name}")
        elif action.option_strings and action.dest != "help":
            yield command, action


def test_every_option_has_help() -> None:
    bare = [
        f"{command} {action.option_strings[0]}"
        for command, action in options(build_parser(), "imgw")
        if not (action.help or "").strip()
    ]
    assert not bare, f"options without help: {bare}"


def test_token_help_says_what_uid_and_device_are() -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(subs.choices["token"].format_help().split())
    assert "--uid UID user id the token is for" in text
    assert "--device DEVICE device name, [A-Za-z0-9_-]{1,32}" in text
