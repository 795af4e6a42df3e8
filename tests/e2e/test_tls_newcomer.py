"""TLS as a newcomer meets it: the recipe of docs/tls.md, run as written (openssl, imgw
serve, two imgw chat processes chatting over it); the mistakes one makes on the way,
each named by the client; and what the gateway tells its operator (the certificate's
names and expiry, a warning before it expires, failed handshakes in /metrics)."""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import os
import re
import shlex
import signal
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trustme
from structlog.testing import capture_logs

from gateway.client import Client, ConnectionLost
from gateway.client.link import TlsMismatch
from gateway.logs import configure
from gateway.server import Server
from tests.conftest import StartGateway
from tests.support.proc import free_port
from tests.support.wire import token

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tls.md"
WAIT_S = 20.0

pytestmark = pytest.mark.backends("embedded")


def recipe() -> list[str]:
    """The shell commands of docs/tls.md's first try, in order."""
    section = DOC.read_text().split("## A first try on one machine", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


class Proc:
    """A process of the recipe and the lines it printed so far."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    @classmethod
    async def start(cls, args: list[str], cwd: Path) -> Proc:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        return cls(proc)

    async def until(self, text: str) -> str:
        assert self.proc.stdout is not None
        for line in self.lines:
            if text in line:
                return line
        try:
            async with asyncio.timeout(WAIT_S):
                while line := (await self.proc.stdout.readline()).decode():
                    self.lines.append(line.rstrip("\n"))
                    if text in line:
                        return self.lines[-1]
        except TimeoutError:
            pass
        raise AssertionError(f"{text!r} not in output: {self.lines!r}")

    async def finish(self, stdin: bytes = b"") -> int:
        out, _ = await asyncio.wait_for(self.proc.communicate(stdin), WAIT_S)
        self.lines += out.decode().splitlines()
        assert self.proc.returncode is not None
        return self.proc.returncode


async def test_the_recipe_in_the_docs_chats_over_tls(tmp_path: Path) -> None:
    make_cert, serve, chat_1, chat_2 = recipe()
    assert make_cert.startswith("openssl req -x509")
    port = free_port()

    def here(command: str) -> list[str]:
        """The command as this checkout and a free port run it."""
        args = shlex.split(command.replace("7443", str(port)))
        assert args[0] == ".venv/bin/imgw", args
        return [sys.executable, "-m", "gateway.cli", *args[1:]]

    made = await Proc.start(shlex.split(make_cert), tmp_path)
    assert await made.finish() == 0, made.lines
    gateway = await Proc.start(here(serve), tmp_path)
    try:
        line = await gateway.until("imgw listening")
        assert "tls='on (localhost, 127.0.0.1; expires " in line
        assert "names='localhost, 127.0.0.1'" in await gateway.until("TLS on")
        two = await Proc.start(here(chat_2), tmp_path)
        await two.until("--- chat with 1")
        one = await Proc.start(here(chat_1), tmp_path)
        await one.until("--- chat with 2")
        assert one.proc.stdin is not None
        one.proc.stdin.write(b"hello over tls\n")
        await one.proc.stdin.drain()
        assert "1: hello over tls" in await two.until("hello over tls")
        assert await one.finish(b"/quit\n") == 0
        assert await two.finish(b"/quit\n") == 0

        # the same chat without TLS (--tls, and --ca that implies it): told what to add
        args = here(chat_1)
        ca = args.index("--ca")
        plain = await Proc.start([a for a in args[:ca] + args[ca + 2 :] if a != "--tls"], tmp_path)
        assert await plain.finish() == 1
        assert plain.lines[-1].endswith("this port speaks TLS: add --tls"), plain.lines
    finally:
        gateway.proc.send_signal(signal.SIGTERM)
        assert await gateway.finish() == 0


@pytest.fixture
def pki(tmp_path: Path) -> tuple[trustme.CA, Path, Path]:
    """A certificate that names localhost only, as one made for a laptop often does."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    chain, key = tmp_path / "chain.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    return ca, chain, key


async def _refusal(port: int, tls: ssl.SSLContext | None, host: str = "127.0.0.1") -> str:
    client = Client(f"{host}:{port}", 1, "d", token(1, "d"), tls=tls, reconnect=False)
    with pytest.raises(ConnectionLost) as caught:
        await asyncio.wait_for(client.connect(), WAIT_S)
    await client.close()
    assert isinstance(caught.value.__cause__, TlsMismatch)
    return str(caught.value)


def _failures(gw: Server) -> dict[str, int]:
    assert gw.cert_watch is not None
    return dict(gw.cert_watch.handshakes.failed)


async def test_tls_mistakes_are_named_and_counted(
    start_gateway: StartGateway, pki: tuple[trustme.CA, Path, Path]
) -> None:
    ca, chain, key = pki
    gw = await start_gateway(tls_cert=str(chain), tls_key=str(key))
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)

    said = await _refusal(gw.port, trusting)  # by an address the certificate lacks
    assert said.endswith("the certificate does not name 127.0.0.1 (it names localhost)")
    said = await _refusal(gw.port, None)  # plain TCP on the TLS port
    assert said.endswith("closed the connection at login: this port speaks TLS: add --tls")
    said = await _refusal(gw.port, ssl.create_default_context(), host="localhost")
    assert "the certificate is not trusted" in said and "--ca PEM" in said

    plain = await start_gateway()
    said = await _refusal(plain.port, trusting, host="localhost")
    assert said.endswith("answered in plain text: this port does not speak TLS; drop --tls")

    async with Client(f"localhost:{gw.port}", 2, "d", token(2, "d"), tls=trusting) as ok:
        await ok.ping()  # the right name and trust: it works

    # the gateway's side: the plain LOGIN failed its handshake; the clients that refused
    # the certificate (asyncio sends no alert) abandoned theirs, counted once freed
    async with asyncio.timeout(WAIT_S):
        while _failures(gw).get("abandoned", 0) < 2:
            gc.collect()
            await asyncio.sleep(0.05)
    assert _failures(gw) == {"wrong_version_number": 1, "abandoned": 2}
    metrics = gw.node.metrics.render().decode() if gw.node else ""
    assert 'imgw_tls_handshake_failures_total{reason="wrong_version_number"} 1.0' in metrics
    # the client's two probes (names, speaks TLS) and the chat that worked
    assert "imgw_tls_handshakes_total 3.0" in metrics
    assert "imgw_tls_certificate_expiry_timestamp_seconds" in metrics


@asynccontextmanager
async def _logged() -> AsyncIterator[list[dict[str, object]]]:
    """The events logged meanwhile, at info and up."""
    configure("console", "info")
    try:
        with capture_logs() as events:
            yield events
    finally:
        configure("console", "warning")  # as tests/conftest.py has it


async def test_a_certificate_about_to_expire_is_warned_of(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    ca = trustme.CA()
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=5, hours=1)
    cert = ca.issue_cert("localhost", "127.0.0.1", not_after=soon)
    chain, key = tmp_path / "soon.pem", tmp_path / "soon.key"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    async with _logged() as events:
        await start_gateway(tls_cert=str(chain), tls_key=str(key))
    by_event = {str(e["event"]): e for e in events}
    assert by_event["TLS on"]["names"] == "localhost, 127.0.0.1"
    assert by_event["TLS on"]["days_left"] == 5
    warning = next(e for e in events if "expires within 14 days" in str(e["event"]))
    assert warning["log_level"] == "warning" and warning["days_left"] == 5.0
    assert str(by_event["imgw listening"]["tls"]).startswith("on (localhost, 127.0.0.1; ")
