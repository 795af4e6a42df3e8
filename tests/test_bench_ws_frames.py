"""The bench's own WebSocket client framing (bench.wsclient) against the `websockets`
library's sans-I/O server: what the generators write is what a server reads, and what a
server writes they read, whatever the cut points. No sockets."""

from __future__ import annotations

import msgpack
import pytest
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol

from bench.ws_probe import LOGIN_OK_BODY, answer
from bench.wsclient import (
    OP_BINARY,
    OP_CLOSE,
    PING_BODY,
    PONG_BODY,
    ClientFramer,
    Handshake,
    WsError,
    WsWire,
    parse_ws_addr,
    read_frames,
)

SIZES = (0, 1, 2, 125, 126, 127, 65535, 65536, 70_000)


def opened_pair() -> tuple[Handshake, ServerProtocol]:
    client = Handshake("127.0.0.1", 7400)
    server = ServerProtocol(max_size=None)
    server.receive_data(client.request())
    [request] = server.events_received()
    assert isinstance(request, Request) and request.path == "/ws"
    server.send_response(server.accept(request))
    assert client.receive(b"".join(server.data_to_send())) == []
    return client, server


@pytest.mark.parametrize("size", SIZES)
def test_a_server_reads_each_masked_frame_as_one_binary_message(size: int) -> None:
    _, server = opened_pair()
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    server.receive_data(ClientFramer().frame(payload))
    [frame] = server.events_received()
    assert isinstance(frame, Frame)
    assert (frame.opcode, frame.fin, bytes(frame.data)) == (Opcode.BINARY, True, payload)


def test_the_constant_ping_is_a_ping_frame_body() -> None:
    _, server = opened_pair()
    wire = WsWire()
    server.receive_data(wire.ping * 3)
    frames = server.events_received()
    assert [bytes(f.data) for f in frames if isinstance(f, Frame)] == [PING_BODY] * 3
    assert msgpack.unpackb(PING_BODY) == [3]


def test_server_frames_are_read_whole_at_every_cut_point() -> None:
    _, server = opened_pair()
    bodies = [PONG_BODY, b"x" * 200, b"y" * 70_000, LOGIN_OK_BODY]
    for body in bodies:
        server.send_binary(body)
    stream = b"".join(server.data_to_send())
    for cut in (*range(0, 12), 300, 70_010, len(stream) - 1):
        got, rest = read_frames(stream[:cut])
        more, rest = read_frames(rest + stream[cut:])
        assert rest == b""
        assert [p for _, p in got + more] == bodies


def test_one_byte_at_a_time() -> None:
    _, server = opened_pair()
    server.send_binary(LOGIN_OK_BODY)
    server.send_binary(PONG_BODY)
    buf, got = b"", []
    for byte in b"".join(server.data_to_send()):
        frames, buf = read_frames(buf + bytes([byte]))
        got += frames
    assert got == [(OP_BINARY, LOGIN_OK_BODY), (OP_BINARY, PONG_BODY)] and buf == b""


def test_the_wire_answers_a_close_with_a_close_and_reads_the_pong_as_it_arrives() -> None:
    _, server = opened_pair()
    wire = WsWire()
    server.send_binary(PONG_BODY)
    first = server.data_to_send()[0]
    assert first == wire.pong  # bench.holders compares a read with it before parsing
    server.send_close(1001, "going away")
    frames, rest, reply = wire.split(b"".join(server.data_to_send()))
    assert frames == [] and rest == b""
    server.receive_data(reply)
    [close] = server.events_received()
    assert isinstance(close, Frame) and close.opcode is Opcode.CLOSE
    assert close.data[:2] == (1001).to_bytes(2, "big")


@pytest.mark.parametrize(
    "bad",
    [
        bytes((0x82, 0x82)) + b"abcd" + b"xx",  # masked: servers must not mask
        bytes((0x02, 0x01)) + b"x",  # fragmented
        bytes((0x81, 0x01)) + b"x",  # text
        bytes((0xC2, 0x01)) + b"x",  # RSV1 without an extension
    ],
)
def test_what_a_server_must_not_send_is_refused(bad: bytes) -> None:
    with pytest.raises(WsError):
        read_frames(bad)


def test_a_refused_handshake_raises() -> None:
    client = Handshake("127.0.0.1", 7400, "/nowhere")
    server = ServerProtocol()
    server.receive_data(client.request())
    server.events_received()
    server.send_response(server.reject(404, "not found"))
    with pytest.raises(WsError, match="handshake refused"):
        client.receive(b"".join(server.data_to_send()))


def test_a_close_frame_echoes_the_status_code() -> None:
    framer = ClientFramer(b"\x01\x02\x03\x04")
    frames, _ = read_frames(bytes((0x88, 0x02)) + (1000).to_bytes(2, "big"))
    assert frames == [(OP_CLOSE, (1000).to_bytes(2, "big"))]
    assert framer.close(frames[0][1])[:2] == bytes((0x88, 0x82))


def test_ws_addresses() -> None:
    assert parse_ws_addr("127.0.0.1:7071") == ("127.0.0.1", 7071, "/ws")
    assert parse_ws_addr("ws://10.0.0.5:80/chat") == ("10.0.0.5", 80, "/chat")
    assert parse_ws_addr("ws://10.0.0.5:80") == ("10.0.0.5", 80, "/ws")
    with pytest.raises(ValueError, match="only ws://"):
        parse_ws_addr("wss://10.0.0.5:443/ws")


def test_the_probe_answers_login_ping_and_send_only() -> None:
    from protocol.codec import encode_body
    from protocol.frames import Login, Send, Sync

    assert answer(PING_BODY) == PONG_BODY
    assert answer(encode_body(Login(1, 1, 7, "d", "t"))) == LOGIN_OK_BODY
    send = encode_body(Send(2, 1, "m", 1, b"x" * 100))
    assert answer(send) == send
    assert answer(encode_body(Sync(1, 0, 0, 1))) is None
