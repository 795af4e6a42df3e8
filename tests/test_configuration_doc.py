"""docs/configuration.md names every setting: each field of the gateway's `Config`, each
key of imgw.example.toml and each flag of `imgw serve` appears in the flag or env column
of one of its settings tables (as `--flag`, `IMGW_NAME` or the file/env-only `name`),
and every name there is a setting the gateway reads. The page is where a newcomer looks;
a setting added to the code without a row fails here."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from gateway.cli import build_parser
from gateway.config import Config, setting_name

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
TABLE_HEADER = "| flag | env | default | meaning |"
SETTING_LINE = re.compile(r"^# ([a-z][a-z0-9-]*) = ")


def table_rows() -> list[str]:
    """The rows of every settings table of docs/configuration.md (each table starts
    with TABLE_HEADER and its separator line, and ends at the first line that is not
    a row)."""
    lines = DOC.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == TABLE_HEADER]
    assert starts, f"{DOC.relative_to(ROOT)} has no settings table"
    rows = []
    for start in starts:
        for line in lines[start + 2 :]:
            if not line.startswith("|"):
                break
            rows.append(line)
    assert len(rows) > 30, "the settings tables were not found whole"
    return rows


def table_names() -> tuple[set[str], set[str]]:
    """The settings the tables name in their flag and env columns, and the names there
    that are no setting."""
    named: set[str] = set()
    unknown: set[str] = set()
    for row in table_rows():
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


def config_fields() -> set[str]:
    return {field.name for field in dataclasses.fields(Config)}


def test_every_setting_has_a_row() -> None:
    named, _ = table_names()
    settings = config_fields() | example_settings() | serve_settings()
    missing = sorted(settings - named)
    assert not missing, f"docs/configuration.md's settings tables have no row for {missing}"


def test_every_name_in_the_tables_is_a_setting() -> None:
    _, unknown = table_names()
    assert not unknown, f"docs/configuration.md's settings tables name no setting: {unknown}"
