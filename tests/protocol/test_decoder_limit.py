"""`FrameDecoder.feed(data, limit)`: at most `limit` frames a call, the rest kept
undecoded until `feed(b"", limit)`; the frames and errors are those of an unlimited
decoder, whatever the chunking and the limits."""

from __future__ import annotations

import itertools
import struct

from hypothesis import given
from hypothesis import strategies as st

from protocol import frames as f
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.errors import FrameError
from protocol.ops import ErrorCode

STREAM = b"".join(
    [
        encode(f.Typing(9)),
        encode(f.Ping()),
        encode(f.Presence(5, (1, 2, 3))),
        encode(f.Send(6, 9, "m", 1, b"x" * 300)),
        encode(f.Typing(10)),
    ]
    * 4
)


def drain(decoder: FrameDecoder, chunk: bytes, limit: int) -> list[f.Frame | f.Invalid]:
    out = decoder.feed(chunk, limit)
    assert len(out) <= limit
    while decoder.ahead:
        more = decoder.feed(b"", limit)
        assert 0 < len(more) <= limit
        out += more
    return out


def test_a_feed_stops_at_its_limit_and_keeps_the_rest() -> None:
    decoder = FrameDecoder(side=Side.SERVER)
    data = encode(f.Typing(1)) * 10
    first = decoder.feed(data, 3)
    assert first == [f.Typing(1)] * 3 and decoder.ahead
    assert decoder.buffered == len(data) * 7 // 10
    assert decoder.feed(b"", 5) == [f.Typing(1)] * 5 and decoder.ahead
    assert decoder.feed(b"", 5) == [f.Typing(1)] * 2
    assert not decoder.ahead and decoder.buffered == 0


def test_bytes_fed_while_ahead_go_behind_the_waiting_frames() -> None:
    decoder = FrameDecoder(side=Side.SERVER)
    ping = encode(f.Ping())
    assert decoder.feed(encode(f.Typing(1)) * 2 + ping[:3], 1) == [f.Typing(1)]
    assert decoder.ahead
    assert decoder.feed(ping[3:] + ping[:2], 1) == [f.Typing(1)]
    assert decoder.ahead
    assert decoder.feed(b"", 1) == [f.Ping()]
    assert not decoder.ahead and decoder.buffered == 2  # a partial PING: not ahead
    assert decoder.feed(ping[2:], 1) == [f.Ping()] and decoder.buffered == 0


def test_a_limit_that_ends_before_a_partial_frame_is_not_ahead() -> None:
    decoder = FrameDecoder(side=Side.SERVER)
    ping = encode(f.Ping())
    assert decoder.feed(ping + ping[:3], 1) == [f.Ping()]
    assert not decoder.ahead and decoder.buffered == 3


def test_a_bad_len_behind_the_limit_fails_when_reached() -> None:
    decoder = FrameDecoder(side=Side.SERVER, max_frame=100)
    data = encode(f.Ping()) * 2 + struct.pack(">I", 101)
    assert decoder.feed(data, 2) == [f.Ping(), f.Ping()]
    assert decoder.ahead  # the next feed has something to say
    try:
        decoder.feed(b"", 2)
    except FrameError as e:
        assert e.code == ErrorCode.FRAME_TOO_LARGE and e.frames == []
    else:
        raise AssertionError("no FrameError")
    assert decoder.failed and decoder.buffered == 0 and not decoder.ahead


@given(
    cuts=st.lists(st.integers(0, len(STREAM)), max_size=8),
    limit=st.integers(1, 6),
)
def test_any_chunking_and_limit_gives_the_unlimited_frames(cuts: list[int], limit: int) -> None:
    expected = FrameDecoder(side=Side.SERVER).feed(STREAM)
    decoder = FrameDecoder(side=Side.SERVER)
    bounds = [0, *sorted(cuts), len(STREAM)]
    out: list[f.Frame | f.Invalid] = []
    for lo, hi in itertools.pairwise(bounds):
        out += drain(decoder, STREAM[lo:hi], limit)
    assert out == expected
    assert decoder.buffered == 0 and not decoder.ahead
