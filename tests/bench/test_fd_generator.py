"""The lean generator (bench.fdholders) on real sockets: against a scripted gateway
that answers each uid its own way (held with PONGs split across writes, a login
refused, a connection closed before its login, a kick), and an `imgw bench connect`
run, which the driver puts on this path."""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from bench.fdholders import PONG, FdHolders, serves
from bench.holders import HolderSpec
from protocol.codec import encode
from protocol.frames import Error, Kick, LoginOk
from protocol.ops import ErrorCode, KickReason, Op

UID0 = 1000
HELD, REFUSED, CLOSED, KICKED = 0, 1, 2, 3  # connection i's uid is UID0 + i
LOGIN_OK = encode(LoginOk(1, "n1", 30, 90, 65536, 8192, 0))


class ScriptedGateway:
    """Answers LOGIN by uid; PINGs with a PONG written in two parts, 20 ms apart."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.listener.getsockname()[1]
        self.stopping = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conns: list[socket.socket] = []
        try:
            while not self.stopping:
                ready = select.select([self.listener, *conns], [], [], 0.1)[0]
                for s in ready:
                    if s is self.listener:
                        conns.append(s.accept()[0])
                        continue
                    try:
                        keep = self.answer(s, s.recv(4096))
                    except OSError:  # the generator's stop: RST
                        keep = False
                    if not keep:
                        conns.remove(s)
                        s.close()
        finally:
            for s in conns:
                s.close()
            self.listener.close()

    def answer(self, s: socket.socket, data: bytes) -> bool:
        """Answer what `s` sent; False closes it."""
        if not data:
            return False
        if data[5] == Op.LOGIN:  # a fixarray, then the op
            who = msgpack.unpackb(data[4:])[2]["uid"] - UID0
            if who == REFUSED:
                s.sendall(encode(Error(1, ErrorCode.AUTH_FAILED, "no")))
                return False
            if who == CLOSED:
                return False
            s.sendall(LOGIN_OK)
            if who == KICKED:
                s.sendall(encode(Kick(KickReason.DRAINING, "bye", "")))
                return False
            return True
        for _ in range(data.count(b"\x91\x03")):  # PINGs
            s.sendall(PONG[:3])
            time.sleep(0.02)
            s.sendall(PONG[3:])
        return True

    def close(self) -> None:
        self.stopping = True
        self.thread.join(5)


@pytest.fixture
def gateway() -> Iterator[ScriptedGateway]:
    gw = ScriptedGateway()
    yield gw
    gw.close()


def spec(port: int, count: int, **kw: Any) -> HolderSpec:
    base: dict[str, Any] = dict(
        idx=0, host="127.0.0.1", port=port, kid="k1", secret="s", uid0=UID0, count=count,
        src_ip="127.77.0.1", ramp_per_s=1000.0, hb_s=1, sync=False, reconnect=False,
        backoff_base_s=0.1, backoff_cap_s=1.0, max_pending=50, sock_buf=4096,
        deadline_ns=time.monotonic_ns() + 60 * 10**9,
    )  # fmt: skip
    base.update(kw)
    return HolderSpec(**base)


def run_for(s: HolderSpec, seconds: float) -> tuple[Any, ...]:
    """Run FdHolders for `seconds`, stop it, and return its last progress report."""
    parent, child = mp.Pipe()
    out: queue.Queue[tuple[Any, ...]] = queue.Queue()
    gen = FdHolders(s, child, out)
    thread = threading.Thread(target=gen.run, daemon=True)
    thread.start()
    time.sleep(seconds)
    parent.send(("stop",))
    thread.join(10)
    assert not thread.is_alive()
    reports = []
    while not out.empty():
        m = out.get_nowait()
        if m[0] == "progress":
            reports.append(m)
    return reports[-1]


def test_each_outcome_is_counted_as_its_kind(gateway: ScriptedGateway) -> None:
    report = run_for(spec(gateway.port, 5), 3.0)
    (_, _, started, held, logins, drops, errors, kicks, rss, rss0, gave_up, pongs) = report[:12]
    assert started == 5
    # HELD and the fifth connection (uid 4) are held; KICKED logs in, is kicked and
    # dropped, and is tried again (a login resets its tries): each time a login, a kick
    # and a drop
    assert held == 2
    # (the stop may fall between a login and its kick, or a kick and its close)
    assert drops >= 2 and drops <= kicks["draining"] <= drops + 1
    assert 2 + drops <= logins <= 3 + drops
    # REFUSED and CLOSED are tried CONNECT_TRIES times each, then given up
    assert errors == {"auth_failed": 5, "closed_before_login": 10}
    assert gave_up == 2
    # one PING a second to each held connection, each PONG read in two parts
    assert pongs >= 4
    assert rss > 0 and rss0 > 0


def test_a_refused_connect_is_counted_and_retried() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again: nothing listens there
    # each retry after a full-jitter backoff: short here, so that all five tries fit
    report = run_for(spec(port, 2, backoff_base_s=0.01, backoff_cap_s=0.05), 1.0)
    started, held, errors, gave_up = report[2], report[3], report[6], report[10]
    assert (started, held) == (2, 0)
    assert errors == {"connect_ConnectionRefusedError": 10} and gave_up == 2


def test_stop_closes_every_connection(gateway: ScriptedGateway) -> None:
    report = run_for(spec(gateway.port, 1), 1.0)
    assert report[3] == 1  # held until the stop


def test_the_driver_runs_plain_tcp_on_this_path() -> None:
    assert serves(spec(1, 1))
    assert not serves(spec(1, 1, tls=True)) and not serves(spec(1, 1, ws_path="/ws"))


def test_connect_run_holds_and_pings_through_the_lean_path(tmp_path: Path) -> None:
    out = tmp_path / "connect.json"
    cmd = [
        sys.executable, "-m", "gateway.cli", "bench", "connect", "--spawn-gateway",
        "--connections", "3000", "--ramp", "3000", "--hold", "4", "--hb", "2",
        "--no-charts", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    r = json.loads(out.read_text())
    assert (r["connections_held"], r["drops"], r["errors"]) == (3000, 0, 0)
    # every held connection PINGed once per 2 s through a 4 s hold: ~6,000 answered
    assert r["pings_answered"] >= 4000
    assert 0 < r["generator_rss_per_conn_bytes"] < 800
