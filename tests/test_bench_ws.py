"""`imgw bench connect` and `imgw bench chat` over WebSocket (`--transport ws`), tiny, on
a spawned gateway with `--ws-listen`: the same JSON as over TCP, with `transport: ws`.

Skipped only where `imgw serve` has no `--ws-listen`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _serve_help() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.stdout


pytestmark = pytest.mark.skipif(
    "--ws-listen" not in _serve_help(), reason="imgw serve has no --ws-listen"
)


def bench(tmp_path: Path, scenario: str, *args: str) -> dict[str, Any]:
    out = tmp_path / f"{scenario}.json"
    cmd = [sys.executable, "-m", "gateway.cli", "bench", scenario, "--spawn-gateway"]
    cmd += ["--transport", "ws", *args, "--no-charts", "--json", str(out)]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"imgw bench {scenario} failed:\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["scenario"] == scenario and "error" not in result
    assert result["transport"] == "ws"
    assert result["gateway_exit_code"] == 0
    return result


def test_connect_over_websocket(tmp_path: Path) -> None:
    r = bench(tmp_path, "connect", "--connections", "200", "--ramp", "1000", "--hold", "2",
              "--hb", "1")  # fmt: skip
    assert (r["connections_target"], r["connections_held"], r["drops"]) == (200, 200, 0)
    assert r["errors"] == 0 and r["kicks"] == {}
    assert r["pings_answered"] >= 200  # a PING a second from each, answered over WebSocket
    assert r["gateway_rss_per_conn_bytes"] is not None
    assert r["gateway_cpu_us_per_ping"] is not None


def test_chat_over_websocket(tmp_path: Path) -> None:
    r = bench(tmp_path, "chat", "--rate", "100", "--pairs", "5", "--duration", "1",
              "--warmup", "0.5", "--procs", "1")  # fmt: skip
    assert r["acked"] >= 80 and r["errors"] == 0
    assert r["pushes"] == r["acked"]  # each message reached the other member
    assert 0 < r["ack_p50_ms"] <= r["ack_p99_ms"]
    assert r["gateway_cpu_us_per_msg"] > 0
