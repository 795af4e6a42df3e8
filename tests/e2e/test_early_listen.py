"""The client port is bound before the backends are opened (gateway/net/listen.py): a client
that connects while a node starts waits in the backlog and is served once the node is
ready, instead of being refused and backing off."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.net.listen import bind_listener
from gateway.node import Node
from gateway.server import Server
from gateway.supervisor import Supervisor
from protocol.frames import Login, LoginOk
from tests.conftest import make_config as make_config
from tests.support.wire import Wire, token


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_client_connecting_while_the_node_opens_its_backends_is_served_once_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready = asyncio.Event()
    node_start = Node.start

    async def slow_start(self: Node) -> None:
        await ready.wait()  # the backends take their time
        await node_start(self)

    monkeypatch.setattr(Node, "start", slow_start)
    port = free_port()
    server = Server(make_config(tmp_path, port=port))
    starting = asyncio.create_task(server.start())
    try:
        for _ in range(100):  # until start() has bound the port
            await asyncio.sleep(0.02)
            try:
                w = await Wire.open(port)
                break
            except ConnectionRefusedError:
                continue
        else:
            raise AssertionError("the port was refused throughout the start")
        await w.send(Login(1, 1, 7, "d1", token(7, "d1")))
        assert await w.quiet(0.3) == []  # not served yet: the node is not ready
        assert not starting.done()
        ready.set()
        await asyncio.wait_for(starting, 10)
        assert isinstance(await w.recv(timeout=5), LoginOk)
    finally:
        ready.set()
        if not starting.done():
            await starting
        await server.shutdown()


async def test_a_node_that_cannot_start_frees_the_port_it_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing_start(self: Node) -> None:
        raise OSError("no backend")

    monkeypatch.setattr(Node, "start", failing_start)
    port = free_port()
    server = Server(make_config(tmp_path, port=port))
    with pytest.raises(OSError, match="no backend"):
        await server.start()
    with pytest.raises(ConnectionRefusedError):
        await Wire.open(port)
    if server.backends is not None:
        await server.backends.store.close()


def test_the_supervisor_binds_every_workers_socket_on_one_port_before_starting_them(
    tmp_path: Path,
) -> None:
    port = free_port()
    sup = Supervisor(make_config(tmp_path, port=port, workers=3))
    sup.bind_listeners()
    try:
        assert sorted(sup.listeners) == [0, 1, 2]
        assert {s.getsockname()[1] for s in sup.listeners.values()} == {port}
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # completed by the kernel into a backlog: no worker runs yet
    finally:
        for s in sup.listeners.values():
            s.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_on_a_port_in_use_says_so_and_exits_1(tmp_path: Path, workers: int) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        # (workers share a route store and a bus; nothing reaches them: the port fails first)
        shared = [
            "--store",
            "mysql://root:@127.0.0.1:1/none",
            "--cache",
            "redis://127.0.0.1:1/0",
            "--bus",
            "amqp://guest:guest@127.0.0.1:1/",
        ]
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port),
             "--workers", str(workers), "--data-dir", str(tmp_path / "data"),
             *(shared if workers > 1 else [])],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1, done
    assert "cannot listen" in done.stderr + done.stdout, done


async def test_a_node_whose_admin_port_is_held_waits_for_it_then_serves(
    tmp_path: Path,
) -> None:
    """A worker started after a crash finds its admin port still held by the killed
    predecessor until that one's exit has closed its sockets: it waits for the port,
    taking no client meanwhile, then serves those that waited in the backlog."""
    port = free_port()
    listener = bind_listener("127.0.0.1", port, reuse_port=False, backlog=16)
    assert listener is not None
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    admin_port = busy.getsockname()[1]
    w = await Wire.open(port)  # completed by the kernel into the backlog
    await w.send(Login(1, 1, 7, "d1", token(7, "d1")))
    server = Server(make_config(tmp_path, port=port, admin_port=admin_port), listener=listener)
    starting = asyncio.create_task(server.start())
    try:
        assert await w.quiet(0.5) == []  # not served while the admin port is held
        assert not starting.done()
        busy.close()  # the predecessor's exit completes
        await asyncio.wait_for(starting, 10)
        assert isinstance(await w.recv(timeout=5), LoginOk)
    finally:
        busy.close()
        if not starting.done():
            starting.cancel()
        await server.shutdown()


async def test_a_node_that_cannot_bind_its_admin_port_takes_no_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose admin port stays held fails to start; the clients waiting in the
    shared backlog must not be taken by it (and then be left without an answer, or
    answered `internal` when its store closes under their SYNC)."""
    monkeypatch.setattr("gateway.server.ADMIN_BIND_WAIT_S", 0.3)
    port = free_port()
    listener = bind_listener("127.0.0.1", port, reuse_port=False, backlog=16)
    assert listener is not None
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        w = await Wire.open(port)  # completed by the kernel into the backlog
        await w.send(Login(1, 1, 7, "d1", token(7, "d1")))
        server = Server(
            make_config(tmp_path, port=port, admin_port=busy.getsockname()[1]), listener=listener
        )
        with pytest.raises(OSError):
            await server.start()
        # Never served: reset with the listener, nothing written to it.
        assert await w.closed(timeout=5) == []
    if server.backends is not None:
        await server.backends.store.close()
