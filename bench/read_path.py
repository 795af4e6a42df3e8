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

from gateway import connection as connection_module
from gateway.config import Config
from gateway.node import Node
from protocol.codec import encode
from protocol.frames import Login, Ping, Send
from storage.factory import open_backends
from tests.support.fakes import FakeTransport
from tests.support.wire import TOKEN_KEY, token


class NullTransport(FakeTransport):
    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass


async def main(reads: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(port=0, token_keys=(TOKEN_KEY,), data_dir=tmp, node_id="probe")
        b = open_backends(f"sqlite:///{tmp}/imgw.db", "memory://", "local://")
        await b.store.start()
        node = Node(config, node_id="probe", store=b.store, routes=b.routes, bus=b.bus)
        conn = node.protocol_factory()
        t = NullTransport(conn)
        conn.connection_made(t)
        conn.data_received(encode(Login(1, 1, 7, "ios", token(7, "ios"))))
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
