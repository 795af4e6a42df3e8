"""A minimal test client over the project's codec: one connection, frames in and out.

The connection is TCP, or a WebSocket where the test's gateway takes its clients that
way (`Wire.by_websocket`, set by the `transport` fixture).

Replies are matched to requests by rid; server-initiated frames (PUSH, notifies, KICK)
collect in `events`. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from typing import Any, TypeVar

from gateway.client.wsstream import WsStream
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.errors import FrameError
from protocol.frames import Error, Frame, Invalid, Login, LoginOk
from protocol.token import sign_token

T = TypeVar("T")

KID = "test"
SECRET = "test-secret"
TOKEN_KEY = f"{KID}:{SECRET}"


def token(uid: int, device: str, *, ttl: int = 3600, kid: str = KID, secret: str = SECRET) -> str:
    return sign_token(kid, secret, uid, device, int(time.time()) + ttl)


class Closed(Exception):
    """The server closed the connection."""


class Wire:
    _rids = itertools.count(1)
    opened: list[Wire] = []  # closed by the conftest fixture after each test
    # client port -> WebSocket port of the gateways whose clients connect by WebSocket
    by_websocket: dict[int, int] = {}

    def __init__(self, reader: Any, writer: Any) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(side=Side.CLIENT)
        self.frames: list[Frame | Invalid] = []  # decoded, not yet taken
        self.eof = False

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1") -> Wire:
        if (ws_port := cls.by_websocket.get(port)) is not None:
            stream = await WsStream.open(f"ws://{host}:{ws_port}/ws", tls=None, max_size=1 << 26)
            wire = cls(stream, stream)
        else:
            wire = cls(*await asyncio.open_connection(host, port))
        cls.opened.append(wire)
        return wire

    @classmethod
    async def login(cls, port: int, uid: int, device: str = "d1", **kw: Any) -> Wire:
        w = await cls.open(port)
        ok = await w.request(Login(0, 1, uid, device, kw.pop("tok", None) or token(uid, device)))
        assert isinstance(ok, LoginOk), ok
        return w

    def rid(self) -> int:
        return next(self._rids)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, frame: Frame) -> None:
        await self.write(encode(frame))

    async def _fill(self, timeout: float) -> None:
        if self.eof:
            raise Closed()
        try:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            raise Closed()
        try:
            self.frames.extend(self.decoder.feed(data))
        except FrameError as e:
            raise AssertionError(f"server sent undecodable bytes: {e}") from e

    async def recv(self, timeout: float = 5.0) -> Frame | Invalid:
        """The next frame of any kind."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.frames:
            await self._fill(max(0.001, deadline - asyncio.get_running_loop().time()))
        return self.frames.pop(0)

    async def wait_for(self, kind: type[T], timeout: float = 5.0, **match: Any) -> T:
        """The first frame of type `kind` whose fields equal `match`; others stay queued."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for i, f in enumerate(self.frames):
                if isinstance(f, kind) and all(getattr(f, k) == v for k, v in match.items()):
                    del self.frames[i]
                    return f
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"no {kind.__name__} {match} within {timeout}s: {self.frames}")
            await self._fill(left)

    async def request(self, frame: Frame, timeout: float = 5.0) -> Frame:
        """Send a request with a fresh rid; return its reply (or ERROR)."""
        rid = self.rid()
        frame = dataclasses.replace(frame, rid=rid)  # type: ignore[call-arg]
        await self.send(frame)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for i, f in enumerate(self.frames):
                if getattr(f, "rid", None) == rid:
                    del self.frames[i]
                    return f  # type: ignore[return-value]
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"no reply to rid {rid} within {timeout}s")
            await self._fill(left)

    async def error(self, frame: Frame, timeout: float = 5.0) -> int:
        """Send a request expected to fail; the ERROR code."""
        reply = await self.request(frame, timeout)
        assert isinstance(reply, Error), f"expected ERROR, got {reply}"
        return reply.code

    async def closed(self, timeout: float = 5.0) -> list[Frame | Invalid]:
        """Read until the server closes; the frames received on the way."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                await self._fill(max(0.001, deadline - loop.time()))
        except Closed:
            pass
        out, self.frames = self.frames, []
        await self.close()
        return out

    async def quiet(self, seconds: float = 0.2) -> list[Frame | Invalid]:
        """Frames that arrive within `seconds` (for asserting that nothing else came)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        try:
            while (left := deadline - loop.time()) > 0:
                await self._fill(left)
        except (TimeoutError, Closed):
            pass
        out, self.frames = self.frames, []
        return out

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
