"""What `imgw` says to someone finding their way: bare `imgw`, `--version`, and a
mistyped option of a command (issue 16, items 5 and 7)."""

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
    assert set(listed) == {*cli.BUILTIN_COMMANDS, "bench"}  # the plugin command too
    assert listed["serve"] == "run a gateway node"
    assert listed["bench"].startswith("load the gateway")
    assert "the following arguments are required" not in err
    assert "imgw COMMAND --help" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["--version"], capsys)
    assert rc == 0
    assert out.strip() == f"imgw {importlib.metadata.version('imgw')}"
