"""Codec micro-benchmark: encode and decode frames/s for a few representative frames.

Not part of the test run, and not a load test: it times `protocol.encode` and
`FrameDecoder.feed` (one whole frame per call) in a tight `time.perf_counter` loop.

    python -m bench.probes.codec_bench [--seconds 1.0] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import msgpack

from protocol import (
    FrameDecoder,
    MsgRecord,
    Ping,
    PullResult,
    Push,
    Send,
    Side,
    encode,
)
from protocol.frames import Frame

CMID = "c3a1f6e0-1b2c-4d5e-8f90-123456789abc"  # a UUID, the usual client_msg_id
CONTENT = b"Hello, how are you doing today? See you at 6."
NOW_MS = 1_700_000_000_000


def cases() -> list[tuple[str, Frame, Side]]:
    msgs = tuple(
        MsgRecord(1000 + i, 10**15 + i, 42, 1, CONTENT, NOW_MS + i, CMID) for i in range(50)
    )
    return [
        ("SEND", Send(17, 123_456_789, CMID, 1, CONTENT), Side.SERVER),
        ("PUSH", Push(123_456_789, 1000, 10**15, 42, 1, CONTENT, NOW_MS, CMID), Side.CLIENT),
        ("PULL_RESULT(50)", PullResult(17, 123_456_789, True, msgs), Side.CLIENT),
        ("PING", Ping(), Side.SERVER),
    ]


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls of `fn` per second, timed over batches until `seconds` have passed."""
    batch = 1
    while True:  # size a batch to take ~10 ms
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        if time.perf_counter() - start >= 0.01:
            break
        batch *= 2
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(batch):
            fn()
        calls += batch
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def run(seconds: float) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    for name, frame, side in cases():
        data = encode(frame)
        decoder = FrameDecoder(side=side)
        assert decoder.feed(data) == [frame], name
        encode_rate = rate(partial(encode, frame), seconds)
        decode_rate = rate(partial(decoder.feed, data), seconds)
        results.append(
            {
                "frame": name,
                "bytes": len(data),
                "encode_per_s": round(encode_rate),
                "decode_per_s": round(decode_rate),
                "encode_ns": round(1e9 / encode_rate),
                "decode_ns": round(1e9 / decode_rate),
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--seconds", type=float, default=1.0, help="time per measurement (default 1.0)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write results as JSON")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")

    results = run(args.seconds)
    print(f"{'frame':<16} {'bytes':>6} {'encode/s':>12} {'ns':>7} {'decode/s':>12} {'ns':>7}")
    for r in results:
        print(
            f"{r['frame']:<16} {r['bytes']:>6} {r['encode_per_s']:>12,} {r['encode_ns']:>7,}"
            f" {r['decode_per_s']:>12,} {r['decode_ns']:>7,}"
        )
    if args.json:
        env = {
            "python": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "machine": platform.machine(),
            "msgpack": ".".join(map(str, msgpack.version)),
            "seconds": args.seconds,
        }
        args.json.write_text(json.dumps({"env": env, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
