"""The media listener (gateway/mediahttp.py) on raw sockets: malformed requests get an
answer, downloads are served so that a browser never runs them, a peer that stops
reading is dropped, and closing the listener ends the connections it holds."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway import mediahttp
from gateway.mediahttp import MediaHttpServer
from storage.media.keys import media_key
from storage.media.objects import FileObjects

SECRET = b"0123456789abcdef-media"


@pytest.fixture
async def listener(tmp_path: Path) -> AsyncIterator[MediaHttpServer]:
    objects = FileObjects("file://", str(tmp_path / "media"), SECRET)
    server = MediaHttpServer(objects, "127.0.0.1", 0, reuse_port=False)
    await server.start()
    objects.base_url = lambda: f"http://127.0.0.1:{server.port}"
    try:
        yield server
    finally:
        await server.close()


def _objects(server: MediaHttpServer) -> FileObjects:
    return server._objects


async def _stored(server: MediaHttpServer, data: bytes, ctype: str) -> str:
    """An object stored under its key; its signed GET URL's path and query."""
    key = media_key(5, hashlib.sha256(data).hexdigest())
    path = _objects(server).path(key)

    def write() -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)

    await asyncio.to_thread(write)
    url = _objects(server).download_url(key, ctype, int(time.time()) + 60)
    return url.split(f":{server.port}", 1)[1]


async def _exchange(server: MediaHttpServer, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request)
        async with asyncio.timeout(5):
            return await reader.read()
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /x HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", b"414"),
    ],
)
async def test_an_overlong_head_is_answered(
    listener: MediaHttpServer, head: bytes, status: bytes
) -> None:
    reply = await _exchange(listener, head)
    assert reply.startswith(b"HTTP/1.1 " + status + b" "), reply[:80]


async def test_a_target_urlsplit_refuses_is_answered(listener: MediaHttpServer) -> None:
    reply = await _exchange(listener, b"GET http://[abc/media/1/x HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:80]


async def test_a_content_length_that_is_no_number_is_answered(
    listener: MediaHttpServer,
) -> None:
    data = b"some bytes"
    key = media_key(5, hashlib.sha256(data).hexdigest())
    url = _objects(listener).upload_url(key, len(data), "image/png", int(time.time()) + 60)
    target = url.split(f":{listener.port}", 1)[1].encode()
    # "\xb2" is latin-1 for a superscript two: str.isdigit() says yes, int() says no
    head = b"PUT " + target + b" HTTP/1.1\r\nContent-Length: \xb2\r\nContent-Type: image/png\r\n"
    reply = await _exchange(listener, head + b"\r\n" + data)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:80]


async def test_downloads_are_never_sniffed_nor_run_as_pages(listener: MediaHttpServer) -> None:
    target = await _stored(listener, b"<svg onload='alert(1)'/>", "image/svg+xml")
    reply = await _exchange(listener, f"GET {target} HTTP/1.1\r\n\r\n".encode())
    head = reply.split(b"\r\n\r\n", 1)[0].decode().lower()
    assert head.startswith("http/1.1 200 ")
    assert "\r\nx-content-type-options: nosniff" in head
    assert "\r\ncontent-security-policy: default-src 'none'; sandbox" in head


async def test_a_download_to_a_peer_that_stops_reading_is_dropped(
    listener: MediaHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mediahttp, "BODY_IDLE_S", 0.3)
    data = os.urandom(16 << 20)
    target = await _stored(listener, data, "application/octet-stream")
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port, limit=1 << 16)
    try:
        writer.write(f"GET {target} HTTP/1.1\r\n\r\n".encode())
        reader._transport.pause_reading()  # type: ignore[attr-defined]
        await asyncio.sleep(2)  # the listener's buffers fill; it waits, then gives up
        reader._transport.resume_reading()  # type: ignore[attr-defined]
        got = 0
        with contextlib.suppress(ConnectionError):  # dropped: a reset, or an early end
            async with asyncio.timeout(10):
                while chunk := await reader.read(1 << 20):
                    got += len(chunk)
        assert got < len(data)
    finally:
        writer.close()


