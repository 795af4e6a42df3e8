"""gateway.redact: URL credentials and known secrets are masked in URLs, command lines,
free text and log events (both formats, the standard library's records too); the
command line of a process is masked in place."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from gateway.cli import DEV_KEY
from gateway.cli.cmdline import masked_args
from gateway.config import Config
from gateway.logs import configure
from gateway.redact import (
    MASK,
    PUBLIC,
    REDACTOR,
    Redactor,
    config_secrets,
    redact_argv,
    redact_url,
    url_secrets,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:***@127.0.0.1:5672/"),
        ("mysql://imgw:s3cr%40t@db:3306/imgw?pool=8", "mysql://imgw:***@db:3306/imgw?pool=8"),
        ("mysql://imgw:p@ss@db/imgw", "mysql://imgw:***@db/imgw"),  # an unquoted '@'
        ("redis://:hunter22@127.0.0.1:6379/0?prefix=a:", "redis://:***@127.0.0.1:6379/0?prefix=a:"),
        ("redis+cluster://u:pw@h1:7001,h2:7002/", "redis+cluster://u:***@h1:7001,h2:7002/"),
        (
            "mysql://u:pw1@a/db?replica=mysql://u:pw2@b/db",
            "mysql://u:***@a/db?replica=mysql://u:***@b/db",
        ),
        (
            "mysql://u@a/db?replica=mysql%3A%2F%2Fu%3Apw2%40b%2Fdb",
            "mysql://u@a/db?replica=mysql%3A%2F%2Fu%3A***%40b%2Fdb",
        ),
        (
            "s3://bucket/p?endpoint=http://127.0.0.1:9000&secret_key=ab/c+d",
            "s3://bucket/p?endpoint=http://127.0.0.1:9000&secret_key=***",
        ),
        ("https://hooks.example/in?token=t0k3n&x=1", "https://hooks.example/in?token=***&x=1"),
        # nothing to hide: the same string
        ("mysql://root:@127.0.0.1:3306/imgw", "mysql://root:@127.0.0.1:3306/imgw"),
        ("mysql://root@127.0.0.1/imgw", "mysql://root@127.0.0.1/imgw"),
        ("local://", "local://"),
        ("file:///var/lib/imgw/media", "file:///var/lib/imgw/media"),
        ("http://127.0.0.1:8080/hook?a&b=", "http://127.0.0.1:8080/hook?a&b="),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown  # idempotent
    if "%3A%2F%2F" not in url:  # free text: no URL decoding (config_secrets has them)
        assert Redactor().text(f"failed on '{url}' (refused)") == f"failed on '{shown}' (refused)"


def test_url_secrets() -> None:
    assert url_secrets("amqp://guest:guest@h/") == {"guest"}
    assert url_secrets("mysql://u:s3cr%40t@h/db") == {"s3cr%40t", "s3cr@t"}
    assert url_secrets("mysql://u:a@h/db?replica=mysql://u:b@h2/db") == {"a", "b"}
    assert url_secrets("s3://b/p?secret_key=x+y") == {"x+y", "x y"}
    assert url_secrets("redis://127.0.0.1:6379/0?prefix=p:") == set()


def test_config_secrets() -> None:
    cfg = Config(
        token_keys=("k1:first-secret", "k2:second:with:colons"),
        store="mysql://imgw:store-pw@db/imgw",
        cache="redis://u:cache-pw@r:6379/0",
        bus="amqp://imgw:bus-pw@mq:5672/",
        admin_token="admin-tok",
        notify_url="https://u:notify-pw@hooks/in",
        notify_token="notify-tok",
        check_url="https://hooks/check?token=check-tok",
        media="s3://bucket/p?endpoint=http://s3:9000",
        media_secret="media-secret-16bytes",
    )
    assert config_secrets(cfg) == {
        "first-secret", "second:with:colons", "store-pw", "cache-pw", "bus-pw",
        "admin-tok", "notify-pw", "notify-tok", "check-tok", "media-secret-16bytes",
    }  # fmt: skip
    assert config_secrets(Config()) == set()


def test_redact_argv() -> None:
    argv = [
        "imgw", "serve", "--token-key", "k1:s3cret", "--admin-token=adm1n",
        "--store", "mysql://u:pw@db/imgw", "--tls-key", "/etc/imgw/key.pem",
        "--media-secret", "0123456789abcdef", "--token-leeway", "60", "--key", "dev:x",
    ]  # fmt: skip
    assert redact_argv(argv) == [
        "imgw", "serve", "--token-key", "k1:***", "--admin-token=***",
        "--store", "mysql://u:***@db/imgw", "--tls-key", "/etc/imgw/key.pem",
        "--media-secret", "***", "--token-leeway", "60", "--key", "dev:***",
    ]  # fmt: skip


def test_redactor_masks_known_values_but_not_short_or_public_ones() -> None:
    r = Redactor(["hunter22", "pw", *PUBLIC])
    assert r.text("hunter22 and pw and hunter22x") == "*** and pw and ***x"
    assert DEV_KEY.partition(":")[2] in PUBLIC  # the dev key's warning names it
    assert r.text(DEV_KEY) == DEV_KEY
    r.add(["hunter2"])  # a secret inside a longer one: the longer is masked whole
    assert r.text("hunter22 hunter2") == "*** ***"
    event = {"event": "x hunter22", "n": 3, "items": ["hunter22", 1], "e": ValueError("hunter22")}
    assert r(None, "info", event) == {
        "event": "x ***", "n": 3, "items": ["***", 1], "e": "ValueError('***')",
    }  # fmt: skip


def test_masked_args_keep_their_length() -> None:
    args = [b"imgw", b"--store", b"mysql://u:longpassword@db/x", b"--admin-token", b"ab1"]
    shown = masked_args(args)
    assert [len(a) for a in shown] == [len(a) for a in args]
    assert shown[2].rstrip() == b"mysql://u:***@db/x"
    assert shown[4] == b"***"  # the mask is longer than nothing: all MASK characters
    assert masked_args([b"--admin-token", b"x"]) == [b"--admin-token", MASK[0].encode()]


def test_a_process_command_line_is_masked_in_place() -> None:
    code = (
        "import sys; from gateway.cli.cmdline import hide_secrets; print(hide_secrets()); "
        "print(open('/proc/self/cmdline', 'rb').read().hex()); print(sys.argv[2])"
    )
    argv = [sys.executable, "-c", code, "--store", "mysql://u:hunter22@db/x", "--admin-token"]
    done = subprocess.run(
        [*argv, "t0ps3cret"], capture_output=True, text=True, cwd=ROOT, timeout=30, check=True
    )
    changed, cmdline, argv_value = done.stdout.split()
    shown = bytes.fromhex(cmdline)
    assert changed == "True"
    assert b"hunter22" not in shown and b"t0ps3cret" not in shown
    assert b"mysql://u:***@db/x" in shown
    assert argv_value == "mysql://u:hunter22@db/x"  # the program still has its arguments


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_logs_mask_secrets_in_both_formats(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    REDACTOR.add(["known-s3cret"])
    try:
        configure(fmt, "info")
        structlog.get_logger("imgw").warning(
            "cannot start", error="amqp://u:url-pw@mq/ refused", token="known-s3cret"
        )
        try:
            raise ConnectionError("redis://:trace-pw@r:6379/0 is down")
        except ConnectionError:
            logging.getLogger("asyncio").exception("a driver's record with known-s3cret")
        err = capsys.readouterr().err
    finally:
        configure("console", "warning")  # as tests/conftest.py has it
    for secret in ("url-pw", "known-s3cret", "trace-pw"):
        assert secret not in err
    lines = err.strip().splitlines()
    if fmt == "json":
        events = [json.loads(line) for line in lines]
        assert events[0]["error"] == "amqp://u:***@mq/ refused"
        assert events[1]["logger"] == "asyncio" and "redis://:***@r" in events[1]["exception"]
    else:
        assert "amqp://u:***@mq/ refused" in err and "[asyncio]" in err


def test_an_uncaught_exception_is_printed_masked() -> None:
    code = (
        "from gateway.logs import configure; configure(); "
        "raise ValueError('cannot open mysql://u:hunter22@db/x')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert done.returncode == 1
    assert done.stderr.endswith("ValueError: cannot open mysql://u:***@db/x\n")
