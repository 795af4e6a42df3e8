"""Configuration precedence (file < env < flags), validation messages, the token command."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.cli import build_parser, config_from_args
from gateway.config import ConfigError, load
from protocol.token import KeyRing, verify_token


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "imgw.toml"
    f.write_text('port = 9001\nhb = 20\nidle = 60\ntoken-keys = ["a:1"]\n')
    env = {"IMGW_PORT": "9002", "IMGW_TOKEN_KEYS": "k1:s1,k2:s2"}
    cfg = load({"hb": 10}, config_file=str(f), env=env)
    assert (cfg.port, cfg.hb, cfg.idle, cfg.token_keys) == (9002, 10, 60, ("k1:s1", "k2:s2"))
    assert len(cfg.keyring()) == 2


def test_flags_parse_into_config() -> None:
    args = build_parser().parse_args(
        ["serve", "--port", "7171", "--token-key", "a:x", "--token-key", "b:y", "--data-dir", "/d"]
    )
    cfg = config_from_args(args)
    assert (cfg.port, cfg.token_keys) == (7171, ("a:x", "b:y"))
    assert cfg.store_url() == "sqlite:////d/imgw.db"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({}, "no token keys"),
        ({"token_keys": ("bad kid!:x",)}, "bad token key"),
        ({"token_keys": ("k:s",), "hb": 80}, "hb < idle"),
        ({"token_keys": ("k:s",), "store": "nonsense"}, "must be a URL"),
        ({"token_keys": ("k:s",), "workers": 2}, "needs a shared route store and bus"),
        ({"token_keys": ("k:s",), "drain_rate": -1}, "drain_rate >= 0"),
        (  # an upload URL still valid once its row may be swept would store an untracked file
            {"token_keys": ("k:s",), "media": "s3://b", "media_url_ttl": 86_400},
            "media_url_ttl must end an hour before media_orphan_s",
        ),
    ],
)
def test_validation_says_what_to_do(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(overrides, env={}).validate()


def test_unknown_file_setting_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "imgw.toml"
    f.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'prot'"):
        load(config_file=str(f), env={})


def test_token_command_mints_a_verifiable_token() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "token", "--uid", "7", "--device", "ios",
         "--kid", "k1", "--secret", "s3cret", "--ttl", "60"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    claims = verify_token(out, KeyRing.parse("k1:s3cret"), uid=7, device="ios", now=time.time())
    assert claims.uid == 7 and time.time() < claims.exp <= time.time() + 61


def test_serve_refuses_public_host_without_keys() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin"},
    )  # fmt: skip
    assert res.returncode == 2 and "--token-key" in res.stderr


def test_cluster_flags_parse_into_config() -> None:
    args = build_parser().parse_args(
        ["serve", "--workers", "4", "--drain-rate", "500", "--reconnect-hint", "lb:7070",
         "--sync-hint-spread", "2.5", "--cache", "redis://h/0", "--bus", "amqp://h/"]
    )  # fmt: skip
    cfg = config_from_args(args)
    assert (cfg.workers, cfg.drain_rate, cfg.reconnect_hint) == (4, 500.0, "lb:7070")
    assert cfg.sync_hint_spread_s == 2.5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "say which node: --admin HOST:PORT or --pid PID"),
        (["--pid", "999999999"], "no process 999999999"),
        (["--pid", "1", "--rate", "5"], "--rate and --hint need --admin"),
        (["--admin", "127.0.0.1:1"], "cannot reach the admin port 127.0.0.1:1"),
    ],
)
def test_drain_command_errors_say_what_to_do(argv: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "drain", *argv], capture_output=True, text=True
    )
    assert out.returncode == 1
    assert message in out.stderr