async def test_closing_the_listener_ends_its_uploads(listener: MediaHttpServer) -> None:
    data = os.urandom(100_000)
    key = media_key(5, hashlib.sha256(data).hexdigest())
    url = _objects(listener).upload_url(key, len(data), "image/png", int(time.time()) + 60)
    target = url.split(f":{listener.port}", 1)[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        writer.write(
            f"PUT {target} HTTP/1.1\r\nContent-Length: {len(data)}\r\n"
            "Content-Type: image/png\r\n\r\n".encode()
            + data[:1000]
        )
        await writer.drain()
        await asyncio.sleep(0.3)  # the upload is under way
        directory = os.path.dirname(_objects(listener).path(key))
        assert [n for n in os.listdir(directory) if n.endswith(".part")]
        async with asyncio.timeout(5):
            await listener.close()
        async with asyncio.timeout(2):
            with contextlib.suppress(ConnectionResetError):
                assert await reader.read() == b""  # the connection was closed
        assert os.listdir(directory) == []  # the partial upload removed
    finally:
        writer.close()


async def test_an_upload_slower_than_the_minimum_rate_is_dropped(
    listener: MediaHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mediahttp, "BODY_IDLE_S", 0.5)
    monkeypatch.setattr(mediahttp, "MIN_RATE", 10_000)  # 5,000 bytes: at most 1 s
    data = os.urandom(5000)
    key = media_key(5, hashlib.sha256(data).hexdigest())
    url = _objects(listener).upload_url(key, len(data), "image/png", int(time.time()) + 60)
    target = url.split(f":{listener.port}", 1)[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)

    async def trickle() -> None:  # 100 bytes every 0.2 s: never idle, 10 s in all
        writer.write(
            f"PUT {target} HTTP/1.1\r\nContent-Length: {len(data)}\r\n"
            "Content-Type: image/png\r\n\r\n".encode()
        )
        for i in range(0, len(data), 100):
            writer.write(data[i : i + 100])
            await asyncio.sleep(0.2)

    sender = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(3):
            with contextlib.suppress(ConnectionResetError):
                assert await reader.read() == b""  # dropped, unanswered
        directory = os.path.dirname(_objects(listener).path(key))
        assert [n for n in os.listdir(directory) if n.endswith(".part")] == []
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
        writer.close()


async def test_connections_over_the_cap_are_turned_away(
    listener: MediaHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mediahttp, "MAX_CONNECTIONS", 2)
    idle = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(2)]
    try:
        await asyncio.sleep(0.2)  # both accepted, waiting for their heads
        reply = await _exchange(listener, b"")  # answered before it is read
        assert reply.startswith(b"HTTP/1.1 503 "), reply[:80]
    finally:
        for _, w in idle:
            w.close()


async def test_an_upload_the_disk_refuses_is_answered_500_and_leaves_nothing(
    listener: MediaHttpServer,
) -> None:
    """Where the object's directory should be there is a file (a broken or full disk
    looks the same to the listener): the uploader hears 500, retries later, and no
    half-written part is left."""
    data = b"bytes the disk will not take"
    key = media_key(5, hashlib.sha256(data).hexdigest())
    where = os.path.dirname(_objects(listener).path(key))

    def block() -> None:
        os.makedirs(os.path.dirname(where), exist_ok=True)
        with open(where, "wb") as fh:
            fh.write(b"not a directory")

    await asyncio.to_thread(block)
    url = _objects(listener).upload_url(key, len(data), "image/png", int(time.time()) + 60)
    target = url.split(f":{listener.port}", 1)[1].encode()
    head = b"PUT " + target + b" HTTP/1.1\r\nContent-Type: image/png\r\nContent-Length: "
    reply = await _exchange(listener, head + str(len(data)).encode() + b"\r\n\r\n" + data)
    assert reply.startswith(b"HTTP/1.1 500 "), reply[:80]
    left = await asyncio.to_thread(os.listdir, os.path.dirname(where))
    assert left == [os.path.basename(where)]  # the blocking file, no part beside it


