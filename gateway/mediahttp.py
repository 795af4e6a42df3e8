"""The media listener (`--media-listen`): serves the signed URLs of a `file://` media root
(storage/media/signing.py). One request per connection, then close:

- `PUT /media/<uid>/<sha256>?exp&size&type&sig` with `Content-Length: size` and
  `Content-Type: type`: the body is streamed to a temporary file beside the object,
  its SHA-256 checked against the key, then renamed into place (fsynced). 201.
- `GET` of a signed download URL: the object, as the signed type. 200.

Refusals: 403 (a bad or expired signature), 400 (a malformed request, another body
than the key's hash), 413 (another length than signed), 404 (no such object), 405,
409 (a PUT of a URL whose upload is under way on another connection), 414 and 431 (a
request line or header over 64 KiB, more than 64 headers).
Downloads are served with `X-Content-Type-Options: nosniff` and a sandboxing CSP, so
that an upload of an allowed type a browser could run (SVG, say) is never a page.
A peer that sends or reads nothing for BODY_IDLE_S is dropped, and so is one that falls
behind the floor on a body's pace, checked as the body travels (slowloris): by any
moment, MIN_RATE bytes a second since the body began, less BODY_IDLE_S of head start
(`wait_s`). At most MAX_CONNECTIONS are open at once (503 beyond), and at most
`per_address` from one client address (429 beyond; 0: no cap). `close` ends every
connection still open (an upload under way is removed).
Apart from the admin port (gateway/admin.py), which is for operators, holds at most
256 KiB bodies and is usually bound to loopback: this one faces clients and streams."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from typing import IO, Final
from urllib.parse import unquote, urlsplit

import structlog

from gateway.logs import Throttle
from storage.media.keys import parse_key
from storage.media.objects import FileObjects
from storage.media.signing import Grant, SignatureError, verify

CHUNK: Final = 256 * 1024
MAX_HEADERS: Final = 64
HEAD_TIMEOUT_S: Final = 10.0
BODY_IDLE_S: Final = 30.0  # the longest wait for the next chunk of a body, either way
MIN_RATE: Final = 8 * 1024  # bytes/s: a body may take BODY_IDLE_S + size / MIN_RATE
MAX_CONNECTIONS: Final = 4096  # open at once on one listener (one worker)
PER_ADDRESS_DEFAULT: Final = 64  # open at once from one client address
# on downloads: never sniffed into another type, never run as a page of this origin
SAFE_HEADERS: Final = (
    "X-Content-Type-Options: nosniff\r\nContent-Security-Policy: default-src 'none'; sandbox\r\n"
)


class _Refused(Exception):
    def __init__(self, status: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class MediaHttpServer:
    def __init__(
        self,
        objects: FileObjects,
        host: str,
        port: int,
        *,
        reuse_port: bool,
        per_address: int = PER_ADDRESS_DEFAULT,
    ) -> None:
        self._objects = objects
        self._host = host
        self._port = port
        self._reuse_port = reuse_port
        self._per_address = per_address
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()  # the connections open
        self._open_from: dict[str, int] = {}  # connections open per client address
        self._uploading: set[Grant] = set()  # the URLs whose PUT is under way
        self.log = structlog.get_logger("imgw.media")
        self._log_throttle = Throttle(time.monotonic)  # refusals come from anyone

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self._host, self._port, reuse_port=self._reuse_port or None
        )

    async def close(self) -> None:
        """Stop listening and end the connections still open (on Python 3.11
        `wait_closed` does not wait for them)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        open_from = self._open_from.get(address, 0)
        if len(self._handlers) >= MAX_CONNECTIONS:
            status = b"503 Service Unavailable"
        elif self._per_address and open_from >= self._per_address:
            status = b"429 Too Many Requests"
        else:
            status = b""
        if status:
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n"
                b"Retry-After: 1\r\nConnection: close\r\n\r\n"
            )
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._open_from[address] = open_from + 1
        clean = False
        try:
            try:
                await self._serve(reader, writer)
            except _Refused as e:
                body = f"{e.text}\n".encode()
                writer.write(
                    f"HTTP/1.1 {e.status}\r\nContent-Type: text/plain\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
            await _drain(writer)
            clean = True
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            if (left := self._open_from.pop(address, 1) - 1) > 0:
                self._open_from[address] = left
            if clean:
                writer.close()
            else:  # close() would wait for a peer that reads nothing to take the rest
                writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            try:
                parts = (await reader.readline()).decode("latin-1").split()
            except ValueError:  # over the reader's limit (64 KiB)
                raise _Refused("414 URI Too Long", "request line too long") from None
            headers: dict[str, str] = {}
            for _ in range(MAX_HEADERS):
                try:
                    line = (await reader.readline()).decode("latin-1").strip()
                except ValueError:
                    raise _Refused(
                        "431 Request Header Fields Too Large", "header too long"
                    ) from None
                if not line:
                    break
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            else:
                raise _Refused("431 Request Header Fields Too Large", "too many headers")
        if len(parts) != 3:
            raise _Refused("400 Bad Request", "bad request line")
        method, target, version = parts
        if method not in ("GET", "PUT"):
            raise _Refused("405 Method Not Allowed", "use GET or PUT of a signed URL")
        try:
            url = urlsplit(target)
        except ValueError:  # "http://[x/..." (a bad IPv6 host), say
            raise _Refused("400 Bad Request", "bad request target") from None
        try:
            grant = verify(self._objects.secret, method, unquote(url.path), url.query, time.time())
        except SignatureError as e:
            if (held := self._log_throttle.allow("refused")) is not None:
                self.log.info(
                    "media URL refused", method=method, reason=e.reason, similar_held_back=held
                )
            raise _Refused("403 Forbidden", "URL refused (bad or expired signature)") from None
        if parse_key(grant.key) is None:
            raise _Refused("400 Bad Request", "not a media key")
        try:
            if method == "PUT":
                if grant in self._uploading:
                    raise _Refused("409 Conflict", "this URL's upload is under way; retry later")
                self._uploading.add(grant)
                try:
                    await self._put(grant, headers, version, reader, writer)
                finally:
                    self._uploading.discard(grant)
            else:
                await self._get(grant, writer)
        except OSError as e:  # the disk (full, unreadable); the peer's errors and timeouts pass
            if isinstance(e, ConnectionError | TimeoutError):
                raise
            if (held := self._log_throttle.allow("disk")) is not None:
                self.log.error("media file I/O failed", error=repr(e), similar_held_back=held)
            raise _Refused("500 Internal Server Error", "storage failed; retry later") from None

    async def _put(
        self,
        grant: Grant,
        headers: dict[str, str],
        version: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        length = headers.get("content-length", "")
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses
        if not (length.isascii() and length.isdigit()) or int(length) != grant.size:
            raise _Refused("413 Content Too Large", f"Content-Length must be {grant.size}")
        if headers.get("content-type", "").split(";")[0].strip().lower() != grant.content_type:
            raise _Refused("400 Bad Request", f"Content-Type must be {grant.content_type}")
        if headers.get("expect", "").lower() == "100-continue" and version == "HTTP/1.1":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        path = self._objects.path(grant.key)
        await asyncio.to_thread(os.makedirs, os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{time.monotonic_ns()}.part"
        digest = hashlib.sha256()
        fh: IO[bytes] = await asyncio.to_thread(open, tmp, "wb")
        try:
            loop = asyncio.get_running_loop()
            began = loop.time()
            got = 0
            while got < grant.size:
                async with asyncio.timeout(wait_s(began, got, loop.time())):
                    chunk = await reader.read(min(CHUNK, grant.size - got))
                if not chunk:
                    raise _Refused("400 Bad Request", "the body ended early")
                got += len(chunk)
                digest.update(chunk)
                await asyncio.to_thread(fh.write, chunk)
            if digest.hexdigest() != grant.key.rsplit("/", 1)[1]:
                raise _Refused("400 Bad Request", "the body's SHA-256 is not the key's")
            await asyncio.to_thread(_finish, fh, tmp, path)
        except BaseException:
            fh.close()
            await asyncio.to_thread(_unlink, tmp)
            raise
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    async def _get(self, grant: Grant, writer: asyncio.StreamWriter) -> None:
        try:
            fh: IO[bytes] = await asyncio.to_thread(open, self._objects.path(grant.key), "rb")
        except FileNotFoundError:
            raise _Refused("404 Not Found", "no such object") from None
        try:
            size = os.fstat(fh.fileno()).st_size
            writer.write(
                f"HTTP/1.1 200 OK\r\nContent-Type: {grant.content_type}\r\n{SAFE_HEADERS}"
                f"Content-Length: {size}\r\nConnection: close\r\n\r\n".encode()
            )
            loop = asyncio.get_running_loop()
            began = loop.time()
            sent = 0
            while chunk := await _read(fh):
                writer.write(chunk)
                sent += len(chunk)
                # what the peer has taken: all but the transport's buffer (the kernel's
                # socket buffers count as taken, a head start of a few MiB at most)
                taken = max(0, sent - writer.transport.get_write_buffer_size())
                async with asyncio.timeout(wait_s(began, taken, loop.time())):
                    await writer.drain()
        finally:
            fh.close()


async def _read(fh: IO[bytes]) -> bytes:
    """The next chunk of a download whose header went out: a disk error now can only end
    the connection (the peer sees a short body), not answer 500."""
    try:
        return await asyncio.to_thread(fh.read, CHUNK)
    except OSError as e:
        raise ConnectionAbortedError(f"reading the object failed: {e!r}") from e


def wait_s(began: float, done: int, now: float) -> float:
    """How long a body that began at `began` and has moved `done` bytes may wait for the
    next bytes (either way) before its peer is dropped: until it falls behind MIN_RATE
    bytes a second since it began, less a head start of BODY_IDLE_S, and never longer
    than BODY_IDLE_S. At or below 0 the peer is behind already: only bytes that have
    arrived are taken, the next wait times out at once."""
    return min(BODY_IDLE_S, began + BODY_IDLE_S + done / MIN_RATE - now)


async def _drain(writer: asyncio.StreamWriter) -> None:
    """Wait for the peer to take what was written, at most BODY_IDLE_S (TimeoutError)."""
    async with asyncio.timeout(BODY_IDLE_S):
        await writer.drain()


def _finish(fh: IO[bytes], tmp: str, path: str) -> None:
    """Flush the upload to disk and put it in place (atomically: a reader sees the old
    object or the whole new one)."""
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
