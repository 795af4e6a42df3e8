"""The server's runtime does not include the load harness: `imgw serve` (and `imgw
--help`) import nothing from bench/ nor its dependencies; `imgw bench` is a plugin
command (entry point group `imgw.commands`) that is imported only when it runs, and
says what to install when it is missing."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from gateway import cli

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import contextlib, io, json, sys
import gateway.cli, gateway.server
from gateway.cli import build_parser, config_from_args, main
args = build_parser().parse_args(["serve", "--port", "7171", "--token-key", "k:s"])
config_from_args(args)
for argv in (["--help"], ["serve", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
bench_only = ("bench", "hdrh", "matplotlib", "trustme")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in bench_only)))
"""


def test_serve_and_help_import_nothing_from_bench() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_gateway_source_never_names_the_bench_package() -> None:
    for path in (REPO / "gateway").rglob("*.py"):
        for line in path.read_text().splitlines():
            assert not line.lstrip().startswith(("import bench", "from bench")), (path, line)


def test_bench_is_a_plugin_command_with_its_extra() -> None:
    ep = cli.plugin_commands()["bench"]
    assert (ep.module, ep.attr, ep.extras) == ("bench.cli", "main", ["bench"])
    commands = next(
        a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    assert set(commands.choices) == {*cli.BUILTIN_COMMANDS, *cli.KNOWN_PLUGINS}


def _plugins(monkeypatch: pytest.MonkeyPatch, table: dict[str, str]) -> None:
    eps = {n: importlib.metadata.EntryPoint(n, v, cli.PLUGIN_GROUP) for n, v in table.items()}
    monkeypatch.setattr(cli, "plugin_commands", lambda: eps)


def test_a_plugin_command_gets_the_arguments_after_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[list[str]] = []

    def run(argv: list[str]) -> int:
        seen.append(argv)
        return 7

    module = types.ModuleType("imgw_fake_plugin")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "imgw_fake_plugin", module)
    _plugins(monkeypatch, {"bench": "imgw_fake_plugin:run [bench]"})
    assert cli.main(["bench", "chat", "--help"]) == 7
    assert seen == [["chat", "--help"]]


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({}, "imgw bench: not installed"),
        ({"bench": "imgw_no_such_module:main [bench]"}, "cannot load imgw_no_such_module:main"),
    ],
)
def test_a_missing_bench_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    table: dict[str, str],
    said: str,
) -> None:
    _plugins(monkeypatch, table)
    assert cli.main(["bench", "chat"]) == 2
    err = capsys.readouterr().err
    assert said in err and "pip install 'imgw[bench]'" in err


def test_builtin_commands_win_over_plugins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    token = importlib.metadata.EntryPoint("token", "imgw_no_such_module:main", cli.PLUGIN_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [token])
    monkeypatch.setattr(cli, "_checkout_plugins", lambda: {"token": token})
    assert "token" not in cli.plugin_commands()
    assert cli.main(["token", "--uid", "1", "--device", "d"]) == 0
    assert capsys.readouterr().out.startswith("v")
