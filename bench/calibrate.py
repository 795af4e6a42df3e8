"""How fast this machine is right now, next to every bench result.

The project's machine is shared: the same code measured 256 µs of gateway CPU per
message one day and 300 µs the next, and 27 to 48 s for the same reconnect storm within
an hour. A figure is only comparable with another of the same speed. Two probes, a
fraction of a second each, taken before and after every `imgw bench` run:

- `python_loop_ns`: one step of a pure-Python counting loop (the interpreter's speed:
  most of a gateway worker's CPU is bytecode);
- `loopback_rtt_us`: CPU time of one small TCP send and its receive on loopback, in one
  process (the kernel's speed: on loopback a write runs the peer's receive path, and
  every PING, ACK and PUSH is one).

The best of a few rounds is kept: a probe that was preempted measured the neighbours.
"""

from __future__ import annotations

import socket
import time
from typing import Final

LOOP_STEPS: Final = 1_000_000
RTT_ROUNDS: Final = 2_000
TRIES: Final = 3


def python_loop_ns(steps: int = LOOP_STEPS) -> float:
    """Nanoseconds per step of `while i < n: i += 1`."""
    started = time.perf_counter()
    i = 0
    while i < steps:
        i += 1
    return (time.perf_counter() - started) * 1e9 / steps


def loopback_rtt_us(rounds: int = RTT_ROUNDS) -> float:
    """CPU microseconds of one 40-byte send plus its recv over a loopback TCP pair."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname()) as a:
            b, _ = listener.accept()
            with b:
                for s in (a, b):
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                payload = b"x" * 40
                started = time.process_time()
                for _ in range(rounds):
                    a.sendall(payload)
                    got = 0
                    while got < len(payload):
                        got += len(b.recv(4096))
                return (time.process_time() - started) * 1e6 / rounds


def calibrate() -> dict[str, float]:
    """Both probes, the best of TRIES each (rounded)."""
    return {
        "python_loop_ns": round(min(python_loop_ns() for _ in range(TRIES)), 1),
        "loopback_rtt_us": round(min(loopback_rtt_us() for _ in range(TRIES)), 2),
    }
