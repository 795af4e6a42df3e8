"""A client of the server API (/api/v1/ on a gateway's admin port) for the tests."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

TOKEN = "s3cret"


class Api:
    def __init__(self, port: int, token: str = TOKEN) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1/"
        self.token = token

    async def call(
        self, method: str, path: str, body: Any = None, *, token: str | None = None
    ) -> tuple[int, Any]:
        auth = self.token if token is None else token
        headers = {"Authorization": f"Bearer {auth}"} if auth else {}
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.request(method, self.base + path, json=body, headers=headers)
        assert r.headers["content-type"] == "application/json"
        return r.status_code, r.json()

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self.call(method, path, body)
        assert status == 200, answer
        return answer

    async def error(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        status, answer = await self.call(method, path, body)
        assert status != 200, answer
        return status, answer["error"]["code"]

    async def metrics(self) -> str:
        url = self.base.replace("/api/v1/", "/metrics")
        async with httpx.AsyncClient(timeout=10) as client:
            return (await client.get(url)).text

    async def ready(self, timeout: float = 10.0) -> None:
        """Wait until the admin port answers."""
        url = self.base.replace("/api/v1/", "/healthz")
        async with asyncio.timeout(timeout), httpx.AsyncClient(timeout=2) as client:
            while True:
                try:
                    if (await client.get(url)).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
