"""Smoke tests of the send benchmark: a tiny run end to end, on each backend.

They run `python -m bench.send_bench` as a subprocess (its own gateway, generator
process and, for MariaDB, a fresh database that it drops) and check the JSON report.
MariaDB must be up: when it is not, the test fails with how to start it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
MARIADB_HOW = (
    "start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid "
    "--exec /usr/sbin/mariadbd"
)
SMALL_RUN = ["--pairs", "10", "--rate", "200", "--duration", "2", "--warmup", "1"]


def run_bench(tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "send.json"
    cmd = [sys.executable, "-m", "bench.send_bench", "--spawn-gateway", *extra]
    cmd += [*SMALL_RUN, "--procs", "1", "--json", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"send_bench failed ({done.returncode}):\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def check_report(r: dict[str, Any]) -> None:
    assert r["scenario"] == "send"
    assert r["rate_target"] == 200
    assert r["acked"] > 0
    assert not r["errors"] or sum(r["errors"].values()) == 0, r["errors"]
    assert r["ack_p99_ms"] > 0
    assert r["push_p50_ms"] > 0
    assert r["gateway_exit_code"] == 0
    assert r["gateway_rss_bytes"] and r["gateway_rss_bytes"] > 0
    assert r["machine"]["nproc"] >= 1
    assert len(r["steps"]) == 1
    # CPU per operation, from the gateway's /proc/PID/stat over the measured window
    assert r["gateway_cpu_us_per_msg"] > 0
    assert r["loadgen_cpu_us_per_msg"] > 0


def test_send_bench_embedded(tmp_path: Path) -> None:
    r = run_bench(tmp_path, "--embedded", "--preload", "20000")
    check_report(r)
    assert r["backend"]["store"].startswith("sqlite:///")
    assert r["preload"]["messages"] == 20_000
    assert r["preload"]["conversations"] == 2_000


def test_send_bench_mariadb(tmp_path: Path) -> None:
    try:
        socket.create_connection(("127.0.0.1", 3306), timeout=2).close()
    except OSError as e:
        pytest.fail(f"MariaDB is not reachable on 127.0.0.1:3306 ({e}); start it: {MARIADB_HOW}")
    r = run_bench(tmp_path)
    check_report(r)
    assert r["mariadb_cpu_us_per_msg"] > 0
    store = r["backend"]["store"]
    assert store.startswith("mysql://") and "/imgw_bench_" in store
    name = store.rsplit("/", 1)[1]
    listed = subprocess.run(
        ["mysql", "-uroot", "-h127.0.0.1", "-N", "-e", "SHOW DATABASES"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if listed.returncode == 0:  # the bench drops the database it created
        assert name not in listed.stdout.split()
