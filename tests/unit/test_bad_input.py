"""Bad values for every command's address and number options end in a usage error (exit
status 2, one line saying what is wrong), never in a Python traceback.

The commands run in-process through `gateway.cli.main`, so an exception that escapes is
the test's failure; one subprocess run checks what a user's terminal shows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway import cli

BAD = [
    # imgw serve: numbers and addresses (checked before anything listens)
    ("serve --port 99999", "port must be 1..65535"),
    ("serve --port -1", "port must be 1..65535"),
    ("serve --port x", "invalid int value"),
    ("serve --admin-port 99999", "admin_port must be 1..65535"),
    ("serve --admin-port -1", "admin_port must be 1..65535"),
    ("serve --reconnect-hint foo", "reconnect_hint: bad address 'foo'"),
    ("serve --reconnect-hint lb:0", "reconnect_hint: bad address"),
    ("serve --max-connections -5", "max_connections must be at least 1"),
    ("serve --max-connections 0", "max_connections must be at least 1"),
    ("serve --max-frame 0", "max_frame must be at least 1"),
    ("serve --max-content -1", "max_content must be at least 1"),
    ("serve --hb -3", "need 0 < hb < idle"),
    ("serve --idle 0", "need 0 < hb < idle"),
    ("serve --login-timeout nan", "login_timeout must be a number above 0"),
    ("serve --login-timeout 0", "login_timeout must be a number above 0"),
    ("serve --recall-window -1", "recall_window must be a number above 0"),
    ("serve --shutdown-timeout inf", "shutdown_timeout must be a number above 0"),
    ("serve --check-timeout-ms nan", "check_timeout_ms must be a number above 0"),
    ("serve --batch-delay-ms nan", "batch_delay_ms must be a number >= 0"),
    ("serve --batch-wait-ms -1", "batch_wait_ms must be a number >= 0"),
    ("serve --batch-max 0", "batch_max >= 1"),
    ("serve --batch-min 0", "batch_min >= 1"),
    ("serve --batch-inflight -1", "batch_inflight >= 0"),
    ("serve --rate-burst 0", "rate_burst >= 1"),
    ("serve --rate-per-s nan", "rate_per_s > 0"),
    ("serve --workers 0", "workers >= 1"),
    ("serve --drain-rate -1", "drain_rate >= 0"),
    ("serve --drain-rate nan", "must be finite"),
    ("serve --sync-hint-spread nan", "must be finite"),
    ("serve --node-lease 0", "node_lease_s must be at least 2"),
    ("serve --route-check nan", "route_check_s must be a positive number"),
    ("serve --log-level loud", "log_level must be one of"),
    # imgw token
    ("token --uid 0 --device d", "--uid must be a positive integer"),
    ("token --uid x --device d", "invalid int value"),
    ("token --uid 1 --device d --ttl 0", "--ttl must be a positive number"),
    ("token --uid 1 --device d --ttl -5", "--ttl must be a positive number"),
    # imgw db migrate (the address is refused before any connection is tried)
    ("db migrate --store mysql://u@h:99999/d", "Port out of range"),
    ("db migrate --store mysql://u@h:3306/d?pool=x", "bad option"),
    ("db migrate --store mysql://u@h:3306/d --shards 0", "--shards must be 1..1024"),
    ("db migrate --store mysql://u@h:3306/d --shards x", "invalid int value"),
    ("db migrate --store mysql://u@h:3306/d --servers mysql://h:99999/d", "Port out of range"),
    ("db status --store mysql://u@h:99999/d", "Port out of range"),
    ("db status --store sqlite:///x.db", "pass --store mysql://"),
    ("db add-server mysql://h2:3306/d --store mysql://u@h:99999/d", "Port out of range"),
    ("db add-server mysql://h2:99999/d --store mysql://u@h:3306/d", "URL: "),
    ("db add-server mysql://h2:3306/d --store mysql://u@h:3306/d --take 0", "--take must be"),
    ("db add-server mysql://h2:3306/d --store mysql://u@h:3306/d --grace nan", "--grace must"),
    # imgw drain
    ("drain --admin 127.0.0.1", "--admin: bad address '127.0.0.1'"),
    ("drain --admin nowhere", "--admin: bad address"),
    ("drain --admin h:99999", "--admin: bad address"),
    ("drain --admin h:1 --hint foo", "--hint: bad address"),
    ("drain --admin h:1 --rate -1", "--rate must be a finite number >= 0"),
    ("drain --admin h:1 --rate nan", "--rate must be a finite number >= 0"),
    ("drain --admin h:1 --timeout nan", "--timeout must be a number of seconds"),
    ("drain --pid 0", "--pid must be a positive process id"),
    ("drain --pid -1", "--pid must be a positive process id"),
    ("drain --pid x", "invalid int value"),
    # imgw revoke
    ("revoke --admin 127.0.0.1 --uid 1", "--admin: bad address"),
    ("revoke --admin h:1 --uid 0", "--uid must be a positive integer"),
    ("revoke --admin h:1 --uid x", "invalid int value"),
    # imgw chat
    ("chat --uid 1 --peer 2 --addr 127.0.0.1", "--addr: bad address '127.0.0.1'"),
    ("chat --uid 1 --peer 2 --addr :x", "--addr: bad address"),
    ("chat --uid 1 --peer 2 --addr h:70000", "--addr: bad address"),
    ("chat --uid 1 --peer 2 --addr ,", "--addr: no gateway address given"),
    ("chat --uid 0 --peer 2", "--uid must be a positive integer"),
    ("chat --uid 1 --peer 0", "--peer and --group must be positive"),
    ("chat --uid 1 --group -4", "--peer and --group must be positive"),
    ("chat --uid 1 --peer x", "invalid int value"),
    ("chat --uid 1 --create-group t --members a,b", "--members must be uids"),
    ("chat --uid 1 --peer 2 --key nocolon", "--key must be KID:SECRET"),
    ("chat --uid 1 --create-group team", "--create-group needs --members UID,UID"),
    ("chat --uid 1 --create-group team --members 1", "--create-group needs --members"),
    # imgw bench (a plugin command with its own parser)
    ("bench connect --addr 127.0.0.1 --token-key a:b", "--addr: bad address"),
    ("bench connect --addr h:1 --token-key a:b --connections -1", "--connections >= 1"),
]


@pytest.fixture(autouse=True)
def _no_settings_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the command line counts; and a case that slipped through must not serve."""
    import gateway.server
    import gateway.supervisor

    def refuse(*_: object) -> int:
        raise AssertionError("bad input was accepted: the gateway was about to start")

    monkeypatch.setattr(gateway.server, "run", refuse)
    monkeypatch.setattr(gateway.supervisor, "supervise", refuse)
    for name in [n for n in os.environ if n.startswith("IMGW_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize(("argv", "says"), BAD, ids=[a for a, _ in BAD])
def test_bad_values_are_usage_errors(
    argv: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = cli.main(argv.split())
    except SystemExit as e:  # argparse's own errors
        rc = e.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert says in err, err
    assert "Traceback" not in out + err


def test_chat_without_a_port_says_so_in_one_line() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "chat", "--uid", "1", "--peer", "2",
         "--addr", "127.0.0.1"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "imgw chat: --addr: bad address '127.0.0.1': expected HOST:PORT, e.g. 127.0.0.1:7070"
    ]
