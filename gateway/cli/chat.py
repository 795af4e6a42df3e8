"""`imgw chat`: chat from a terminal (the chat itself is gateway/chat/)."""

from __future__ import annotations

import argparse
from typing import Final

from gateway.cli.common import DEV_KEY

NAME: Final = "chat"
HELP: Final = "chat from a terminal (try imgw from two of them)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway import chat

    p = sub.add_parser(NAME, help=HELP)
    chat.add_arguments(p, default_key=DEV_KEY)
    p.set_defaults(command_parser=p, func=chat.main)
