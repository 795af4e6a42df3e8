"""A TCP proxy between a gateway and a real server, to inject network faults:
`cut()` resets every connection and refuses new ones (the server is down or restarting),
`blackhole()` accepts and forwards nothing (the server hangs), `restore()` heals.
`hold(pattern, seconds)` delays each client-to-server chunk carrying `pattern` (and what
follows it on that connection) by `seconds`: a partition that delays rather than resets,
such as a MySQL COMMIT packet held up in the network."""

from __future__ import annotations

import asyncio
import contextlib
import enum


class Mode(enum.Enum):
    OPEN = "open"
    CUT = "cut"
    BLACKHOLE = "blackhole"


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = Mode.OPEN
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self._hold: tuple[bytes, float] | None = None
        self.held = 0  # chunks held so far
        self.first_chunks: list[bytes] = []  # each connection's first client-to-server read

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode is Mode.CUT:
            writer.transport.abort()
            return
        self._writers.add(writer)
        if self.mode is Mode.BLACKHOLE:
            return  # hold the socket, say nothing
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.add(up_writer)
        for src, dst, up in ((reader, up_writer, True), (up_reader, writer, False)):
            task = asyncio.get_running_loop().create_task(self._pipe(src, dst, up))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, upstream: bool
    ) -> None:
        first = upstream
        with contextlib.suppress(OSError, ConnectionError):
            while data := await src.read(65536):
                if first:
                    self.first_chunks.append(data)
                    first = False
                if upstream and self._hold is not None and self._hold[0] in data:
                    self.held += 1
                    await asyncio.sleep(self._hold[1])
                if self.mode is not Mode.OPEN:
                    return
                dst.write(data)
                await dst.drain()
        dst.transport.abort() if self.mode is not Mode.OPEN else dst.close()

    def _drop_all(self) -> None:
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def cut(self) -> None:
        """Reset every connection and refuse new ones."""
        self.mode = Mode.CUT
        self._drop_all()

    def blackhole(self) -> None:
        """Drop every connection; accept new ones but never answer."""
        self.mode = Mode.BLACKHOLE
        self._drop_all()

    def hold(self, pattern: bytes, seconds: float) -> None:
        """From now on, delay client-to-server chunks carrying `pattern` by `seconds`."""
        self._hold = (pattern, seconds)

    def stop_holding(self) -> None:
        """New chunks pass again (those already held still wait their time)."""
        self._hold = None

    def restore(self) -> None:
        self._drop_all()  # black-holed sockets would hang their clients forever
        self.mode = Mode.OPEN

    async def close(self) -> None:
        self._drop_all()
        for t in list(self._pipes):
            t.cancel()
        if self._pipes:
            await asyncio.gather(*self._pipes, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
