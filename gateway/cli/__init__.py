"""The `imgw` command. Each builtin command is a module of this package with its NAME,
its HELP line and `register(subparsers)`, which adds its parser and sets `func`, the
function that runs it: serve, chat, token, db, drain, revoke, archive (`COMMANDS`). The
commands other packages add (entry points of group `imgw.commands`, e.g. `imgw bench`
from the optional extra imgw[bench]) are never imported until they are run.

`python -m gateway.cli` runs it too (gateway/cli/__main__.py)."""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.metadata
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from gateway.cli import archive, chat, db, drain, revoke, serve, token
from gateway.cli.common import DEV_KEY
from gateway.cli.serve import config_from_args

__all__ = ["DEV_KEY", "build_parser", "config_from_args", "main"]

_DESCRIPTION = """\
imgw: an instant-messaging connection gateway.

Native chat apps keep a persistent TCP connection to imgw and speak a compact msgpack
protocol (docs/protocol.md). Start a gateway on the embedded store with `imgw serve`,
then try it from two terminals with `imgw chat --uid 1 --peer 2` and
`imgw chat --uid 2 --peer 1`.
"""


COMMANDS: Final = (serve, chat, token, db, drain, revoke, archive)
COMMAND_HELP: Final = {command.NAME: command.HELP for command in COMMANDS}
BUILTIN_COMMANDS: Final = frozenset(COMMAND_HELP)
PLUGIN_GROUP: Final = "imgw.commands"
KNOWN_PLUGINS: Final = {
    # name: (its help in `imgw --help`, the extra of imgw that installs it)
    "bench": ("load the gateway: connect, chat, group, storm, offline", "bench"),
}
"""Plugin commands listed by `imgw --help` even when not installed, so that running one
says what to install."""


def plugin_commands() -> dict[str, importlib.metadata.EntryPoint]:
    """The commands other packages add to `imgw`: entry points of group `imgw.commands`,
    each `name = "module:function [extra]"`; the function takes the arguments after
    the command's name and returns the exit status. In a source checkout, the table in
    its pyproject.toml counts too (and wins): an editable install's metadata is only as
    new as its last `pip install -e`."""
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP)}
    found.update(_checkout_plugins())
    return {name: ep for name, ep in found.items() if name not in BUILTIN_COMMANDS}


def _checkout_plugins() -> dict[str, importlib.metadata.EntryPoint]:
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        with pyproject.open("rb") as f:
            project = tomllib.load(f).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    if project.get("name") != "imgw":
        return {}
    table = project.get("entry-points", {}).get(PLUGIN_GROUP, {})
    return {
        name: importlib.metadata.EntryPoint(name, value, PLUGIN_GROUP)
        for name, value in table.items()
        if isinstance(value, str)
    }


def run_plugin(name: str, argv: Sequence[str]) -> int:
    """Run plugin command `name` with `argv` (its own parser, options and --help
    included); when it is not installed, say what to install."""
    ep = plugin_commands().get(name)
    extra = KNOWN_PLUGINS[name][1] if name in KNOWN_PLUGINS else ",".join(ep.extras if ep else ())
    hint = (
        f"; install it: pip install 'imgw[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
        if extra
        else ""
    )
    if ep is None:
        print(f"imgw {name}: not installed{hint}", file=sys.stderr)
        return 2
    try:
        command = ep.load()
    except ImportError as e:
        print(f"imgw {name}: cannot load {ep.value} ({e}){hint}", file=sys.stderr)
        return 2
    rc: int = command(list(argv))
    return rc


def version() -> str:
    try:
        return importlib.metadata.version("imgw")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e . in the checkout)"


def command_list() -> str:
    """What bare `imgw` prints: every command (plugins too) with one line each."""
    plugins = {
        name: KNOWN_PLUGINS[name][0] if name in KNOWN_PLUGINS else "(plugin command)"
        for name in sorted(set(KNOWN_PLUGINS) | set(plugin_commands()))
    }
    about = {**COMMAND_HELP, **plugins}
    width = max(map(len, about))
    lines = [f"  {name:<{width}}  {text}" for name, text in about.items()]
    return "\n".join(
        [
            "usage: imgw COMMAND [OPTIONS]",
            "",
            "commands:",
            *lines,
            "",
            "Run `imgw COMMAND --help` for a command's options, `imgw --version` for the version.",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="imgw", description=_DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"imgw {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    # Listed for `imgw --help` only; main() hands `imgw NAME ...` to the plugin whole.
    for name in sorted(set(KNOWN_PLUGINS) | set(plugin_commands())):
        about = KNOWN_PLUGINS[name][0] if name in KNOWN_PLUGINS else "(plugin command)"
        sub.add_parser(name, help=about, add_help=False)
    return parser


def _unrecognized(parser: argparse.ArgumentParser, unknown: list[str]) -> None:
    """Exit with the usage of the command that was given the unknown option (argparse
    would show the top-level usage), naming the option meant when it is a near miss."""
    known = [s for a in parser._actions for s in a.option_strings]
    text = f"unrecognized arguments: {' '.join(unknown)}"
    for arg in unknown:
        close = difflib.get_close_matches(arg.partition("=")[0], known, n=1)
        if arg.startswith("-") and close:
            text += f" (did you mean {close[0]}?)"
            break
    parser.error(text)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        from gateway.cli.cmdline import hide_secrets

        hide_secrets()  # ps shows --store mysql://user:***@... from here on
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        print(f"imgw: unknown option {argv[0]}\n" if argv else "", end="", file=sys.stderr)
        print(command_list(), file=sys.stderr)
        return 2
    name = argv[0]
    if name not in BUILTIN_COMMANDS and (name in KNOWN_PLUGINS or name in plugin_commands()):
        return run_plugin(name, argv[1:])  # its own parser, options and --help included
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _unrecognized(getattr(args, "command_parser", parser), unknown)
    rc: int = args.func(args)
    return rc
