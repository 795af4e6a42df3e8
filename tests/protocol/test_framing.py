"""Framing errors (docs/protocol.md, Frames): fatal, raised as FrameError; the decoder
is dead after one."""

from __future__ import annotations

import struct

import msgpack
import pytest

from protocol import frames as f
from protocol.codec import encode, encode_body, frame_bytes
from protocol.decoder import FrameDecoder, Side, decode_body
from protocol.errors import FrameError, ProtocolError
from protocol.ops import MAX_FRAME_DEFAULT, ErrorCode

PING = encode(f.Ping())


def header(size: int) -> bytes:
    return struct.pack(">I", size)


def feed_error(data: bytes, *, max_frame: int = MAX_FRAME_DEFAULT) -> FrameError:
    decoder = FrameDecoder(side=Side.SERVER, max_frame=max_frame)
    with pytest.raises(FrameError) as info:
        decoder.feed(data)
    return info.value


def send_of_body_size(size: int) -> f.Send:
    """A SEND whose body is exactly `size` bytes."""
    for pad in range(size, 0, -1):
        frame = f.Send(1, 2, "c", 1, b"x" * pad)
        if len(encode_body(frame)) == size:
            return frame
    raise AssertionError(size)


def test_too_large_is_refused_after_the_header_alone() -> None:
    decoder = FrameDecoder(side=Side.SERVER, max_frame=100)
    data = header(101)
    assert decoder.feed(data[:3]) == []
    with pytest.raises(FrameError) as info:
        decoder.feed(data[3:])  # no body byte sent
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert "101" in str(info.value)


def test_too_large_default_limit() -> None:
    assert feed_error(header(MAX_FRAME_DEFAULT + 1)).code is ErrorCode.FRAME_TOO_LARGE
    assert feed_error(header(0xFFFFFFFF)).code is ErrorCode.FRAME_TOO_LARGE


def test_body_of_exactly_max_frame_is_accepted() -> None:
    frame = send_of_body_size(MAX_FRAME_DEFAULT)
    data = encode(frame)
    assert len(data) == MAX_FRAME_DEFAULT + 4
    assert FrameDecoder(side=Side.SERVER).feed(data) == [frame]
    small = encode(f.Send(1, 2, "c", 1, b"abc"))
    assert FrameDecoder(side=Side.SERVER, max_frame=len(small) - 4).feed(small) != []
    err = feed_error(small, max_frame=len(small) - 5)
    assert err.code is ErrorCode.FRAME_TOO_LARGE


def test_len_zero_is_bad_frame() -> None:
    assert feed_error(header(0)).code is ErrorCode.BAD_FRAME


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(msgpack.packb([3]) + b"\xc0", id="trailing-nil"),
        pytest.param(msgpack.packb([3]) + msgpack.packb([3]), id="two-values"),
        pytest.param(b"\x93\x0a\x01", id="truncated-array"),
        pytest.param(b"\xc1", id="reserved-byte"),
        pytest.param(msgpack.packb({"op": 3}), id="map"),
        pytest.param(msgpack.packb(3), id="int"),
        pytest.param(msgpack.packb("ping"), id="str"),
        pytest.param(msgpack.packb(None), id="nil"),
        pytest.param(msgpack.packb([]), id="empty-array"),
        pytest.param(msgpack.packb([0]), id="op-0"),
        pytest.param(msgpack.packb([-1]), id="op-negative"),
        pytest.param(msgpack.packb([True]), id="op-true"),
        pytest.param(msgpack.packb(["x"]), id="op-str"),
        pytest.param(msgpack.packb([3.0]), id="op-float"),
        pytest.param(msgpack.packb([None, 1]), id="op-nil"),
        pytest.param(msgpack.packb([[3]]), id="op-array"),
        pytest.param(b"\x92\x0a\xa2\xff\xfe", id="invalid-utf8-str"),
        pytest.param(b"\x93\x01\x01\x81\xa2\xc3\x28\x01", id="invalid-utf8-map-key"),
        pytest.param(b"\x92\x03\x81\x90\x01", id="unhashable-map-key"),
        pytest.param(b"\xdd\xff\xff\xff\xff", id="array-len-beyond-body"),
        pytest.param(b"\x92\x03\xc6\x7f\xff\xff\xff", id="bin-len-beyond-body"),
        pytest.param(b"\x92\x03\xdf\x7f\xff\xff\xff", id="map-len-beyond-body"),
        pytest.param(b"\x92\x03\xd6\xff\x00", id="truncated-timestamp"),
        pytest.param(b"\x92\x03\xc7\x02\xff\x00\x00", id="bad-timestamp-length"),
        pytest.param(b"\x92\x03" + b"\x91" * 5000 + b"\xc0", id="deep-arrays"),
        pytest.param(b"\x92\x03" + b"\x81\x01" * 5000 + b"\xc0", id="deep-maps"),
    ],
)
def test_bad_bodies(body: bytes) -> None:
    err = feed_error(frame_bytes(body))
    assert err.code is ErrorCode.BAD_FRAME
    assert isinstance(err, ProtocolError)
    assert err.frames == []
    with pytest.raises(FrameError):
        decode_body(body, Side.SERVER)


