"""What `imgw` says to someone finding their way: bare `imgw`, `--version`, and a
mistyped option of a command."""

from __future__ import annotations

import importlib.metadata

import pytest

from gateway import cli


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    return rc, out, err


def test_bare_imgw_lists_every_command_with_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = run([], capsys)
    assert rc == 2 and out == ""
    listed = {
        line.split()[0]: line.split(maxsplit=1)[1]
        for line in err.splitlines()
        if line.startswith("  ")
    }
    assert set(listed) == {*cli.BUILTIN_COMMANDS, *cli.KNOWN_PLUGINS}  # the plugin commands too
    assert listed["serve"] == "run a gateway node"
    assert listed["bench"].startswith("load the gateway")
    assert "the following arguments are required" not in err
    assert "imgw COMMAND --help" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["--version"], capsys)
    assert rc == 0
    assert out.strip() == f"imgw {importlib.metadata.version('imgw')}"


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        (["serve", "--prot", "17070"], "usage: imgw serve", "--prot 17070 (did you mean --port?)"),
        (
            ["chat", "--uid", "1", "--peer", "2", "--adr", "h:1"],
            "usage: imgw chat",
            "(did you mean --addr?)",
        ),
        (
            ["token", "--uid", "1", "--device", "d", "--ttl=5", "--kidd", "k"],
            "usage: imgw token",
            "(did you mean --kid?)",
        ),
        (
            ["db", "migrate", "--stor=x", "--sards", "2"],
            "usage: imgw db migrate",
            "(did you mean --shards?)",
        ),
        (["drain", "--admni", "h:1"], "usage: imgw drain", "(did you mean --admin?)"),
    ],
)
def test_a_mistyped_option_shows_the_commands_usage(
    argv: list[str], usage: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run(argv, capsys)
    assert rc == 2
    assert err.startswith(usage), err
    assert "usage: imgw [-h]" not in err
    assert "error: unrecognized arguments: " in err and hint in err, err


def test_an_unknown_top_level_option_lists_the_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, _, err = run(["--prot", "1"], capsys)
    assert rc == 2
    assert err.startswith("imgw: unknown option --prot\nusage: imgw COMMAND")
    assert "  serve  " in err
