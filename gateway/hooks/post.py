"""JSON batches POSTed to a URL, for the notify webhook and the push URL sink.

Posts go through one aiohttp session, opened in the event loop by `start()`: one
keep-alive connection (a stage posts one batch at a time), and no cookies, redirects (a
3xx answer is a failure) or proxy. Any 2xx answer acknowledges a post. A post without a
whole answer within `timeout_s` (the whole call, not each read: an `asyncio.timeout`
around the request, the status and the body) has failed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
from yarl import URL


class JsonPost:
    def __init__(
        self,
        url: str,
        *,
        what: str,
        token: str = "",
        timeout_s: float = 5.0,
        log: Any,
        throttle: Callable[[str], int | None] = lambda key: 0,
    ) -> None:
        self.url = url
        self._what = what  # names the sink in logs: "notify webhook", "push URL"
        self._url = URL(url)
        self._timeout_s = timeout_s
        self._log = log
        self._throttle = throttle
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._session: aiohttp.ClientSession | None = None
        self.failures = 0  # posts that failed

    def start(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(),  # none: asyncio.timeout keeps the whole call's
            cookie_jar=aiohttp.DummyCookieJar(),
            headers=self._headers,
        )

    async def post(self, body: dict[str, Any], items: int) -> bool:
        """POST `body` (carrying `items` messages or events, for the log); whether a 2xx
        answered. Never raises: a failure is counted and logged (throttled)."""
        assert self._session is not None, "start() first"
        try:
            data = json.dumps(body, separators=(",", ":")).encode()
            async with asyncio.timeout(self._timeout_s):
                async with self._session.post(self._url, data=data, allow_redirects=False) as r:
                    status = r.status
                    await r.read()
            if 200 <= status < 300:
                return True
            error = f"status {status}"
        except Exception as e:  # timeouts, connection errors alike
            error = repr(e)
        self.failures += 1
        if (held := self._throttle(f"{self._what} failed")) is not None:
            self._log.warning(
                f"{self._what} failed; retrying", url=self.url, items=items, error=error,
                similar_held_back=held,
            )  # fmt: skip
        return False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