def test_frames_before_the_error_ride_on_the_exception() -> None:
    send = f.Send(1, 2, "c", 1, b"x")
    data = PING + encode(send) + frame_bytes(msgpack.packb([77, 5])) + header(0) + PING
    err = feed_error(data)
    assert err.code is ErrorCode.BAD_FRAME
    assert err.frames == [
        f.Ping(),
        send,
        f.Invalid(77, 5, ErrorCode.UNKNOWN_OP, err.frames[2].text),
    ]


def test_frame_completed_from_the_buffer_rides_on_too_large() -> None:
    decoder = FrameDecoder(side=Side.SERVER, max_frame=100)
    assert decoder.feed(PING[:3]) == []
    with pytest.raises(FrameError) as info:
        decoder.feed(PING[3:] + header(101))
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert info.value.frames == [f.Ping()]


def test_decoder_is_dead_after_an_error() -> None:
    decoder = FrameDecoder(side=Side.SERVER)
    with pytest.raises(FrameError):
        decoder.feed(header(0))
    assert decoder.failed
    assert decoder.buffered == 0
    for _ in range(2):
        with pytest.raises(FrameError) as info:
            decoder.feed(PING)
        assert info.value.code is ErrorCode.BAD_FRAME
        assert info.value.frames == []
        assert "already failed" in str(info.value)


def test_buffer_is_bounded_and_released() -> None:
    max_frame = 1000
    decoder = FrameDecoder(side=Side.SERVER, max_frame=max_frame)
    frame = send_of_body_size(max_frame)
    data = encode(frame)
    assert decoder.buffered == 0
    assert decoder.feed(data[:-1]) == []
    assert decoder.buffered == max_frame + 3
    assert decoder.feed(data[-1:] + PING[:2]) == [frame]
    assert decoder.buffered == 2
    assert decoder.feed(PING[2:]) == [f.Ping()]
    assert decoder.buffered == 0
    assert decoder._buf is None  # idle decoders hold no buffer


def test_large_frame_fed_one_byte_at_a_time() -> None:
    # O(bytes): 65,540 single-byte feeds of one maximal frame must stay cheap.
    frame = send_of_body_size(MAX_FRAME_DEFAULT)
    data = encode(frame)
    decoder = FrameDecoder(side=Side.SERVER)
    out = []
    for i in range(len(data)):
        out += decoder.feed(data[i : i + 1])
        assert decoder.buffered <= MAX_FRAME_DEFAULT + 4
    assert out == [frame]


def test_empty_feed() -> None:
    decoder = FrameDecoder(side=Side.SERVER)
    assert decoder.feed(b"") == []
    assert decoder.feed(PING[:1]) == []
    assert decoder.feed(b"") == []
    assert decoder.feed(PING[1:]) == [f.Ping()]


def test_decoder_settings() -> None:
    decoder = FrameDecoder(side=Side.CLIENT, max_frame=10)
    assert decoder.side is Side.CLIENT
    assert decoder.max_frame == 10
    assert not decoder.failed
    with pytest.raises(ValueError):
        FrameDecoder(side=Side.SERVER, max_frame=0)
    with pytest.raises(ValueError):
        FrameDecoder(side=Side.SERVER, max_frame=2**32)


@pytest.mark.parametrize(
    ("body", "limit"),
    [
        (b"\x92\x03\xdc\x01\x00" + b"\xc0" * 20, "max_array_len"),  # array of 256 in 26 bytes
        (b"\x92\x03\xde\x01\x00" + b"\xc0" * 20, "max_map_len"),
    ],
)
def test_msgpack_lengths_are_capped_by_the_body(body: bytes, limit: str) -> None:
    # The decoder relies on unpackb deriving its max_*_len limits from len(body): an
    # array or map header is the one length msgpack would preallocate for.
    err = feed_error(frame_bytes(body))
    assert err.code is ErrorCode.BAD_FRAME
    assert limit in str(err)
