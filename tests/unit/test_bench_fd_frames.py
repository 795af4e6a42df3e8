"""The lean generator's frame split (bench.fdholders.split_frames): PONGs counted,
other frames handed on whole and in order, however the bytes are cut."""

from __future__ import annotations

import msgpack

from bench.fdholders import PONG, split_frames
from protocol.codec import encode
from protocol.frames import Error, Kick, LoginOk
from protocol.ops import ErrorCode, KickReason, Op

LOGIN_OK = encode(LoginOk(1, "n1", 30, 90, 65536, 8192, 0))
KICK = encode(Kick(KickReason.DRAINING, "bye", ""))
ERROR = encode(Error(1, ErrorCode.AUTH_FAILED, "no"))
STREAM = LOGIN_OK + PONG + PONG + KICK + PONG + ERROR


def feed(chunks: list[bytes]) -> tuple[int, list[list[object]], bytes]:
    """Feed `chunks` as successive reads, keeping the rest between them as the
    generator does; the PONGs, the other frames decoded, and what is left."""
    pongs, frames, rest = 0, [], b""
    for chunk in chunks:
        n, bodies, rest = split_frames(rest + chunk)
        pongs += n
        frames += [msgpack.unpackb(b) for b in bodies]
    return pongs, frames, rest


def ops(frames: list[list[object]]) -> list[object]:
    return [f[0] for f in frames]


def test_one_read_of_whole_frames() -> None:
    pongs, frames, rest = feed([STREAM])
    assert (pongs, ops(frames), rest) == (3, [Op.LOGIN_OK, Op.KICK, Op.ERROR], b"")
    assert frames[2][2] == ErrorCode.AUTH_FAILED and frames[1][1] == KickReason.DRAINING


def test_one_byte_at_a_time() -> None:
    pongs, frames, rest = feed([STREAM[i : i + 1] for i in range(len(STREAM))])
    assert (pongs, ops(frames), rest) == (3, [Op.LOGIN_OK, Op.KICK, Op.ERROR], b"")


def test_every_cut_in_two() -> None:
    for cut in range(len(STREAM) + 1):
        pongs, frames, rest = feed([STREAM[:cut], STREAM[cut:]])
        assert (pongs, ops(frames), rest) == (3, [Op.LOGIN_OK, Op.KICK, Op.ERROR], b""), cut


def test_the_start_of_a_frame_is_left_over() -> None:
    assert split_frames(PONG[:3]) == (0, [], PONG[:3])
    assert split_frames(PONG + KICK[:-1]) == (1, [], KICK[:-1])
    assert split_frames(b"") == (0, [], b"")
