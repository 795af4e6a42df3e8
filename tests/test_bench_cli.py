"""Smoke runs of every `imgw bench` scenario, end to end, small: the fixed interface
(`--json PATH` and its fields) that dashboards script against, the charts and report
beside it. The big runs are in bench/results/, not here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import require_port

REPO = Path(__file__).resolve().parents[1]
BASE_FIELDS = (
    "scenario", "connections_target", "connections_held", "drops", "duration_s",
    "gateway_pids", "gateway_rss_bytes", "gateway_rss_per_conn_bytes",
    "generator_rss_per_conn_bytes",
)  # fmt: skip
CHAT_FIELDS = (
    "rate_target", "acked", "errors", "ack_p50_ms", "ack_p99_ms", "push_p50_ms", "push_p99_ms",
)  # fmt: skip
PRODUCTION = [
    "--store", "mysql://root:@127.0.0.1:3306/", "--cache", "redis://127.0.0.1:6379/0",
    "--bus", "amqp://guest:guest@127.0.0.1:5672/", "--shards", "2",
]  # fmt: skip


def bench(tmp_path: Path, scenario: str, *args: str) -> dict[str, Any]:
    out = tmp_path / f"{scenario}.json"
    cmd = [sys.executable, "-m", "gateway.cli", "bench", scenario, "--spawn-gateway", *args]
    done = subprocess.run(
        [*cmd, "--json", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"imgw bench {scenario} failed:\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(out.read_text())
    for field in BASE_FIELDS:
        assert field in result, f"{field} missing from the {scenario} result"
    assert result["scenario"] == scenario and "error" not in result
    assert result["gateway_pids"] and result["gateway_rss_bytes"] > 0
    assert (tmp_path / f"{scenario}.md").read_text().startswith(f"# imgw bench {scenario}")
    for chart in result["charts"]:
        assert Path(chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the machine's speed around the run, so that runs of different days can be compared
    for when in ("before", "after"):
        speed = result["machine"]["calibration"][when]
        assert speed["python_loop_ns"] > 0 and speed["loopback_rtt_us"] > 0, speed
    assert "machine speed" in (tmp_path / f"{scenario}.md").read_text()
    return result


def test_connect_holds_every_connection(tmp_path: Path) -> None:
    r = bench(tmp_path, "connect", "--connections", "1500", "--ramp", "1500", "--hold", "2")
    assert (r["connections_target"], r["connections_held"], r["drops"]) == (1500, 1500, 0)
    assert 0 < r["gateway_rss_per_conn_bytes"] < 20_000
    assert 0 < r["generator_rss_per_conn_bytes"] < 20_000
    assert len(r["charts"]) == 2 and r["timeline"][-1]["held"] == 1500
    assert r["gateway_cpu_us_per_login"] > 0 and r["gateway_cpu_us_per_ping"] is not None
    assert r["generator_cpu_us_per_ping"] is not None


def test_connect_on_production_backends_with_two_workers(tmp_path: Path) -> None:
    for port, name in ((3306, "MariaDB"), (6379, "Redis"), (5672, "RabbitMQ")):
        require_port(port, name)
    r = bench(
        tmp_path, "connect", "--connections", "1000", "--ramp", "1000", "--hold", "2",
        "--workers", "2", *PRODUCTION,
    )  # fmt: skip
    assert r["gateway_workers"] == 2 and len(r["gateway_pids"]) == 3  # supervisor + 2
    assert (r["connections_held"], r["drops"]) == (1000, 0)
    assert r["gateway_exit_code"] == 0


def test_chat_reports_ack_and_push_latency(tmp_path: Path) -> None:
    r = bench(tmp_path, "chat", "--rate", "200", "--duration", "2", "--warmup", "1",
              "--procs", "1")  # fmt: skip
    for field in CHAT_FIELDS:
        assert field in r
    assert r["rate_target"] == 200 and r["acked"] >= 300 and r["errors"] == 0
    assert 0 < r["ack_p50_ms"] <= r["ack_p99_ms"] and 0 < r["push_p50_ms"] <= r["push_p99_ms"]
    assert r["gateway_cpu_us_per_msg"] > 0


def test_chat_volume_mode_compares_empty_and_preloaded(tmp_path: Path) -> None:
    r = bench(tmp_path, "chat", "--rate", "200", "--duration", "2", "--warmup", "1",
              "--procs", "1", "--preload", "30000", "--preload-convs", "3000")  # fmt: skip
    assert r["preload"] == {"messages": 30_000, "conversations": 3_000, "users": 3_001,
                            "seconds": r["preload"]["seconds"]}  # fmt: skip
    assert r["empty_store"]["preload"] is None and r["empty_store"]["acked"] >= 300
    step = r["volume_ratio"]["steps"][0]
    assert step["rate_target"] == 200
    acked = step["acked_per_s"]
    assert acked["empty"] > 0 and acked["preloaded"] > 0
    assert acked["ratio"] == round(acked["preloaded"] / acked["empty"], 3)
    assert "- volume: empty store → preloaded store" in (tmp_path / "chat.md").read_text()


def test_chat_push_sink_compares_push_off_and_on(tmp_path: Path) -> None:
    """Every uid's registered, offline device gets one event per message to it: as many
    events as messages acked, one recipient each; the gateway without push events first."""
    r = bench(tmp_path, "chat", "--rate", "100", "--duration", "2", "--warmup", "1",
              "--procs", "1", "--pairs", "5", "--push-sink")  # fmt: skip
    assert r["push_off"]["acked"] >= 150 and "push_sink" not in r["push_off"]["steps"][0]
    push = r["push"]
    on = push["on"]
    assert on["messages_acked"] >= 250 and on["distinct"] == on["messages_acked"]
    assert (on["missing"], on["recipients_per_event"]) == (0, 1.0)
    assert on["events_per_s"] > 0 and 0 < on["latency_p50_ms"] <= on["latency_p99_ms"]
    assert push["off"]["gateway_cpu_us_per_msg"] > 0 and push["cpu_ratio"] > 0
    assert "- push events:" in (tmp_path / "chat.md").read_text()


def test_push_rounds_alternate_off_and_on(tmp_path: Path) -> None:
    """--push-rounds 2: off, on, off, on; each round's ratio and their median."""
    r = bench(tmp_path, "chat", "--rate", "100", "--duration", "2", "--warmup", "1",
              "--procs", "1", "--pairs", "5", "--push-sink", "--push-rounds", "2")  # fmt: skip
    push = r["push"]
    assert len(push["rounds"]) == 2
    ratios = [row["cpu_ratio"] for row in push["rounds"]]
    assert all(x > 0 for x in ratios)
    assert push["cpu_ratio_median"] == round((ratios[0] + ratios[1]) / 2, 3)
    assert push["rounds"][-1]["cpu_ratio"] == push["cpu_ratio"]  # the rest: the last round
    assert "2 rounds of off then on" in (tmp_path / "chat.md").read_text()


