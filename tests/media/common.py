"""Helpers of the media tests: files, uploads over HTTP, media messages over the wire."""

from __future__ import annotations

import hashlib
import os

import httpx

from protocol.frames import MediaUpload, MediaUrl, Send, SendAck
from protocol.mediakeys import media_content
from protocol.ops import MsgType
from tests.support.wire import Wire

HOUR_MS = 3_600_000


def a_file(n: int = 3000) -> tuple[bytes, str]:
    data = os.urandom(n)
    return data, hashlib.sha256(data).hexdigest()


async def ask_upload(w: Wire, data: bytes, ctype: str = "image/png") -> MediaUrl:
    reply = await w.request(MediaUpload(0, hashlib.sha256(data).hexdigest(), len(data), ctype))
    assert isinstance(reply, MediaUrl), reply
    return reply


async def put(url: str, data: bytes, ctype: str = "image/png") -> int:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.put(url, content=data, headers={"Content-Type": ctype})
    return reply.status_code


async def fetch(url: str) -> tuple[int, bytes, str]:
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(url)
    return reply.status_code, reply.content, reply.headers.get("content-type", "")


async def upload(w: Wire, data: bytes, ctype: str = "image/png") -> str:
    """MEDIA_UPLOAD, then the PUT: the key."""
    signed = await ask_upload(w, data, ctype)
    assert await put(signed.url, data, ctype) in (200, 201)
    return signed.key


async def send_media(w: Wire, conv: int, key: str, cmid: str) -> SendAck:
    ack = await w.request(Send(0, conv, cmid, MsgType.IMAGE, media_content(key, name="a.png")))
    assert isinstance(ack, SendAck), ack
    return ack
