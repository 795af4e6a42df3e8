"""Every `imgw serve` flag has a TOML key (spelled as the flag, or with underscores) and
an environment variable that set the same thing, and imgw.example.toml lists every
setting at its default."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from gateway.cli import build_parser, config_from_args
from gateway.config import Config, ConfigError, load, setting_name

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "imgw.example.toml"
SETTING_LINE = re.compile(r"^# ([a-z][a-z0-9-]*) = (.+)$")


def serve_flags() -> list[argparse.Action]:
    parser = build_parser()
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "serve"
    ]
    return [a for a in serve._actions if a.option_strings and a.dest not in ("help", "config")]


def sample(action: argparse.Action) -> tuple[str, str]:
    """A value for the flag that is not its default: as typed, and as TOML."""
    if action.choices:
        value = str(list(action.choices)[-1])
        return value, f'"{value}"'
    if action.type is int:
        return "7", "7"
    if action.type is float:
        return "7.5", "7.5"
    return "k7:s7", '"k7:s7"'


FLAGS = serve_flags()


@pytest.mark.parametrize("action", FLAGS, ids=[a.option_strings[0] for a in FLAGS])
def test_every_flag_has_a_toml_and_an_environment_spelling(
    action: argparse.Action, tmp_path: Path
) -> None:
    flag = action.option_strings[0]
    typed, toml = sample(action)
    by_flag = config_from_args(build_parser().parse_args(["serve", flag, typed]))
    assert by_flag != Config(), f"{flag} {typed} changed nothing"
    key = flag.removeprefix("--")
    for spelling in (key, key.replace("-", "_")):
        f = tmp_path / "imgw.toml"
        f.write_text(f"{spelling} = {toml}\n")
        assert load(config_file=str(f), env={}) == by_flag, spelling
    env = {"IMGW_" + key.replace("-", "_").upper(): typed}
    assert load(env=env) == by_flag, env


def test_token_key_in_a_file_as_the_help_says(tmp_path: Path) -> None:
    f = tmp_path / "imgw.toml"
    for text in ('token-key = "x:y"', 'token_key = "x:y"', 'token-keys = ["x:y"]'):
        f.write_text(text + "\n")
        assert load(config_file=str(f), env={}).token_keys == ("x:y",), text


def test_a_misspelt_key_names_the_one_meant(tmp_path: Path) -> None:
    f = tmp_path / "imgw.toml"
    f.write_text("admin-prot = 9\n")
    with pytest.raises(
        ConfigError, match=r"unknown setting 'admin-prot' .*did you mean admin-port"
    ):
        load(config_file=str(f), env={})


def example_settings() -> dict[str, str]:
    lines = EXAMPLE.read_text().splitlines()
    return dict(m.groups() for line in lines if (m := SETTING_LINE.match(line)))


def test_the_example_file_lists_every_setting_at_its_default(tmp_path: Path) -> None:
    listed = example_settings()
    uncommented = tmp_path / "imgw.toml"
    uncommented.write_text("".join(f"{k} = {v}\n" for k, v in listed.items()))
    assert load(config_file=str(uncommented), env={}) == Config()  # the values are defaults
    names = [setting_name(key) for key in listed]
    fields = {f.name for f in dataclasses.fields(Config)}
    assert sorted(n or "" for n in names) == sorted(fields)  # each setting once


def test_the_example_file_loads_as_it_ships() -> None:
    assert load(config_file=str(EXAMPLE), env={}) == Config()
