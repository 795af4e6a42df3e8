"""The admin HTTP listener: /healthz (alive), /readyz (accepting), /metrics (Prometheus).
A deliberately tiny HTTP/1.0 responder: one GET, one response, close."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.node import Node


class AdminServer:
    def __init__(self, node: Node, host: str, port: int) -> None:
        self._node = node
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5)
            parts = line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            status, ctype, body = self._route(path)
            head = (
                f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def _route(self, path: str) -> tuple[str, str, bytes]:
        node = self._node
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            if node.accepting:
                return "200 OK", "text/plain", b"ready\n"
            return "503 Service Unavailable", "text/plain", b"draining\n"
        if path == "/metrics":
            return "200 OK", "text/plain; version=0.0.4", node.metrics.render()
        return "404 Not Found", "text/plain", b"not found\n"
