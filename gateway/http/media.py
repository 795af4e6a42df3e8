"""The media listener (`--media-listen`): serves the signed URLs of a `file://` media root
(storage/media/signing.py) on the shared HTTP listener (gateway/http/listener.py), so a
client may send several requests on one connection (a PUT, then a GET of the object):

- `PUT /media/<uid>/<sha256>?exp&size&type&sig` with `Content-Length: size` and
  `Content-Type: type`: the body is streamed to a temporary file beside the object,
  its SHA-256 checked against the key, then renamed into place (fsynced). 201.
  A chunked PUT is refused with 411, as S3 refuses one: the signed URL fixes the
  length, and Content-Length states it before a byte of the body is read.
- `GET` of a signed download URL: the object, as the signed type, in chunks. 200.

Refusals, as text/plain: 403 (a bad or expired signature), 400 (a malformed request,
another body than the key's hash), 411 (no Content-Length), 413 (another length than
signed), 404 (no such object), 405 (another method; `Allow: GET, PUT`), 409 (a PUT of a
URL whose upload is under way on another connection), 500 (the disk failed; retry
later). A request line or header over the listener's field limit, or too many headers,
is answered by aiohttp's parser (400 or 431) and the connection closed. A refusal of a
request with a body closes its connection (nothing of the body is kept).
Downloads are served with `X-Content-Type-Options: nosniff` and a sandboxing CSP, so
that an upload of an allowed type a browser could run (SVG, say) is never a page.
A peer that sends or reads nothing for BODY_IDLE_S is dropped, and so is one that falls
behind the floor on a body's pace, checked as the body travels (slowloris): by any
moment, MIN_RATE bytes a second since the body began, less BODY_IDLE_S of head start
(`wait_s`). A dropped connection gets no answer; a disk error after a download's head
went out also drops it (the peer sees a short body). A request's head must arrive
within HEAD_TIMEOUT_S, and a connection that sends nothing is closed after as long.
At most MAX_CONNECTIONS are open at once (503 beyond), and at most `per_address` from
one client address (429 beyond; 0: no cap). `close` ends every connection still open
(an upload under way is removed).
Apart from the admin port (gateway/http/admin.py), which is for operators, holds at most
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
from aiohttp import web

from gateway.http.listener import HttpError, HttpListener, Limits
from gateway.logs import Throttle
from protocol.mediakeys import parse_key
from storage.media.objects import FileObjects
from storage.media.signing import Grant, SignatureError, verify

CHUNK: Final = 256 * 1024
MAX_HEADERS: Final = 64
HEAD_TIMEOUT_S: Final = 10.0
BODY_IDLE_S: Final = 30.0  # the longest wait for the next chunk of a body, either way
MIN_RATE: Final = 8 * 1024  # bytes/s: a body may take BODY_IDLE_S + size / MIN_RATE
MAX_CONNECTIONS: Final = 4096  # open at once on one listener (one worker)
PER_ADDRESS_DEFAULT: Final = 64  # open at once from one client address
CLOSE_GRACE_S: Final = 0.2  # what `close` gives a request under way before cancelling it
# on downloads: never sniffed into another type, never run as a page of this origin
SAFE_HEADERS: Final = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
}


class _Dropped(Exception):
    """The peer is dropped unanswered: too slow, gone, or a download cut short."""


class MediaListener:
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
        limits = Limits(
            max_connections=MAX_CONNECTIONS,
            per_address=per_address,
            head_timeout_s=HEAD_TIMEOUT_S,
            idle_timeout_s=HEAD_TIMEOUT_S,
            max_headers=MAX_HEADERS,
        )
        self._http = HttpListener(
            self._handle, host, port, name="media", limits=limits, reuse_port=reuse_port
        )
        self._uploading: set[Grant] = set()  # the URLs whose PUT is under way
        self.log = structlog.get_logger("imgw.media")
        self._log_throttle = Throttle(time.monotonic)  # refusals come from anyone

    @property
    def port(self) -> int:
        return self._http.port

    async def start(self) -> None:
        await self._http.start()

    async def close(self) -> None:
        """Stop listening and end the connections still open: a request under way gets
        CLOSE_GRACE_S, then is cancelled (an upload's temporary file is removed)."""
        await self._http.close(CLOSE_GRACE_S)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        transport = request.transport  # kept: aiohttp forgets it once it closes it
        try:
            return await self._serve(request, transport)
        except HttpError as e:
            e.close = e.close or request.body_exists  # its body, or what is left, unread
            raise
        except (_Dropped, ConnectionError, TimeoutError, asyncio.CancelledError) as e:
            # the peer is too slow or gone, or `close` cancelled the request: abort, as
            # closing would wait for a peer that reads nothing to take the rest
            if transport is not None:
                transport.abort()
            request.protocol.force_close()
            if isinstance(e, asyncio.CancelledError):
                raise
            # never sent (the connection is gone): aiohttp's writing it ends the request
            return web.Response(status=408)
        except OSError as e:  # the disk (full, unreadable), before the answer began
            self._disk_failed(e)
            close = request.body_exists
            raise HttpError(500, "storage failed; retry later", close=close) from None

    async def _serve(
        self, request: web.BaseRequest, transport: asyncio.Transport | None
    ) -> web.StreamResponse:
        if request.method not in ("GET", "PUT"):
            raise HttpError(405, "use GET or PUT of a signed URL", headers={"Allow": "GET, PUT"})
        grant = self._grant(request)
        if request.method == "PUT":
            return await self._put(request, grant)
        return await self._get(request, grant, transport)

    def _grant(self, request: web.BaseRequest) -> Grant:
        """What the request's signed URL allows, or HttpError 400 or 403."""
        try:
            url = urlsplit(request.raw_path)
        except ValueError:  # "http://[x/..." (a bad IPv6 host), say
            raise HttpError(400, "bad request target") from None
        secret = self._objects.secret
        try:
            grant = verify(secret, request.method, unquote(url.path), url.query, time.time())
        except SignatureError as e:
            if (held := self._log_throttle.allow("refused")) is not None:
                self.log.info(
                    "media URL refused",
                    method=request.method,
                    reason=e.reason,
                    similar_held_back=held,
                )
            raise HttpError(403, "URL refused (bad or expired signature)") from None
        if parse_key(grant.key) is None:
            raise HttpError(400, "not a media key")
        return grant

    def _disk_failed(self, e: OSError) -> None:
        if (held := self._log_throttle.allow("disk")) is not None:
            self.log.error("media file I/O failed", error=repr(e), similar_held_back=held)

    async def _put(self, request: web.BaseRequest, grant: Grant) -> web.StreamResponse:
        if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            raise HttpError(411, f"send the body with Content-Length: {grant.size}")
        length = request.content_length  # aiohttp's parser refuses one that is no number
        if length is None:
            raise HttpError(411, f"Content-Length must be {grant.size}")
        if length != grant.size:
            raise HttpError(413, f"Content-Length must be {grant.size}")
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype != grant.content_type:
            raise HttpError(400, f"Content-Type must be {grant.content_type}")
        if grant in self._uploading:
            raise HttpError(409, "this URL's upload is under way; retry later")
        self._uploading.add(grant)
        try:
            await self._receive(request, grant)
        finally:
            self._uploading.discard(grant)
        return web.Response(status=201)

    async def _receive(self, request: web.BaseRequest, grant: Grant) -> None:
        """The body, to a temporary file beside the object, then into place."""
        expect = request.headers.get("Expect", "").lower()
        if expect == "100-continue" and request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the answer itself has not begun
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
                    chunk = await request.content.read(min(CHUNK, grant.size - got))
                if not chunk:
                    raise HttpError(400, "the body ended early", close=True)
                got += len(chunk)
                digest.update(chunk)
                await asyncio.to_thread(fh.write, chunk)
            if digest.hexdigest() != grant.key.rsplit("/", 1)[1]:
                raise HttpError(400, "the body's SHA-256 is not the key's")
            await asyncio.to_thread(_finish, fh, tmp, path)
        except BaseException:
            fh.close()
            # not in a thread: `close` cancels this task, and the part must be gone
            # when it returns (one unlink)
            _unlink(tmp)
            raise

    async def _get(
        self, request: web.BaseRequest, grant: Grant, transport: asyncio.Transport | None
    ) -> web.StreamResponse:
        try:
            fh: IO[bytes] = await asyncio.to_thread(open, self._objects.path(grant.key), "rb")
        except FileNotFoundError:
            raise HttpError(404, "no such object") from None
        try:
            size = os.fstat(fh.fileno()).st_size
            headers = {"Content-Type": grant.content_type, **SAFE_HEADERS}
            reply = web.StreamResponse(headers=headers)
            reply.content_length = size
            await reply.prepare(request)
            loop = asyncio.get_running_loop()
            began = loop.time()
            sent = 0
            while sent < size:
                chunk = await self._read(fh, min(CHUNK, size - sent))
                # what the peer has taken: all but the transport's buffer (the kernel's
                # socket buffers count as taken, a head start of a few MiB at most)
                buffered = transport.get_write_buffer_size() if transport else 0
                taken = max(0, sent - buffered)
                async with asyncio.timeout(wait_s(began, taken, loop.time())):
                    await reply.write(chunk)  # drains when the transport's buffer is full
                sent += len(chunk)
            return reply
        finally:
            fh.close()

    async def _read(self, fh: IO[bytes], n: int) -> bytes:
        """The next chunk of a download whose head went out: a disk error, or a file
        shorter than its head said, can only end the connection now, not answer 500."""
        try:
            chunk = await asyncio.to_thread(fh.read, n)
        except OSError as e:
            self._disk_failed(e)
            raise _Dropped from e
        if not chunk:
            raise _Dropped("the object is shorter than its Content-Length")
        return chunk


def wait_s(began: float, done: int, now: float) -> float:
    """How long a body that began at `began` and has moved `done` bytes may wait for the
    next bytes (either way) before its peer is dropped: until it falls behind MIN_RATE
    bytes a second since it began, less a head start of BODY_IDLE_S, and never longer
    than BODY_IDLE_S. At or below 0 the peer is behind already: only bytes that have
    arrived are taken, the next wait times out at once."""
    return min(BODY_IDLE_S, began + BODY_IDLE_S + done / MIN_RATE - now)


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
