"""Helpers of the media tests: files, uploads over HTTP, media messages over the wire."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from collections.abc import Iterator

import httpx
import pytest

from protocol.frames import MediaUpload, MediaUrl, Send, SendAck
from protocol.ops import MsgType
from storage.media.keys import media_content
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def moto_s3(monkeypatch: pytest.MonkeyPatch, bucket: str = "imgw") -> Iterator[str]:
    """An S3-compatible server (moto's standalone server) on a free port, with `bucket`;
    its endpoint URL. (tests/archive has the same for the archive.)"""
    import boto3
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for k, v in {
        "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket=bucket
        )
        yield endpoint
    finally:
        server.stop()
