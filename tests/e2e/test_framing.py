"""Bad input at the framing level, and flow control: what closes and what is kept."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

import msgpack
import pytest

from gateway.server import Server
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.frames import (
    ConvOk,
    Error,
    Kick,
    Login,
    LoginOk,
    OpenP2P,
    Ping,
    Pong,
    Push,
    Send,
    SendAck,
)
from protocol.ops import ErrorCode, KickReason
from tests.conftest import StartGateway
from tests.support.waiting import wait_until
from tests.support.wire import Wire, token


def raw(obj: object) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


async def test_oversized_len_is_refused_before_the_body(gw: Server) -> None:
    w = await Wire.login(gw.port, 1)
    await w.write(struct.pack(">I", 65_537))  # the header only: no body is ever sent
    [err] = await w.closed()
    assert isinstance(err, Error) and (err.rid, err.code) == (0, ErrorCode.FRAME_TOO_LARGE)


async def test_frame_of_exactly_max_frame_is_accepted(start_gateway: StartGateway) -> None:
    gw = await start_gateway(max_frame=4096, max_content=2048)
    w = await Wire.login(gw.port, 1)
    # a PING padded with an extra element (ignored: forward compatibility)
    frame = msgpack.packb([3, b"x" * (4096 - 5)], use_bin_type=True)
    assert len(frame) == 4096, len(frame)
    await w.write(struct.pack(">I", len(frame)) + frame)
    assert isinstance(await w.recv(), Pong)


async def test_garbage_after_login_is_bad_frame_and_closes(gw: Server) -> None:
    w = await Wire.login(gw.port, 1)
    await w.write(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    [err] = await w.closed()
    assert isinstance(err, Error) and (err.rid, err.code) == (0, ErrorCode.BAD_FRAME)


async def test_garbage_before_login_is_bad_frame(gw: Server) -> None:
    w = await Wire.open(gw.port)
    await w.write(struct.pack(">I", 4) + b"\xc1junk"[:4])
    [err] = await w.closed()
    assert isinstance(err, Error) and (err.rid, err.code) == (0, ErrorCode.BAD_FRAME)


async def test_http_request_is_refused_by_its_length(gw: Server) -> None:
    w = await Wire.open(gw.port)
    await w.write(b"GET / HTTP/1.1\r\n\r\n")  # "GET " read as LEN is 1.2 GB
    [err] = await w.closed()
    assert isinstance(err, Error) and (err.rid, err.code) == (0, ErrorCode.FRAME_TOO_LARGE)


async def test_zero_len_and_trailing_bytes_are_bad_frame(gw: Server) -> None:
    trailing = msgpack.packb([3]) + b"\x00"
    not_array = msgpack.packb({"op": 3})
    for data in (
        struct.pack(">I", 0),
        struct.pack(">I", len(trailing)) + trailing,
        struct.pack(">I", len(not_array)) + not_array,
    ):
        w = await Wire.login(gw.port, 1)
        await w.write(data)
        [err] = await w.closed()
        assert isinstance(err, Error) and (err.rid, err.code) == (0, ErrorCode.BAD_FRAME)


async def test_unknown_op_and_server_op_keep_the_connection(gw: Server) -> None:
    w = await Wire.login(gw.port, 1)
    await w.write(raw([99, 7, "future"]))
    err = await w.recv()
    assert isinstance(err, Error) and (err.rid, err.code) == (7, ErrorCode.UNKNOWN_OP)
    await w.write(raw([11, 8, 1, 1, 1, 1]))  # SEND_ACK is a server op
    err = await w.recv()
    assert isinstance(err, Error) and (err.rid, err.code) == (8, ErrorCode.UNKNOWN_OP)
    await w.write(raw([99, "no-rid"]))
    err = await w.recv()
    assert isinstance(err, Error) and (err.rid, err.code) == (0, ErrorCode.UNKNOWN_OP)
    await w.send(Ping())
    assert isinstance(await w.recv(), Pong)


async def test_bad_fields_after_login_are_bad_request_and_kept(gw: Server) -> None:
    w = await Wire.login(gw.port, 1)
    await w.write(raw([10, 5, 1, "id", 1, "content must be bin"]))
    err = await w.recv()
    assert isinstance(err, Error) and (err.rid, err.code) == (5, ErrorCode.BAD_REQUEST)
    await w.write(raw([21, "x", 1]))  # DELIVERED has no rid
    err = await w.recv()
    assert isinstance(err, Error) and (err.rid, err.code) == (0, ErrorCode.BAD_REQUEST)
    await w.send(Ping())
    assert isinstance(await w.recv(), Pong)


@pytest.mark.parametrize("client_transport", ["uvloop", "fd"])
async def test_slow_consumer_is_kicked(start_gateway: StartGateway, client_transport: str) -> None:
    gw = await start_gateway(
        max_write_buffer=64 * 1024, rate_burst=100_000, rate_per_s=100_000,
        client_transport=client_transport,
    )  # fmt: skip
    sender = await Wire.login(gw.port, 1)
    # The receiver asks for a tiny receive buffer and never reads.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", gw.port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    slow = Wire(reader, writer)
    Wire.opened.append(slow)
    assert isinstance(await slow.request(Login(0, 1, 2, "slow", token(2, "slow"))), LoginOk)
    writer.transport.pause_reading()  # stop reading for real: the kernel buffers fill
    conv = await sender.request(OpenP2P(0, 2))
    assert isinstance(conv, ConvOk)
    for i in range(3000):
        await sender.send(Send(10_000 + i, conv.conv_id, f"flood-{i}", 1, b"z" * 2000))
        if i % 100 == 99:
            await sender.wait_for(SendAck, rid=10_000 + i, timeout=10)
            if (2, "slow") not in gw.node.by_device:  # type: ignore[union-attr]
                break
    assert (2, "slow") not in gw.node.by_device  # type: ignore[union-attr]
    assert gw.node.metrics.kicks.labels(reason="slow_consumer")._value.get() == 1  # type: ignore[union-attr]
    await sender.send(Ping())
    await sender.wait_for(Pong)
    # Once it reads again it gets whole frames (the undelivered rest is dropped), then
    # the KICK, then the close: the stream is never cut mid-frame.
    writer.transport.resume_reading()
    frames = await slow.closed(timeout=10)
    assert frames and all(isinstance(f, Push) for f in frames[:-1]), frames[-3:]
    last = frames[-1]
    assert isinstance(last, Kick) and last.reason == KickReason.SLOW_CONSUMER, last


async def test_interleaved_partial_frames_of_two_connections_stay_apart(gw: Server) -> None:
    """Whole frames of every connection go through the node's one shared decoder; a
    connection owns a decoder only while a partial frame of its own waits. Two clients
    whose frames arrive in interleaved pieces each get their own answer, and once the
    frames are complete neither holds a decoder."""
    node = gw.node
    assert node is not None
    a = await Wire.login(gw.port, 1)
    b = await Wire.login(gw.port, 2)
    conn_a, conn_b = node.by_device[(1, "d1")], node.by_device[(2, "d1")]
    assert conn_a.decoder is None and conn_b.decoder is None  # idle: none owned
    frame_a, frame_b = raw([50, 7, 3]), raw([50, 8, 4])  # OPEN_P2P with peers 3 and 4
    await a.write(frame_a[:5])
    await b.write(frame_b[:3])
    for _ in range(100):  # until both pieces have been read
        if conn_a.decoder is not None and conn_b.decoder is not None:
            break
        await asyncio.sleep(0.01)
    assert conn_a.decoder is not None and conn_b.decoder is not None
    assert len({id(conn_a.decoder), id(conn_b.decoder), id(node.decoder)}) == 3
    await b.write(frame_b[3:])
    await a.write(frame_a[5:])
    ok_a, ok_b = await a.recv(), await b.recv()
    assert isinstance(ok_a, ConvOk) and ok_a.rid == 7
    assert isinstance(ok_b, ConvOk) and ok_b.rid == 8 and ok_b.conv_id != ok_a.conv_id
    assert conn_a.decoder is None and conn_b.decoder is None  # complete: none owned


@pytest.mark.parametrize("client_transport", ["uvloop", "fd"])
async def test_a_slow_reader_gets_whole_frames_then_the_kick(
    start_gateway: StartGateway, client_transport: str
) -> None:
    """A client that reads, slowly (a few 100 KiB/s), and keeps sending PINGs gets whole
    frames, the KICK slow_consumer, and then a clean end of stream: not a reset, which
    would make its kernel drop what it had not read yet."""
    gw = await start_gateway(
        max_write_buffer=64 * 1024, rate_burst=100_000, rate_per_s=100_000,
        client_transport=client_transport,
    )  # fmt: skip
    node = gw.node
    assert node is not None
    sender = await Wire.login(gw.port, 1)
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", gw.port))
    try:
        await loop.sock_sendall(sock, encode(Login(1, 1, 2, "slow", token(2, "slow"))))
        # logged in before the flood: "not in by_device" below must mean kicked
        await wait_until(lambda: (2, "slow") in node.by_device, 10, "the slow reader's login")
        conv = await sender.request(OpenP2P(0, 2))
        assert isinstance(conv, ConvOk)
        for i in range(3000):  # until the slow one is kicked (nothing read meanwhile)
            await sender.send(Send(10_000 + i, conv.conv_id, f"flood-{i}", 1, b"z" * 2000))
            if i % 100 == 99:
                await sender.wait_for(SendAck, rid=10_000 + i, timeout=10)
                if (2, "slow") not in node.by_device:
                    break
        assert (2, "slow") not in node.by_device
        received = bytearray()
        deadline = loop.time() + 60
        while loop.time() < deadline:  # at most ~400 KiB/s, a PING every 0.2 s
            with contextlib.suppress(OSError):
                await loop.sock_sendall(sock, encode(Ping()))
            for _ in range(20):
                chunk = await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)
                if not chunk:
                    break
                received += chunk
                await asyncio.sleep(0.01)
            else:
                continue
            break
        else:
            raise AssertionError("the stream did not end within 60 s")
    finally:
        sock.close()
    frames = FrameDecoder(side=Side.CLIENT, max_frame=1 << 20).feed(bytes(received))
    assert isinstance(frames[0], LoginOk)
    assert all(isinstance(f, (Push, Pong)) for f in frames[1:-1]), frames[-3:]
    last = frames[-1]
    assert isinstance(last, Kick) and last.reason == KickReason.SLOW_CONSUMER, last
