"""Whatever the bytes, the decoder accepts them or refuses them in a documented way.

Outcomes allowed: typed frames, Invalid (UNKNOWN_OP or BAD_REQUEST), or FrameError
with BAD_FRAME or FRAME_TOO_LARGE. Anything else (IndexError, TypeError, ...) is a
bug. Feeding the same bytes in any chunks gives the same outcome.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import frames as f
from protocol.codec import encode, frame_bytes
from protocol.decoder import FrameDecoder, Side
from protocol.errors import FrameError
from protocol.ops import MAX_U64, ErrorCode, Op
from tests.protocol.samples import SAMPLES
from tests.support.tiers import examples

FRAME_ERRORS = {ErrorCode.BAD_FRAME, ErrorCode.FRAME_TOO_LARGE}
INVALID_CODES = {ErrorCode.UNKNOWN_OP, ErrorCode.BAD_REQUEST}
ALL_FRAME_TYPES = (*f.CLIENT_FRAME_TYPES, *f.SERVER_FRAME_TYPES)

Outcome = tuple[list[f.Frame | f.Invalid], ErrorCode | None]


def run(chunks: list[bytes], side: Side, max_frame: int) -> Outcome:
    decoder = FrameDecoder(side=side, max_frame=max_frame)
    out: list[f.Frame | f.Invalid] = []
    for chunk in chunks:
        try:
            out += decoder.feed(chunk)
        except FrameError as exc:
            assert exc.code in FRAME_ERRORS
            assert decoder.failed and decoder.buffered == 0
            return out + exc.frames, exc.code
        assert decoder.buffered <= max_frame + 4
    return out, None


def check(out: list[f.Frame | f.Invalid], side: Side) -> None:
    accepted = f.CLIENT_FRAME_TYPES if side is Side.SERVER else f.SERVER_FRAME_TYPES
    for item in out:
        if isinstance(item, f.Invalid):
            assert item.code in INVALID_CODES
            assert type(item.op) is int and item.op >= 1
            assert type(item.rid) is int and 0 <= item.rid <= MAX_U64
        else:
            assert isinstance(item, accepted)
            # A decoded frame re-encodes to something that decodes to itself.
            assert FrameDecoder(side=side, max_frame=1 << 24).feed(encode(item)) == [item]


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)] or [b""]


sides = st.sampled_from([Side.SERVER, Side.CLIENT])
max_frames = st.sampled_from([1, 16, 300, 65_536])


@settings(max_examples=examples(500), deadline=None)
@given(st.binary(max_size=600), st.lists(st.integers(0, 10_000), max_size=8), sides, max_frames)
def test_arbitrary_bytes(data: bytes, cuts: list[int], side: Side, max_frame: int) -> None:
    whole = run([data], side, max_frame)
    check(whole[0], side)
    assert run(chunked(data, cuts), side, max_frame) == whole
    assert run([data[i : i + 1] for i in range(len(data))], side, max_frame) == whole


@settings(max_examples=examples(500), deadline=None)
@given(
    st.lists(st.binary(max_size=60), max_size=6), st.lists(st.integers(0, 500), max_size=6), sides
)
def test_framed_arbitrary_bodies(bodies: list[bytes], cuts: list[int], side: Side) -> None:
    data = b"".join(struct.pack(">I", len(b)) + b for b in bodies)
    whole = run([data], side, 65_536)
    check(whole[0], side)
    assert whole[1] in (None, ErrorCode.BAD_FRAME)
    assert run(chunked(data, cuts), side, 65_536) == whole


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), MAX_U64),
    st.sampled_from([0, 1, 2, MAX_U64]),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers(0, 10)), inner, max_size=4),
    ),
    max_leaves=20,
)
_ops = st.one_of(st.sampled_from([op.value for op in Op]), st.integers(-3, 200), st.just(MAX_U64))


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values, sides)
def test_arbitrary_msgpack_values(value: Any, side: Side) -> None:
    out, error = run([frame_bytes(msgpack.packb(value, use_bin_type=True))], side, 1 << 20)
    check(out, side)
    is_frame = type(value) is list and value and type(value[0]) is int and value[0] >= 1
    assert (error is None) == bool(is_frame)


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops, st.lists(_values, max_size=9), sides)
def test_arbitrary_op_bodies(op: int, values: list[Any], side: Side) -> None:
    out, error = run([frame_bytes(msgpack.packb([op, *values], use_bin_type=True))], side, 1 << 20)
    check(out, side)
    assert (error is None) == (op >= 1)
    if op >= 1:
        [item] = out
        if isinstance(item, f.Invalid):
            assert item.op == op
        else:
            assert op == item.OP


def _replace(body: Any, path: list[int], value: Any) -> Any:
    """`body` with the element at `path` (indices into nested lists/maps) replaced."""
    if not path or not isinstance(body, (list, dict)) or not body:
        return value
    keys = list(range(len(body))) if isinstance(body, list) else list(body)
    key = keys[path[0] % len(keys)]
    copy = list(body) if isinstance(body, list) else dict(body)
    copy[key] = _replace(body[key], path[1:], value)
    return copy


@settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SAMPLES),
    st.lists(st.integers(0, 50), min_size=1, max_size=4),
    _values,
)
def test_sample_bodies_with_one_value_replaced(sample: Any, path: list[int], value: Any) -> None:
    frame, body = sample
    side = Side.SERVER if isinstance(frame, f.CLIENT_FRAME_TYPES) else Side.CLIENT
    if len(body) == 1:
        mutated = [*body, value]  # an extra element, ignored
    else:
        mutated = _replace(body[1:], path, value)
        mutated.insert(0, body[0])  # keep the op
    out, error = run([frame_bytes(msgpack.packb(mutated, use_bin_type=True))], side, 1 << 20)
    assert error is None
    check(out, side)
    [item] = out
    assert item.op == frame.OP if isinstance(item, f.Invalid) else type(item) is type(frame)
