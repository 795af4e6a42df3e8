"""Secrets never leave the process: a gateway (a supervisor and 2 workers, JSON logs)
started with a password in each backend URL and every secret set, on the command line,
in the environment and in a config file; run through a login and a send (the content
check and the notify webhook both failing), its Redis and RabbitMQ cut for a while,
/metrics, /readyz, an API call, `imgw db status`; then gateways that fail to start
(console logs). Everything they printed and answered, and the command lines of the
supervisor and its workers, is searched for every secret.

The backends get users of their own for the test: a MariaDB user with a password and a
database, a Redis ACL user, a RabbitMQ user (rabbitmqctl); each is removed afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiomysql
import pytest
import redis.asyncio

from gateway.client import Client
from protocol.token import sign_token
from storage.mysql import MySQLSettings, migrate
from tests.conftest import StartGateway
from tests.support.proc import free_port
from tests.support.services import drop_redis, require_port
from tests.support.tcpproxy import TcpProxy

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0

pytestmark = pytest.mark.backends("embedded")


def _secret(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(8)}"


@dataclass
class Users:
    """The test's own users on the services, and the secrets of the run."""

    name: str = field(default_factory=lambda: f"imgw_st_{secrets.token_hex(4)}")
    database: str = field(default_factory=lambda: f"imgw_st_{secrets.token_hex(4)}")
    prefix: str = field(default_factory=lambda: f"imgwtest:{secrets.token_hex(6)}:")
    mysql_pw: str = field(default_factory=lambda: _secret("mysqlpw"))
    redis_pw: str = field(default_factory=lambda: _secret("redispw"))
    amqp_pw: str = field(default_factory=lambda: _secret("amqppw"))
    token_key: str = field(default_factory=lambda: _secret("tokenkey"))
    admin_token: str = field(default_factory=lambda: _secret("admintoken"))
    notify_pw: str = field(default_factory=lambda: _secret("notifypw"))
    notify_token: str = field(default_factory=lambda: _secret("notifytoken"))
    check_pw: str = field(default_factory=lambda: _secret("checkpw"))
    check_token: str = field(default_factory=lambda: _secret("checktoken"))
    media_secret: str = field(default_factory=lambda: _secret("mediasecret"))

    def all(self) -> dict[str, str]:
        return {k: v for k, v in vars(self).items() if k not in ("name", "database", "prefix")}

    def store(self, port: int = 3306) -> str:
        return f"mysql://{self.name}:{self.mysql_pw}@127.0.0.1:{port}/{self.database}?shards=2"