def test_group_fans_out_to_every_member(tmp_path: Path) -> None:
    r = bench(tmp_path, "group", "--rate", "100", "--group-size", "4", "--duration", "2",
              "--warmup", "1", "--procs", "1")  # fmt: skip
    assert r["group_size"] == 4 and r["errors"] == 0
    assert r["pushes"] == 3 * r["acked"]  # every other member got each message
    assert r["gateway_cpu_us_per_push"] > 0


def test_storm_kill_every_client_comes_back(tmp_path: Path) -> None:
    r = bench(tmp_path, "storm", "--connections", "800", "--ramp", "2000", "--settle", "1",
              "--backoff-cap", "2")  # fmt: skip
    assert r["recovered"] and r["connections_held"] == 800
    assert r["relogins"] >= 800 and r["recovery_s"] > 0
    assert r["gateway_pids"] != r["gateway_pids_before"]  # a new gateway process
    assert r["syncs"] >= 800 and r["gateway_cpu_us_per_sync"] > 0


def test_offline_catch_up_is_complete(tmp_path: Path) -> None:
    r = bench(tmp_path, "offline", "--receivers", "50", "--messages", "20")
    assert r["acked"] == 1000 and r["missing"] == 0 and r["duplicates"] == 0
    assert r["messages_pulled"] == 1000 and r["catch_up_p99_ms"] > 0
    assert r["gateway_cpu_us_per_sync"] > 0 and r["gateway_cpu_us_per_catch_up"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["connect"], "give exactly one of --spawn-gateway and --addr"),
        (["connect", "--spawn-gateway", "--connections", "100000"], "need several gateway workers"),
        (["storm", "--addr", "127.0.0.1:1", "--token-key", "k:s"], "needs --spawn-gateway"),
        (
            ["chat", "--addr", "127.0.0.1:1", "--token-key", "k:s", "--preload"],
            "it needs --spawn-gateway",
        ),
    ],
)
def test_bad_invocations_say_what_to_do(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "bench", *args],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and message in done.stderr


def _gateways_under(path: Path) -> list[int]:
    """The pids of `imgw serve` processes whose command line names `path`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(path).encode() in cmdline and b"serve" in cmdline:
            found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_a_killed_bench_takes_its_gateway_down(tmp_path: Path) -> None:
    """The spawned gateway runs in a session of its own (a ^C reaches the bench only);
    a bench killed with SIGKILL, which can stop nothing, still leaves no gateway
    behind: the gateway gets SIGTERM when its parent dies, and exits."""
    run = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "bench", "connect", "--spawn-gateway",
         "--connections", "50", "--hold", "120", "--no-charts", "--json",
         str(tmp_path / "r.json")],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (gateways := _gateways_under(tmp_path)):
            assert time.monotonic() < deadline, "no gateway started"
            time.sleep(0.2)
        time.sleep(2)
    finally:
        run.kill()
        run.wait(10)
    deadline = time.monotonic() + 20
    while alive := [pid for pid in gateways if _running(pid)]:
        if time.monotonic() > deadline:
            for pid in alive:
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"gateway {alive} outlived the bench that started it")
        time.sleep(0.2)
