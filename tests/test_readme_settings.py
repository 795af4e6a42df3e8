"""The README's settings table names every setting: each key of imgw.example.toml and
each flag of `imgw serve` appears in its flag or env column (as `--flag`, `IMGW_NAME` or
the file/env-only `name`), and every name there is a setting the gateway reads. The
table is where a newcomer looks; a setting added to the code without a row fails here."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gateway.cli import build_parser
from gateway.config import setting_name

ROOT = Path(__file__).resolve().parent.parent
SETTING_LINE = re.compile(r"^# ([a-z][a-z0-9-]*) = ")


def table_names() -> tuple[set[str], set[str]]:
    """The settings the README's settings table names in its flag and env columns, and
    the names there that are no setting."""
    text = (ROOT / "README.md").read_text()
    start = text.index("| flag | env | default | meaning |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    assert len(rows) > 30, "the settings table was not found whole"
    named: set[str] = set()
    unknown: set[str] = set()
    for row in rows:
        flag_cell, env_cell = row.strip("|").split("|")[:2]
        if flag_cell.strip().startswith("(command)"):
            continue
        for code in re.findall(r"`([^`]+)`", flag_cell + env_cell):
            for word in re.split(r"[\s=/,]+", code):
                if not re.fullmatch(r"(--|IMGW_)?[A-Za-z][A-Za-z0-9_-]*", word):
                    continue  # a value: KID:SECRET, kid:s, HOST:PORT
                if word.isupper() and not word.startswith("IMGW_"):
                    continue  # a metavariable: N, D, KID
                name = setting_name(word.removeprefix("--").removeprefix("IMGW_"))
                (named if name else unknown).add(name or word)
    return named, unknown


def example_settings() -> set[str]:
    keys = set()
    for line in (ROOT / "imgw.example.toml").read_text().splitlines():
        if m := SETTING_LINE.match(line):
            name = setting_name(m.group(1))
            assert name, f"imgw.example.toml: {m.group(1)} is no setting"
            keys.add(name)
    return keys


def serve_settings() -> set[str]:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    names = set()
    for action in subs.choices["serve"]._actions:
        if action.dest in ("help", "config"):
            continue
        name = setting_name(action.dest)
        assert name, f"imgw serve {action.option_strings[0]} sets no setting"
        names.add(name)
    return names


def test_every_setting_has_a_row() -> None:
    named, _ = table_names()
    settings = example_settings() | serve_settings()
    missing = sorted(settings - named)
    assert not missing, f"README.md's settings table has no row for {missing}"


def test_every_name_in_the_table_is_a_setting() -> None:
    _, unknown = table_names()
    assert not unknown, f"README.md's settings table names what is no setting: {unknown}"
