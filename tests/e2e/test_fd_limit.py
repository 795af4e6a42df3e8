"""A worker at its open-file limit: it admits connections only up to the limit minus a
reserve, refuses the rest at once, says so in its log, and keeps answering on the admin
port and its logged-in clients (instead of failing accept() and every new store, cache
or admin socket with EMFILE)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.net.openfiles import connection_cap
from protocol.frames import Ping, Pong
from tests.e2e.test_admin import http
from tests.support.proc import GatewayProcess, free_port
from tests.support.wire import Wire

NOFILE = 200
CAP = connection_cap(10**6, NOFILE)  # 136: 64 descriptors kept for the rest


CAPS = "the open-file limit caps the connections this process can hold"


def cap_lines(gw: GatewayProcess) -> list[str]:
    """The log's lines about the cap, from the level on, up to the open-file limit."""
    lines = gw.log.read_text().splitlines()
    return [line.split(" ", 1)[1].split(" open_file_limit=")[0] for line in lines if CAPS in line]


async def test_connections_are_capped_below_the_open_file_limit(tmp_path: Path) -> None:
    admin = free_port()
    gw = GatewayProcess(tmp_path / "data", None, "--admin-port", str(admin), nofile=NOFILE).start()
    held: list[Wire] = []
    try:
        # the start-up probe took a slot for a moment: wait until it is given back
        for _ in range(50):
            if "imgw_connections 0.0" in (await http(admin, "GET", "/metrics"))[1]:
                break
            await asyncio.sleep(0.05)
        held = [await Wire.login(gw.port, uid) for uid in range(1, CAP + 1)]
        refused = [await Wire.open(gw.port) for _ in range(5)]
        for w in refused:
            assert await w.closed(timeout=5) == []  # closed before anything was sent
        assert await http(admin, "GET", "/healthz") == (200, "ok\n")
        assert f"imgw_connections {float(CAP)}" in (await http(admin, "GET", "/metrics"))[1]
        await held[0].send(Ping())
        assert isinstance(await held[0].wait_for(Pong), Pong)
        await held.pop().close()  # a slot is free again
        for _ in range(50):
            if f"imgw_connections {float(CAP - 1)}" in (await http(admin, "GET", "/metrics"))[1]:
                break
            await asyncio.sleep(0.05)
        held.append(await Wire.login(gw.port, 999))
        # at the default --max-connections the cap is news, not a warning
        assert cap_lines(gw) == [f"[info     ] {CAPS} configured=1000000 max_connections={CAP}"]
    finally:
        for w in held:
            await w.close()
        gw.kill()


def test_the_cap_is_a_warning_only_below_a_max_connections_asked_for(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "data", None, "--max-connections", "5000", nofile=2000)
    try:
        gw.start()
    finally:
        gw.kill()
    cap = connection_cap(5000, 2000)
    assert cap_lines(gw) == [
        f"[warning  ] {CAPS}; raise it (ulimit -n, LimitNOFILE=) or run more workers "
        f"configured=5000 max_connections={cap}"
    ]
