"""A content check before the commit (the write path checks membership, rate and
content safety before a message is stored).

`WebhookCheck` POSTs each group commit's messages to `--check-url` as JSON and waits at
most `--check-timeout-ms` for the verdicts:

    request:  {"messages": [{"conv_id": 9, "sender_uid": 42, "client_msg_id": "m1",
                             "msg_type": 1, "content": "<base64>"}, ...]}
    response: {"allow": [true, false, ...]}   (one verdict per message, in order)

A denied message is not stored; its sender gets ERROR content_denied (33), or forbidden
(27) if its LOGIN did not list the "content_denied" capability. When the webhook fails
(no answer in time, a connection error, a status other than 200, a malformed body) the
batch follows `--check-fail`: `open` stores every message (the check is skipped and
counted), `closed` answers the whole batch unavailable (nothing stored; clients retry with
the same client_msg_id).

The client is one aiohttp session with a keep-alive pool of at most `check_pool`
connections, opened in the event loop on the first check. The deadline is the whole
call's (waiting for a pooled connection, connecting, sending, the status and the whole
body), kept by `asyncio.timeout` around all of it: a per-read timeout would never trip
on a hook that answers a byte at a time. The session has no timeouts, cookies,
redirects or proxy of its own (a redirect is a status other than 200), so that a check
costs one request and little else: the body is serialised once, to bytes, and the
answer is read whole and parsed with `json.loads`.
"""

from __future__ import annotations

import asyncio
import json
from binascii import b2a_base64
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii as json_string
from typing import Any, Final

import aiohttp
from yarl import URL

from storage.errors import StoreUnavailable
from storage.models import NewMessage

FAIL_OPEN: Final = "open"
FAIL_CLOSED: Final = "closed"
JSON_HEADERS: Final = {"Content-Type": "application/json"}


class CheckFailed(StoreUnavailable):
    """The webhook did not give usable verdicts and the check fails closed."""


def check_body(batch: Sequence[NewMessage]) -> bytes:
    """The request body for `batch`, as JSON in ASCII. Written out rather than through
    json.dumps of dicts (a third of the CPU): the numbers are ints (an IntEnum formats as
    its value), the content is base64, and the client's message id is the one string that
    needs JSON's escaping."""
    messages = ",".join(
        [
            f'{{"conv_id":{m.conv_id},"sender_uid":{m.sender_uid},'
            f'"client_msg_id":{json_string(m.client_msg_id)},"msg_type":{m.msg_type},'
            f'"content":"{b2a_base64(m.content, newline=False).decode("ascii")}"}}'
            for m in batch
        ]
    )
    return f'{{"messages":[{messages}]}}'.encode("ascii")


class WebhookCheck:
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        fail: str,
        pool: int,
        log: Any,
        throttle: Callable[[str], int | None] = lambda key: 0,
    ) -> None:
        if fail not in (FAIL_OPEN, FAIL_CLOSED):
            raise ValueError(f"check_fail must be {FAIL_OPEN} or {FAIL_CLOSED}, got {fail!r}")
        self.url = url
        self._url = URL(url)
        self._fail_open = fail == FAIL_OPEN
        self._log = log
        self._throttle = throttle  # log at most so often (gateway.logs.Throttle.allow)
        self._timeout_s = timeout_s
        self._pool = pool
        self._session: aiohttp.ClientSession | None = None
        self.checked = 0  # messages with a verdict
        self.denied = 0
        self.failures = 0  # batches the webhook failed on

    def _open(self) -> aiohttp.ClientSession:
        """The session, made on first use: aiohttp binds it to the running loop."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._pool),
            timeout=aiohttp.ClientTimeout(),  # none: asyncio.timeout keeps the whole call's
            cookie_jar=aiohttp.DummyCookieJar(),
            headers=JSON_HEADERS,
        )
        return self._session

    async def check(self, batch: Sequence[NewMessage]) -> list[bool]:
        """One verdict per message: True to store it. Raises CheckFailed when the webhook
        fails and the check fails closed."""
        session = self._session or self._open()
        try:
            body = check_body(batch)
            async with asyncio.timeout(self._timeout_s):
                async with session.post(self._url, data=body, allow_redirects=False) as reply:
                    status = reply.status
                    raw = await reply.read()
            if status != 200:
                raise ValueError(f"status {status}")
            allow = json.loads(raw)["allow"]
            if not isinstance(allow, list) or len(allow) != len(batch):
                raise ValueError("'allow' must be a list with one verdict per message")
            verdicts = [v is True for v in allow]
        except Exception as e:  # timeouts, connection errors, bad answers alike
            self.failures += 1
            if (held := self._throttle("content check")) is not None:
                self._log.warning(
                    "content check failed", url=self.url, messages=len(batch), error=repr(e),
                    then="stored unchecked" if self._fail_open else "refused as unavailable",
                    similar_held_back=held,
                )  # fmt: skip
            if self._fail_open:
                return [True] * len(batch)
            raise CheckFailed(f"content check unavailable: {e!r}") from e
        self.checked += len(batch)
        self.denied += verdicts.count(False)
        return verdicts

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