async def _run(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def _mysql_root(*statements: tuple[str, tuple[str, ...]]) -> None:
    conn = await aiomysql.connect(host="127.0.0.1", port=3306, user="root", password="")
    try:
        async with conn.cursor() as cur:
            for sql, params in statements:
                await cur.execute(sql, params or None)
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def service_users(users: Users) -> AsyncIterator[Users]:
    require_port(3306, "MariaDB")
    require_port(6379, "Redis")
    require_port(5672, "RabbitMQ")
    who = f"'{users.name}'@'127.0.0.1'"
    root_redis = redis.asyncio.Redis(host="127.0.0.1", port=6379)
    try:
        await _mysql_root(
            (f"CREATE DATABASE `{users.database}`", ()),
            (f"CREATE USER {who} IDENTIFIED BY %s", (users.mysql_pw,)),
            (f"GRANT ALL ON `{users.database}`.* TO {who}", ()),
        )
        await root_redis.execute_command(
            "ACL", "SETUSER", users.name, "reset", "on", f">{users.redis_pw}", "~*", "&*",
            "+@all",
        )  # fmt: skip
        for command in (
            ["add_user", users.name, users.amqp_pw],
            ["set_permissions", "-p", "/", users.name, ".*", ".*", ".*"],
        ):
            code, out = await _run("rabbitmqctl", *command)
            assert code == 0, f"rabbitmqctl {command[0]} failed: {out}"
        await migrate(MySQLSettings.from_url(users.store()))
        yield users
    finally:
        with contextlib.suppress(Exception):
            await drop_redis(f"redis://{users.name}:{users.redis_pw}@127.0.0.1:6379/0"
                             f"?prefix={users.prefix}")  # fmt: skip
        await root_redis.execute_command("ACL", "DELUSER", users.name)
        await root_redis.aclose()
        await _run("rabbitmqctl", "delete_user", users.name)
        await _mysql_root(
            (f"DROP USER IF EXISTS {who}", ()), (f"DROP DATABASE IF EXISTS `{users.database}`", ())
        )


def _http(url: str, token: str = "") -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            body: bytes = answer.read()
    except urllib.error.HTTPError as e:
        body = e.read()
    return body.decode(errors="replace")


def _ready(admin_ports: list[int]) -> bool:
    try:
        return all(_http(f"http://127.0.0.1:{p}/readyz") == "ready\n" for p in admin_ports)
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def _wait(what: str, check: Callable[[], object], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_no_secret_leaves_the_gateway(tmp_path: Path) -> None:
    users = Users()
    seen: dict[str, str] = {}  # where -> what it showed
    async with service_users(users):
        redis_proxy = TcpProxy("127.0.0.1", 6379)
        amqp_proxy = TcpProxy("127.0.0.1", 5672)
        await redis_proxy.start()
        await amqp_proxy.start()
        try:
            await _serve_and_use(tmp_path, users, redis_proxy, amqp_proxy, seen)
        finally:
            await redis_proxy.close()
            await amqp_proxy.close()
        code, seen["imgw db status"] = await _run(
            sys.executable, "-m", "gateway.cli", "db", "status", "--store", users.store()
        )
        assert code == 0 and f"{users.database}: schema" in seen["imgw db status"]
    failed, failed_secrets = await _failed_starts(tmp_path)
    seen.update(failed)
    leaks = {
        (kind, where)
        for kind, secret in {**users.all(), **failed_secrets}.items()
        for where, text in seen.items()
        if secret in text
    }
    assert not leaks, f"secrets shown: {sorted(leaks)}"
    for where, out in failed.items():  # each said why in a line, not a traceback
        assert "cannot start" in out or "imgw serve: " in out, (where, out)
        assert "Traceback" not in out, (where, out)
    # under log-format = json every line is JSON, the development key's warning first
    lines = [json.loads(line) for line in failed["failed start: bus down (JSON logs)"].splitlines()]
    assert "using the development key" in lines[0]["event"]
    assert lines[-1]["event"] == "cannot start"
    # what was shown instead: the URLs masked; the webhooks and backends did fail
    text = seen["gateway log"]
    assert f'"store": "mysql://{users.name}:***@127.0.0.1:3306/{users.database}?shards=2"' in text
    assert '"notify": "http://hook:***@127.0.0.1:' in text
    assert '"event": "content check failed"' in text
    assert '"event": "bus link lost"' in text
    assert '"logger": "aio_pika' in text  # the drivers' own records, as JSON lines too


async def _serve_and_use(
    tmp_path: Path, users: Users, redis_proxy: TcpProxy, amqp_proxy: TcpProxy, seen: dict[str, str]
) -> None:
    port, admin, closed = free_port(), free_port(), free_port()
    media = tmp_path / "media"
    config = tmp_path / "imgw.toml"
    config.write_text(
        f'media = "file://{media}"\nmedia-listen = "127.0.0.1:0"\n'
        f'media-secret = "{users.media_secret}"\n'
    )
    cache = f"redis://{users.name}:{users.redis_pw}@127.0.0.1:{redis_proxy.port}/0?prefix={users.prefix}"
    args = [
        sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
        "--port", str(port), "--data-dir", str(tmp_path / "data"), "--node-id", "secrets",
        "--store", users.store(), "--cache", cache,
        "--token-key", f"k1:{users.token_key}", "--admin-token", users.admin_token,
        "--admin-port", str(admin), "--workers", "2", "--log-format", "json",
        "--notify-url", f"http://hook:{users.notify_pw}@127.0.0.1:{closed}/notify",
        "--check-url", f"http://check:{users.check_pw}@127.0.0.1:{closed}/c?token={users.check_token}",
        "--route-check", "0.5",
    ]  # fmt: skip
    env = {
        **os.environ,
        "IMGW_BUS": f"amqp://{users.name}:{users.amqp_pw}@127.0.0.1:{amqp_proxy.port}/",
        "IMGW_NOTIFY_TOKEN": users.notify_token,
    }
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
    try:
        await _wait("both workers ready", lambda: _ready([admin, admin + 1]) or proc.returncode)
        assert proc.returncode is None, log_path.read_text()
        workers = _children(proc.pid)
        assert len(workers) == 2
        seen["cmdline supervisor"] = _cmdline(proc.pid)
        for i, pid in enumerate(workers):
            seen[f"cmdline worker {i}"] = _cmdline(pid)
        assert "mysql://" in seen["cmdline supervisor"]  # masked, not gone

        def token(uid: int) -> str:
            now = int(time.time())
            return sign_token("k1", users.token_key, uid, "d", now + 600, iat=now)

        async with Client(f"127.0.0.1:{port}", 1, "d", token(1)) as alice:
            conv = await alice.open_p2p(2)
            await alice.send(conv, b"checked by nobody, notified to nobody")
            for i in (0, 1):
                base = f"http://127.0.0.1:{admin + i}"
                seen[f"metrics {i}"] = await asyncio.to_thread(_http, f"{base}/metrics")
                seen[f"readyz {i}"] = await asyncio.to_thread(_http, f"{base}/readyz")
                seen[f"api {i}"] = await asyncio.to_thread(
                    _http, f"{base}/api/v1/users/1/conversations", users.admin_token
                )
            assert "imgw_sends_total" in seen["metrics 0"] + seen["metrics 1"]
            assert f'"conv_id": {conv}' in seen["api 0"].replace('"conv_id":', '"conv_id": ')
            # the route store and the bus go away for a while: failures are logged
            redis_proxy.cut()
            amqp_proxy.cut()
            await asyncio.sleep(3)
            redis_proxy.restore()
            amqp_proxy.restore()
            await asyncio.sleep(2)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), WAIT_S)
    seen["gateway log"] = log_path.read_text(errors="replace")
    assert proc.returncode == 0, seen["gateway log"]


