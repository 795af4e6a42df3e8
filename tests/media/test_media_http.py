"""The media listener (gateway/http/media.py) on raw sockets: malformed requests get an
answer, a client may PUT then GET on one connection, downloads are served so that a
browser never runs them, a peer that stops reading is dropped, and closing the listener
ends the connections it holds."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import io
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.http import media
from gateway.http.media import MediaListener
from protocol.mediakeys import media_key
from storage.media.objects import FileObjects
from tests.support.rawhttp import closed, reply

SECRET = b"0123456789abcdef-media"
HOST = "Host: 127.0.0.1\r\n"


@pytest.fixture
async def listener(tmp_path: Path) -> AsyncIterator[MediaListener]:
    async with _serving(tmp_path) as server:
        yield server


@contextlib.asynccontextmanager
async def _serving(
    tmp_path: Path, per_address: int = media.PER_ADDRESS_DEFAULT
) -> AsyncIterator[MediaListener]:
    objects = FileObjects("file://", str(tmp_path / "media"), SECRET)
    server = MediaListener(objects, "127.0.0.1", 0, reuse_port=False, per_address=per_address)
    await server.start()
    objects.base_url = lambda: f"http://127.0.0.1:{server.port}"
    try:
        yield server
    finally:
        await server.close()


def _objects(server: MediaListener) -> FileObjects:
    return server._objects


def _stored_files(server: MediaListener) -> list[str]:
    """Every file under the media root (objects and parts)."""
    root = _objects(server).root
    return [os.path.join(d, n) for d, _, names in os.walk(root) for n in names]


async def _stored(server: MediaListener, data: bytes, ctype: str) -> str:
    """An object stored under its key; its signed GET URL's path and query."""
    key = media_key(5, hashlib.sha256(data).hexdigest())
    path = _objects(server).path(key)

    def write() -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)

    await asyncio.to_thread(write)
    return _download_target(server, data, ctype)


def _download_target(server: MediaListener, data: bytes, ctype: str) -> str:
    key = media_key(5, hashlib.sha256(data).hexdigest())
    url = _objects(server).download_url(key, ctype, int(time.time()) + 60)
    return url.split(f":{server.port}", 1)[1]


def _upload_target(server: MediaListener, data: bytes) -> str:
    key = media_key(5, hashlib.sha256(data).hexdigest())
    url = _objects(server).upload_url(key, len(data), "image/png", int(time.time()) + 60)
    return url.split(f":{server.port}", 1)[1]


def _put_head(target: str, size: int) -> bytes:
    head = f"PUT {target} HTTP/1.1\r\n{HOST}Content-Length: {size}\r\nContent-Type: image/png\r\n"
    return head.encode() + b"\r\n"


