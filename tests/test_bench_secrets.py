"""The bench keeps the secrets of the gateway it spawns off command lines and out of
what it prints: URLs and the token key reach `imgw serve` and `imgw db migrate` by
environment, and its log lines show them masked."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

import bench.common
from bench.common import Gateway, GatewaySpec

SECRETS = ("db-s3cret", "cache-s3cret", "bus-s3cret", "key-s3cret")


class FakeServe:
    made: list[FakeServe] = []

    def __init__(self, args: list[str], **kw: Any) -> None:
        self.args, self.env, self.pid = args, kw.get("env") or {}, 4242
        FakeServe.made.append(self)

    def start(self, timeout: float, ready: Any = None) -> None:
        pass


def test_the_spawned_gateway_gets_its_secrets_by_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs: list[tuple[list[str], dict[str, str]]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        runs.append((cmd, kw["env"]))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bench.common, "ServeProcess", FakeServe)
    monkeypatch.setattr(bench.common.subprocess, "run", run)
    spec = GatewaySpec(
        store="mysql://bench:db-s3cret@127.0.0.1:3306/", cache="redis://u:cache-s3cret@h:6379/0",
        bus="amqp://bench:bus-s3cret@127.0.0.1:5672/", servers=["127.0.0.1:3307"],
    )  # fmt: skip
    gw = Gateway(spec, tmp_path, "bench", "key-s3cret")
    gw.migrate(10)
    gw.start(10)
    (serve,) = FakeServe.made
    (migrate, migrate_env), *_ = runs
    shown = " ".join([*serve.args, *migrate, capsys.readouterr().err])
    assert not [s for s in SECRETS if s in shown], shown
    assert "mysql://bench:***@127.0.0.1:3306/imgw_bench_" in shown  # the log line
    assert serve.env["IMGW_TOKEN_KEYS"] == "bench:key-s3cret"
    assert (serve.env["IMGW_STORE"], serve.env["IMGW_CACHE"], serve.env["IMGW_BUS"]) == (
        gw.store, gw.cache, spec.bus,
    )  # fmt: skip
    assert migrate_env["IMGW_STORE"] == gw.store
    # the shard servers without credentials: migrate takes the store's
    servers = migrate[migrate.index("--servers") + 1]
    assert servers.startswith("mysql://127.0.0.1:3306/imgw_bench_") and "@" not in servers