async def _failed_starts(tmp_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Gateways that cannot start, each for a URL with a secret in it (console logs):
    what each printed, and the secrets."""
    closed = free_port()
    pw = {k: _secret(k) for k in ("badstore", "s3key", "deadbus", "ftp")}
    starts = {
        "bad store option": ["--store", f"mysql://u:{pw['badstore']}@127.0.0.1:3306/x?bogus=1"],
        "media URL with a key": [
            "--media", f"s3://b/p?endpoint=http://127.0.0.1:{closed}&secret_key={pw['s3key']}"],
        "bus down (JSON logs)": [
            "--bus", f"amqp://u:{pw['deadbus']}@127.0.0.1:{closed}/", "--log-format", "json"],
        "config error": ["--check-url", f"ftp://u:{pw['ftp']}@example.com/"],
    }  # fmt: skip
    serve = [sys.executable, "-m", "gateway.cli", "serve"]
    runs = [
        _run(*serve, "--port", str(free_port()), "--data-dir", str(tmp_path / f"f{i}"), *args)
        for i, args in enumerate(starts.values())
    ]
    seen = {}
    for (name, _), (code, out) in zip(starts.items(), await asyncio.gather(*runs), strict=True):
        assert code in (1, 2), out
        seen[f"failed start: {name}"] = out
    return seen, pw


async def test_a_generated_media_secret_is_masked_too(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    gw = await start_gateway(media=f"file://{tmp_path / 'media'}", media_listen="127.0.0.1:0")
    generated = (tmp_path / "data" / "media.secret").read_text().strip()
    assert len(generated) >= 16 and generated in gw.secrets()
