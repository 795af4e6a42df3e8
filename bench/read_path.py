"""CPU per read on the hot path: one PING or one SEND alone in its read, through
`Connection.data_received` on a node of the embedded store, with the SEND's handler
replaced by a no-op (what is measured is the framing and dispatch, not the commit).

    python -m bench.read_path [--reads 200000] [--rounds 5]

Prints the best of `rounds` runs, in µs of process CPU per read.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from typing import Any, cast

from gateway import connection as connection_module
from gateway.config import Config
from gateway.node import Node
from protocol.codec import encode
from protocol.frames import Login, Ping, Send
from protocol.token import sign_token
from storage.factory import open_backends

KID, SECRET = "probe", "probe-secret"


class NullTransport:
    """What `Connection` uses of a transport; what is written goes nowhere."""

    def __init__(self) -> None:
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def writelines(self, list_of_data: Any) -> None:
        pass

    def close(self) -> None:
        self.reading = False

    def abort(self) -> None:
        self.reading = False

    def is_closing(self) -> bool:
        return False

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50000) if name == "peername" else default


async def main(reads: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(port=0, token_keys=(f"{KID}:{SECRET}",), data_dir=tmp, node_id="probe")
        b = open_backends(f"sqlite:///{tmp}/imgw.db", "memory://", "local://")
        await b.store.start()
        node = Node(config, node_id="probe", store=b.store, routes=b.routes, bus=b.bus)
        conn = node.protocol_factory()
        conn.connection_made(cast(asyncio.Transport, NullTransport()))
        tok = sign_token(KID, SECRET, 7, "ios", int(time.time()) + 3600)
        conn.data_received(encode(Login(1, 1, 7, "ios", tok)))
        for _ in range(500):
            if conn.active:
                break
            await asyncio.sleep(0.01)
        connection_module.dispatch_now = lambda node, conn, frame: True  # type: ignore[attr-defined]
        for name, data in (
            ("PING", encode(Ping())),
            ("SEND", encode(Send(1, 9, "c-0001", 1, b"hello world"))),
        ):
            best = float("inf")
            for _ in range(rounds):
                started = time.process_time()
                for _ in range(reads):
                    conn.data_received(data)
                best = min(best, (time.process_time() - started) / reads * 1e6)
            print(f"{name}: {best:.3f} us per read")
        node.close()
        await node.settle()
        await b.store.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reads", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    asyncio.run(main(args.reads, args.rounds))