def _upload_target(server: MediaHttpServer, data: bytes) -> str:
    key = media_key(5, hashlib.sha256(data).hexdigest())
    url = _objects(server).upload_url(key, len(data), "image/png", int(time.time()) + 60)
    return url.split(f":{server.port}", 1)[1]


def _put_head(target: str, size: int) -> bytes:
    head = f"PUT {target} HTTP/1.1\r\nContent-Length: {size}\r\nContent-Type: image/png\r\n"
    return head.encode() + b"\r\n"


def test_the_pace_floor_is_checked_as_the_body_travels() -> None:
    """wait_s: a head start of BODY_IDLE_S, then MIN_RATE bytes a second on average; each
    wait at most BODY_IDLE_S."""
    idle, rate = mediahttp.BODY_IDLE_S, mediahttp.MIN_RATE
    assert mediahttp.wait_s(100.0, 0, 100.0) == idle
    assert mediahttp.wait_s(100.0, 0, 100.0 + idle) == 0  # nothing in the head start: out
    assert mediahttp.wait_s(100.0, 100 * rate, 100.0 + idle + 4) == idle  # far ahead
    assert mediahttp.wait_s(100.0, 10 * rate, 100.0 + idle + 9) == pytest.approx(1)
    assert mediahttp.wait_s(100.0, rate, 100.0 + idle + 60) < 0  # far behind


async def test_a_trickle_is_dropped_long_before_its_size_would_allow(
    listener: MediaHttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large body sent a few bytes at a time is cut once it falls behind the floor,
    not at the end of the time its whole size would take."""
    monkeypatch.setattr(mediahttp, "BODY_IDLE_S", 0.5)
    monkeypatch.setattr(mediahttp, "MIN_RATE", 10_000)  # 1 MB: up to 100 s at that rate
    data = os.urandom(1_000_000)
    target = _upload_target(listener, data)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)

    async def trickle() -> None:  # 100 bytes every 0.1 s: never idle, far below the floor
        writer.write(_put_head(target, len(data)))
        for i in range(0, len(data), 100):
            writer.write(data[i : i + 100])
            await asyncio.sleep(0.1)

    sender = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(3):
            with contextlib.suppress(ConnectionResetError):
                assert await reader.read() == b""  # dropped, unanswered
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await sender
        writer.close()


async def test_a_url_takes_one_put_at_a_time(listener: MediaHttpServer) -> None:
    data = os.urandom(50_000)
    target = _upload_target(listener, data)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        writer.write(_put_head(target, len(data)) + data[:1000])
        await writer.drain()
        await asyncio.sleep(0.3)  # the first upload is under way
        second = await _exchange(listener, _put_head(target, len(data)) + data)
        assert second.startswith(b"HTTP/1.1 409 "), second[:80]
        writer.write(data[1000:])  # the first one finishes
        async with asyncio.timeout(5):
            first = await reader.read()
        assert first.startswith(b"HTTP/1.1 201 "), first[:80]
        again = await _exchange(listener, _put_head(target, len(data)) + data)
        assert again.startswith(b"HTTP/1.1 201 "), again[:80]  # free again: a retry works
    finally:
        writer.close()


async def test_connections_from_one_address_are_capped(tmp_path: Path) -> None:
    objects = FileObjects("file://", str(tmp_path / "media"), SECRET)
    server = MediaHttpServer(objects, "127.0.0.1", 0, reuse_port=False, per_address=2)
    await server.start()
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    try:
        await asyncio.sleep(0.2)  # both accepted, waiting for their heads
        reply = await _exchange(server, b"")  # answered before it is read
        assert reply.startswith(b"HTTP/1.1 429 "), reply[:80]
        for _, w in idle:
            w.close()
        await asyncio.sleep(0.2)  # their handlers ended
        reply = await _exchange(server, b"GET /x HTTP/1.1\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 403 "), reply[:80]  # let in again
    finally:
        for _, w in idle:
            w.close()
        await server.close()
