"""`imgw bench chat --push-sink`: the sink's tally (events, distinct ids, latency of the
window's events), the sink process answering over HTTP, the off/on comparison, and the
invocations the flag refuses. The end-to-end run is in tests/test_bench_cli.py."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from bench.cli import _check, build_parser
from bench.push_sink import CPU_RATIO_GOAL, SinkProcess, Tally, compare


def event(conv: int, seq: int, server_ms: float, recipients: int = 1) -> dict[str, Any]:
    return {"id": f"{conv}:{seq}", "server_ms": server_ms,
            "recipients": [{"uid": 2, "device": "d"}] * recipients}  # fmt: skip


def test_the_tally_counts_repeats_once_and_times_only_the_windows_events() -> None:
    t = Tally(1_000.0, 3_000.0)
    t.add([event(1, 1, 500.0), event(1, 2, 1_000.0)], now_ms=1_100.0)  # 1:1 before the window
    t.add([event(1, 2, 1_000.0), event(1, 3, 2_900.0, 2)], now_ms=3_050.0)  # 1:2 again; late
    s = t.stats()
    assert (s["posts"], s["events"], s["distinct"], s["recipients"]) == (2, 4, 3, 5)
    assert s["events_per_s"] == 1.0  # 2 of the events arrived inside the 2 s window
    assert s["window_events"] == 3  # 1:2 twice and 1:3: committed inside it
    # 100 and 2,050 ms for 1:2 (the repeat counts: it is a delivery), 150 ms for 1:3
    assert 149 <= s["latency_p50_ms"] <= 151 and 2049 <= s["latency_max_ms"] <= 2051


def test_the_sink_process_answers_posts_and_reports_them() -> None:
    sink = SinkProcess().start()
    try:
        sink.window(0, 1e15)
        body = json.dumps({"node": "n", "events": [event(5, 1, 1.0)]}).encode()
        with urllib.request.urlopen(sink.url, data=body, timeout=5) as resp:
            assert resp.status == 200
        assert sink.wait_for(1, timeout=5)["distinct"] == 1
        bad = urllib.request.Request(sink.url, data=b"[]", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(bad, timeout=5)
        assert e.value.code == 400
        e.value.close()
    finally:
        sink.stop()
    assert sink.proc is not None and sink.proc.returncode == 0


def test_the_comparison_gives_the_ratio_and_the_cost_of_an_event() -> None:
    off = {"steps": [{"rate_target": 2000.0, "gateway_cpu_us_per_msg": 200.0,
                      "acked_per_s": 2000.0, "acked": 40_000}]}  # fmt: skip
    sink = {"events_per_s": 1000.0, "distinct": 40_000, "messages_acked": 40_000, "missing": 0,
            "latency_p99_ms": 150.0, "last_ms": 1.0}  # fmt: skip
    on = {"steps": [{"rate_target": 2000.0, "gateway_cpu_us_per_msg": 250.0,
                     "acked_per_s": 2000.0, "acked": 40_000, "push_sink": sink}]}  # fmt: skip
    cmp = compare(off, on)
    assert cmp["cpu_ratio"] == 1.25 and cmp["cpu_ratio_le_goal"] is (CPU_RATIO_GOAL >= 1.25)
    assert cmp["extra_gateway_cpu_us_per_event"] == 100.0  # 100,000 µs/s over 1,000 events/s
    assert cmp["event_p99_le_goal"] is True and "last_ms" not in cmp["on"]
    assert cmp["off"]["gateway_cpu_us_per_msg"] == 200.0 and len(cmp["steps"]) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--addr", "127.0.0.1:1", "--token-key", "k:s"], "it needs --spawn-gateway"),
        (["--spawn-gateway", "--preload", "1000"], "give one of them"),
        (["--spawn-gateway", "--gateway-arg=--push-url=http://x/"], "its own --push-url"),
    ],
)
def test_push_sink_refuses_what_it_cannot_measure(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    parsed = parser.parse_args(["chat", "--push-sink", *args])
    with pytest.raises(SystemExit):
        _check(parser, parsed)
    assert message in capsys.readouterr().err


def test_push_sink_parses_and_waits_longer() -> None:
    parser = build_parser()
    plain = parser.parse_args(["chat", "--spawn-gateway", "--rates", "2000"])
    _check(parser, plain)
    args = parser.parse_args(["chat", "--spawn-gateway", "--push-sink", "--rates", "2000"])
    _check(parser, args)
    assert args.push_sink and not plain.push_sink
    assert args.timeout == plain.timeout + 30  # the sink's wait after the step