def _get_head(target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\n{HOST}\r\n".encode()


async def _exchange(server: MediaListener, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own, and the reply."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request)
        return await reply(reader)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "head",
    [
        b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + b"".join(b"X-%d: 1\r\n" % i for i in range(100))
        + b"\r\n",
    ],
)
async def test_an_overlong_head_is_answered_and_the_connection_closed(
    listener: MediaListener, head: bytes
) -> None:
    """aiohttp's parser answers (400 in aiohttp 3.14; 431 would do as well)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        writer.write(head)
        status, _, _ = await reply(reader)
        assert status in (400, 431)
        assert await closed(reader)
        assert _stored_files(listener) == []
    finally:
        writer.close()


async def test_a_target_urlsplit_refuses_is_answered(listener: MediaListener) -> None:
    status, _, _ = await _exchange(
        listener, f"GET http://[abc/media/1/x HTTP/1.1\r\n{HOST}\r\n".encode()
    )
    assert status == 400


async def test_a_content_length_that_is_no_number_is_answered(
    listener: MediaListener,
) -> None:
    data = b"some bytes"
    target = _upload_target(listener, data).encode()
    # "\xb2" is latin-1 for a superscript two: str.isdigit() says yes, int() says no
    head = b"PUT " + target + b" HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        writer.write(head + b"Content-Type: image/png\r\n\r\n" + data)
        status, _, _ = await reply(reader)
        assert status == 400  # aiohttp's parser
        assert await closed(reader)
        assert _stored_files(listener) == []
    finally:
        writer.close()


async def test_a_put_then_a_get_on_one_connection(listener: MediaListener) -> None:
    data = os.urandom(300_000)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        writer.write(_put_head(_upload_target(listener, data), len(data)) + data)
        status, _, _ = await reply(reader)
        assert status == 201
        writer.write(_get_head(_download_target(listener, data, "image/png")))
        status, headers, body = await reply(reader)
        assert (status, headers["content-type"], body) == (200, "image/png", data)
        writer.write(_get_head("/media/5/nothing?exp=1&type=a/b&sig=x"))  # still open
        status, _, _ = await reply(reader)
        assert status == 403
    finally:
        writer.close()


async def test_a_put_with_expect_100_continue_hears_continue_first(
    listener: MediaListener,
) -> None:
    data = os.urandom(5000)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        head = _put_head(_upload_target(listener, data), len(data))
        writer.write(head[:-2] + b"Expect: 100-continue\r\n\r\n")
        async with asyncio.timeout(5):
            interim = await reader.readuntil(b"\r\n\r\n")
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(data)
        status, _, _ = await reply(reader)
        assert status == 201
    finally:
        writer.close()


async def test_a_chunked_put_is_refused_411(listener: MediaListener) -> None:
    data = b"some bytes"
    target = _upload_target(listener, data)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        writer.write(
            f"PUT {target} HTTP/1.1\r\n{HOST}Transfer-Encoding: chunked\r\n"
            f"Content-Type: image/png\r\n\r\n{len(data):x}\r\n".encode()
            + data
            + b"\r\n0\r\n\r\n"
        )
        status, _, _ = await reply(reader)
        assert status == 411
        assert await closed(reader)
        assert _stored_files(listener) == []
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("body", "ctype", "status"),
    [
        (b"some byte", "image/png", 413),  # another Content-Length than signed
        (b"some bytes", "image/gif", 400),  # another Content-Type than signed
        (b"other byte", "image/png", 400),  # another body than the key's hash
    ],
)
async def test_a_put_unlike_its_url_is_refused(
    listener: MediaListener, body: bytes, ctype: str, status: int
) -> None:
    target = _upload_target(listener, b"some bytes")
    head = f"PUT {target} HTTP/1.1\r\n{HOST}Content-Length: {len(body)}\r\n"
    head += f"Content-Type: {ctype}\r\n\r\n"
    got, _, _ = await _exchange(listener, head.encode() + body)
    assert got == status
    assert _stored_files(listener) == []


async def test_other_methods_are_refused_405_with_allow(listener: MediaListener) -> None:
    status, headers, body = await _exchange(listener, f"POST /x HTTP/1.1\r\n{HOST}\r\n".encode())
    assert (status, headers["allow"]) == (405, "GET, PUT")
    assert headers["content-type"].startswith("text/plain")
    assert body == b"use GET or PUT of a signed URL\n"


async def test_a_download_of_no_object_is_404(listener: MediaListener) -> None:
    status, _, _ = await _exchange(listener, _get_head(_download_target(listener, b"x", "a/b")))
    assert status == 404


async def test_downloads_are_never_sniffed_nor_run_as_pages(listener: MediaListener) -> None:
    target = await _stored(listener, b"<svg onload='alert(1)'/>", "image/svg+xml")
    status, headers, body = await _exchange(listener, _get_head(target))
    assert (status, body) == (200, b"<svg onload='alert(1)'/>")
    assert headers["content-type"] == "image/svg+xml"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["content-security-policy"] == "default-src 'none'; sandbox"


async def test_a_disk_error_after_the_head_went_out_ends_the_connection(
    listener: MediaListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object's second chunk cannot be read: the peer has the head and the first
    chunk, then the connection ends (a short body, never a 500 after a 200)."""
    data = os.urandom(3 * media.CHUNK)
    target = await _stored(listener, data, "application/octet-stream")

    class FailingFile(io.FileIO):
        reads = 0

        def read(self, size: int = -1) -> bytes:
            self.reads += 1
            if self.reads > 1:
                raise OSError(errno.EIO, "Input/output error")
            return super().read(size)

    monkeypatch.setattr(media, "open", lambda path, mode: FailingFile(path), raising=False)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        writer.write(_get_head(target))
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert f"Content-Length: {len(data)}\r\n".encode() in head
        got = 0
        with contextlib.suppress(ConnectionResetError):
            async with asyncio.timeout(5):
                while chunk := await reader.read(1 << 16):  # until the connection ends
                    got += len(chunk)
        assert got <= media.CHUNK  # the first chunk at most
    finally:
        writer.close()


async def test_a_download_to_a_peer_that_stops_reading_is_dropped(
    listener: MediaListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(media, "BODY_IDLE_S", 0.3)
    data = os.urandom(16 << 20)
    target = await _stored(listener, data, "application/octet-stream")
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port, limit=1 << 16)
    try:
        writer.write(_get_head(target))
        reader._transport.pause_reading()  # type: ignore[attr-defined]
        await asyncio.sleep(1)  # the listener's buffers fill; it waits, then gives up
        reader._transport.resume_reading()  # type: ignore[attr-defined]
        got = 0
        with contextlib.suppress(ConnectionError):  # dropped: a reset, or an early end
            async with asyncio.timeout(10):
                while chunk := await reader.read(1 << 20):
                    got += len(chunk)
        assert got < len(data)
    finally:
        writer.close()


async def test_closing_the_listener_ends_its_uploads(listener: MediaListener) -> None:
    data = os.urandom(100_000)
    key = media_key(5, hashlib.sha256(data).hexdigest())
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        writer.write(_put_head(_upload_target(listener, data), len(data)) + data[:1000])
        await writer.drain()
        await asyncio.sleep(0.3)  # the upload is under way
        directory = os.path.dirname(_objects(listener).path(key))
        assert [n for n in os.listdir(directory) if n.endswith(".part")]
        async with asyncio.timeout(5):
            await listener.close()
        assert await closed(reader)  # the connection was closed
        assert await closed(idle_reader)  # and so was the idle one
        assert os.listdir(directory) == []  # the partial upload removed
    finally:
        writer.close()
        idle_writer.close()


async def test_an_upload_slower_than_the_minimum_rate_is_dropped(
    listener: MediaListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(media, "BODY_IDLE_S", 0.5)
    monkeypatch.setattr(media, "MIN_RATE", 10_000)  # 5,000 bytes: at most 1 s
    data = os.urandom(5000)
    key = media_key(5, hashlib.sha256(data).hexdigest())
    target = _upload_target(listener, data)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)

    async def trickle() -> None:  # 100 bytes every 0.2 s: never idle, 10 s in all
        writer.write(_put_head(target, len(data)))
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(media, "MAX_CONNECTIONS", 2)
    async with _serving(tmp_path) as server:
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        try:
            await asyncio.sleep(0.2)  # both accepted, waiting for their heads
            status, headers, _ = await _exchange(server, b"")  # answered before it is read
            assert (status, headers["retry-after"]) == (503, "1")
        finally:
            for _, w in idle:
                w.close()


async def test_an_upload_the_disk_refuses_is_answered_500_and_leaves_nothing(
    listener: MediaListener,
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
    status, _, _ = await _exchange(
        listener, _put_head(_upload_target(listener, data), len(data)) + data
    )
    assert status == 500
    left = await asyncio.to_thread(os.listdir, os.path.dirname(where))
    assert left == [os.path.basename(where)]  # the blocking file, no part beside it


def test_the_pace_floor_is_checked_as_the_body_travels() -> None:
    """wait_s: a head start of BODY_IDLE_S, then MIN_RATE bytes a second on average; each
    wait at most BODY_IDLE_S."""
    idle, rate = media.BODY_IDLE_S, media.MIN_RATE
    assert media.wait_s(100.0, 0, 100.0) == idle
    assert media.wait_s(100.0, 0, 100.0 + idle) == 0  # nothing in the head start: out
    assert media.wait_s(100.0, 100 * rate, 100.0 + idle + 4) == idle  # far ahead
    assert media.wait_s(100.0, 10 * rate, 100.0 + idle + 9) == pytest.approx(1)
    assert media.wait_s(100.0, rate, 100.0 + idle + 60) < 0  # far behind


async def test_a_trickle_is_dropped_long_before_its_size_would_allow(
    listener: MediaListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large body sent a few bytes at a time is cut once it falls behind the floor,
    not at the end of the time its whole size would take."""
    monkeypatch.setattr(media, "BODY_IDLE_S", 0.5)
    monkeypatch.setattr(media, "MIN_RATE", 10_000)  # 1 MB: up to 100 s at that rate
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


async def test_a_url_takes_one_put_at_a_time(listener: MediaListener) -> None:
    data = os.urandom(50_000)
    target = _upload_target(listener, data)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        writer.write(_put_head(target, len(data)) + data[:1000])
        await writer.drain()
        await asyncio.sleep(0.3)  # the first upload is under way
        second, _, _ = await _exchange(listener, _put_head(target, len(data)) + data)
        assert second == 409
        writer.write(data[1000:])  # the first one finishes
        first, _, _ = await reply(reader)
        assert first == 201
        again, _, _ = await _exchange(listener, _put_head(target, len(data)) + data)
        assert again == 201  # free again: a retry works
    finally:
        writer.close()


async def test_connections_from_one_address_are_capped(tmp_path: Path) -> None:
    async with _serving(tmp_path, per_address=2) as server:
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        try:
            await asyncio.sleep(0.2)  # both accepted, waiting for their heads
            status, _, _ = await _exchange(server, b"")  # answered before it is read
            assert status == 429
            for _, w in idle:
                w.close()
            await asyncio.sleep(0.2)  # their connections ended
            status, _, _ = await _exchange(server, _get_head("/x"))
            assert status == 403  # let in again
        finally:
            for _, w in idle:
                w.close()
