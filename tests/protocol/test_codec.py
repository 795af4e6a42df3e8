"""Encoding matches docs/protocol.md (Ops) byte for byte; every op round-trips."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import frames as f
from protocol.codec import encode, encode_body, frame_bytes
from protocol.decoder import FrameDecoder, Side
from tests.protocol.samples import (
    CLIENT_SAMPLES,
    SAMPLES,
    SERVER_SAMPLES,
    client_frames,
    server_frames,
)
from tests.support.tiers import examples


def side_for(frame: f.Frame) -> Side:
    return Side.SERVER if isinstance(frame, f.CLIENT_FRAME_TYPES) else Side.CLIENT


def test_samples_cover_every_op() -> None:
    covered = {type(frame) for frame, _ in SAMPLES}
    assert covered == set(f.CLIENT_FRAME_TYPES) | set(f.SERVER_FRAME_TYPES)


@pytest.mark.parametrize(("frame", "body"), SAMPLES, ids=lambda x: type(x).__name__)
def test_body_matches_spec(frame: f.Frame, body: list[Any]) -> None:
    expected = msgpack.packb(body, use_bin_type=True)
    assert encode_body(frame) == expected
    assert encode(frame) == struct.pack(">I", len(expected)) + expected
    assert frame_bytes(expected) == encode(frame)


@pytest.mark.parametrize(("frame", "body"), SAMPLES, ids=lambda x: type(x).__name__)
def test_roundtrip_whole(frame: f.Frame, body: list[Any]) -> None:
    decoder = FrameDecoder(side=side_for(frame))
    assert decoder.feed(encode(frame)) == [frame]
    assert decoder.buffered == 0


@pytest.mark.parametrize(("frame", "body"), SAMPLES, ids=lambda x: type(x).__name__)
def test_roundtrip_byte_by_byte(frame: f.Frame, body: list[Any]) -> None:
    decoder = FrameDecoder(side=side_for(frame))
    data = encode(frame)
    out = []
    for i in range(len(data)):
        got = decoder.feed(data[i : i + 1])
        assert got == [] or i == len(data) - 1
        out += got
    assert out == [frame]
    assert decoder.buffered == 0


@pytest.mark.parametrize("samples", [CLIENT_SAMPLES, SERVER_SAMPLES], ids=["client", "server"])
def test_roundtrip_concatenated(samples: list[f.Frame]) -> None:
    side = side_for(samples[0])
    stream = b"".join(encode(frame) for frame in samples * 3)
    assert FrameDecoder(side=side).feed(stream) == samples * 3
    # Split at every position: the same frames whatever the chunking.
    for cut in range(0, len(stream), 7):
        decoder = FrameDecoder(side=side)
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == samples * 3


def test_bytes_like_input() -> None:
    data = encode(f.Send(1, 2, "c", 1, b"x")) * 2
    for chunk in (bytearray(data), memoryview(data)):
        assert FrameDecoder(side=Side.SERVER).feed(chunk) == [f.Send(1, 2, "c", 1, b"x")] * 2


def test_encode_returns_bytes_and_constant_frames_are_shared() -> None:
    push = f.Push(9, 12, 5, 42, 1, b"hi", 1, "c")
    assert type(encode(push)) is bytes
    assert encode(f.Ping()) is encode(f.Ping())
    assert encode(f.Ping()) == b"\x00\x00\x00\x02\x91\x03"


def test_bools_are_msgpack_bools() -> None:
    body = encode_body(f.PullResult(1, 2, True, ()))
    assert body == b"\x95\x21\x01\x02\xc3\x90"
    conv = f.ConvRecord(1, 1, 0, 0, 0, 0, 0, False)
    assert encode_body(f.SyncResult(1, 0, 0, False, (conv,))).endswith(b"\xc2")


def test_int_enums_encode_as_ints() -> None:
    from protocol.ops import ErrorCode, KickReason

    assert encode(f.Error(3, ErrorCode.NOT_MEMBER, "")) == encode(f.Error(3, 20, ""))
    assert encode(f.Kick(KickReason.SHUTDOWN, "", "")) == encode(f.Kick(5, "", ""))


def test_encode_refuses_non_frames() -> None:
    from protocol.ops import ErrorCode

    with pytest.raises(TypeError, match="not a wire frame"):
        encode(f.Invalid(1, 0, ErrorCode.BAD_REQUEST, ""))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a wire frame"):
        encode_body(object())  # type: ignore[arg-type]


def test_encode_does_not_validate_but_overflow_raises() -> None:
    with pytest.raises(OverflowError):
        encode(f.Ok(2**64))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(client_frames, min_size=1, max_size=8), st.data())
def test_random_client_frames_roundtrip(frames: list[f.Frame], data: st.DataObject) -> None:
    _roundtrip(frames, Side.SERVER, data)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(server_frames, min_size=1, max_size=8), st.data())
def test_random_server_frames_roundtrip(frames: list[f.Frame], data: st.DataObject) -> None:
    _roundtrip(frames, Side.CLIENT, data)


def _roundtrip(frames: list[f.Frame], side: Side, data: st.DataObject) -> None:
    stream = b"".join(encode(frame) for frame in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder(side=side, max_frame=1 << 20)
    out = []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out += decoder.feed(stream[start:stop])
    assert out == frames
    assert decoder.buffered == 0
