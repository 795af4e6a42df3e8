"""Reading HTTP/1.1 answers off a raw connection, for the listener tests."""

from __future__ import annotations

import asyncio
import contextlib


async def reply(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: its status, its headers (lower-case names) and its body."""
    async with asyncio.timeout(5):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        line, *fields = head.rstrip("\r\n").split("\r\n")
        headers = {}
        for field in fields:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(line.split()[1]), headers, body


async def closed(reader: asyncio.StreamReader) -> bool:
    """The listener closed the connection (after what it had to say)."""
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(5):
            return await reader.read() == b""
    return True
