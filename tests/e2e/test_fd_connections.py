"""Plain-TCP connections as bare file descriptors (`--client-transport fd`,
gateway/net/fdtransport.py): what the gateway relied on uvloop's transports for still holds."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from gateway.net.fdtransport import FdTransport
from protocol.frames import Login, LoginOk, Ping, Pong
from tests.conftest import StartGateway
from tests.support.wire import Wire, token

pytestmark = pytest.mark.backends("embedded")


@pytest.mark.parametrize("transport", ["uvloop", "fd"])
async def test_connections_from_one_address_past_its_limit_are_closed(
    start_gateway: StartGateway, transport: str
) -> None:
    """--max-connections-per-ip needs each connection's peer address, which the node
    keeps only then (and the bare transport reads from its socket)."""
    gw = await start_gateway(max_connections_per_ip=2, client_transport=transport)
    a = await Wire.login(gw.port, 1)
    b = await Wire.login(gw.port, 2)
    third = await Wire.open(gw.port)
    assert await third.closed(timeout=5) == []  # closed at once, nothing written
    sock = socket.socket()
    sock.bind(("127.0.0.2", 0))  # another source address is let in
    sock.connect(("127.0.0.1", gw.port))
    other = Wire(*await asyncio.open_connection(sock=sock))
    Wire.opened.append(other)
    assert isinstance(await other.request(Login(0, 1, 3, "d1", token(3, "d1"))), LoginOk)
    for w in (a, b):
        await w.send(Ping())
        await w.wait_for(Pong)
    await a.close()  # its slot is given back
    for _ in range(100):
        fourth = await Wire.open(gw.port)
        if await fourth.quiet(0.05) == [] and not fourth.reader.at_eof():
            break
        await asyncio.sleep(0.02)
    assert isinstance(await fourth.request(Login(0, 1, 4, "d1", token(4, "d1"))), LoginOk)


async def test_a_client_that_half_closes_is_closed_and_forgotten(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(client_transport="fd")
    node = gw.node
    assert node is not None
    w = await Wire.login(gw.port, 7)
    conn = node.by_device[(7, "d1")]
    assert isinstance(conn.transport, FdTransport)
    # Nagle off, as on uvloop's transports (inherited from the listener on Linux)
    assert not os.get_blocking(conn.transport._fd)
    with socket.socket(fileno=os.dup(conn.transport._fd)) as accepted:
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    w.writer.write_eof()  # FIN: the gateway closes its side and forgets the session
    assert await w.closed(timeout=5) == []
    for _ in range(100):
        if (7, "d1") not in node.by_device:
            break
        await asyncio.sleep(0.02)
    assert (7, "d1") not in node.by_device and node.open_count == 0


async def test_a_reset_client_is_forgotten(start_gateway: StartGateway) -> None:
    gw = await start_gateway(client_transport="fd")
    node = gw.node
    assert node is not None
    sock = socket.create_connection(("127.0.0.1", gw.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    w = Wire(reader, writer)
    Wire.opened.append(w)
    assert isinstance(await w.request(Login(0, 1, 8, "d1", token(8, "d1"))), LoginOk)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()  # RST
    for _ in range(100):
        if (8, "d1") not in node.by_device:
            break
        await asyncio.sleep(0.02)
    assert (8, "d1") not in node.by_device and node.open_count == 0
