"""Media by object key on the gateway (docs/media.md): what MEDIA_UPLOAD, MEDIA_GET and a
media SEND ask of the media index and the object store, with the configured limits.

`Media.open` builds it from the config: the index in the store's database (SQLite or
the MySQL metadata database), the objects (`file://` or `s3://`) and, for `file://`,
the signing secret (given, or generated once in the data dir)."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from protocol.mediakeys import SHA256_RE, media_key, parse_key, type_allowed
from protocol.ops import ErrorCode
from storage.media.index_sqlite import CLAIMED_MS, MediaIndex, SqliteMediaIndex
from storage.media.objects import MediaObjects, open_objects
from storage.media.sweep import sweep_orphans

# A message may reference an unreferenced upload until this long before the sweep may
# delete it, so that a reference never races the sweep (docs/decisions.md).
SEND_MARGIN_MS: Final = 3_600_000
REFERENCING_MAX: Final = 100  # conversations looked at for a MEDIA_GET
SECRET_FILE: Final = "media.secret"


class MediaError(Exception):
    """A media request refused with ERROR `code`."""

    def __init__(self, code: ErrorCode, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


@dataclass(frozen=True, slots=True)
class SignedUrl:
    key: str
    url: str  # "" for an upload already stored and referenced: nothing to upload
    expires_ms: int


def _secret(data_dir: str, given: str) -> bytes:
    """The file:// signing secret: given, or read from (created once in) the data dir,
    so that every worker and restart signs alike. Created whole or not at all (written
    aside, then linked into place): a worker starting beside another never reads half."""
    if given:
        return given.encode()
    path = Path(data_dir) / SECRET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        tmp = path.with_name(f"{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # fails if another process got there first: use theirs
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    secret = path.read_bytes().strip()
    if len(secret) < 16:
        raise ValueError(f"{path}: the media secret is shorter than 16 bytes")
    return secret


def open_index(store_url: str) -> MediaIndex:
    """The media index in the database of the store at `store_url`."""
    scheme = urlsplit(store_url).scheme
    if scheme == "sqlite":
        from storage.factory import sqlite_path

        path, opts = sqlite_path(store_url)
        return SqliteMediaIndex(path, busy_timeout_ms=int(opts.get("busy_timeout_ms", "5000")))
    from storage.media.index_mysql import MySQLMediaIndex
    from storage.mysql import MySQLSettings

    return MySQLMediaIndex(MySQLSettings.from_url(store_url))


class Media:
    def __init__(
        self,
        index: MediaIndex,
        objects: MediaObjects,
        *,
        max_size: int,
        types: tuple[str, ...],
        url_ttl_s: int,
        orphan_ms: int,
        clock: Callable[[], int],
    ) -> None:
        self.index = index
        self.objects = objects
        self.max_size = max_size
        self.types = types
        self.url_ttl_s = url_ttl_s
        self.orphan_ms = orphan_ms
        self.clock = clock  # ms since the epoch: the store's clock

    @classmethod
    def from_config(
        cls,
        *,
        media_url: str,
        store_url: str,
        data_dir: str,
        secret: str,
        max_size: int,
        types: tuple[str, ...],
        url_ttl_s: int,
        orphan_s: int,
        clock: Callable[[], int],
    ) -> Media:
        key = _secret(data_dir, secret) if media_url.startswith("file:") else b""
        return cls(
            open_index(store_url),
            open_objects(media_url, key),
            max_size=max_size,
            types=types,
            url_ttl_s=url_ttl_s,
            orphan_ms=orphan_s * 1000,
            clock=clock,
        )

    async def open(self) -> None:
        await self.index.open()

    async def close(self) -> None:
        await self.index.close()

    def _exp_s(self) -> int:
        return int(time.time()) + self.url_ttl_s

    async def upload(self, uid: int, sha256: str, size: int, content_type: str) -> SignedUrl:
        """MEDIA_UPLOAD: record the upload and sign its PUT URL."""
        if not SHA256_RE.fullmatch(sha256):
            raise MediaError(ErrorCode.BAD_REQUEST, "sha256 must be 64 lowercase hex digits")
        if size < 1:
            raise MediaError(ErrorCode.BAD_REQUEST, "an empty file is not uploaded")
        if size > self.max_size:
            raise MediaError(ErrorCode.CONTENT_TOO_LARGE, f"an upload is 1..{self.max_size} bytes")
        if not type_allowed(content_type, self.types):
            raise MediaError(
                ErrorCode.FORBIDDEN, f"content type {content_type!r} is not accepted here"
            )
        key = media_key(uid, sha256)
        exp = self._exp_s()
        row = await self.index.record_upload(key, uid, size, content_type, self.clock())
        if not row.referenced and row.created_ms == CLAIMED_MS:
            # the sweep is deleting an earlier, never sent upload of this file: a new
            # URL now could have the new upload deleted with it
            raise MediaError(
                ErrorCode.UNAVAILABLE, "an earlier upload of this file is being deleted: ask again"
            )
        if row.referenced and await self.objects.size_of(key) == row.size:
            return SignedUrl(key, "", exp * 1000)  # stored already: send the key
        return SignedUrl(key, self.objects.upload_url(key, size, content_type, exp), exp * 1000)

    async def check_reference(self, uid: int, conv_id: int, key: str) -> None:
        """A SEND by `uid` to `conv_id` of a message carrying `key`: the key must be an
        upload of `uid`'s that is stored; the reference is recorded (before the commit:
        the sweep can never delete what a committed message carries)."""
        parsed = parse_key(key)
        if parsed is None:
            raise MediaError(ErrorCode.BAD_REQUEST, "the media key is malformed")
        if parsed[0] != uid:
            raise MediaError(ErrorCode.FORBIDDEN, "a media key may only be sent by its uploader")
        row = await self.index.get_upload(key)
        if row is None or row.uid != uid:
            raise MediaError(ErrorCode.FORBIDDEN, "no upload of this key: ask MEDIA_UPLOAD")
        if not row.referenced and row.created_ms < self.clock() - self.orphan_ms + SEND_MARGIN_MS:
            raise MediaError(
                ErrorCode.FORBIDDEN, "this upload is too old to be sent: ask MEDIA_UPLOAD again"
            )
        stored = await self.objects.size_of(key)
        if stored is None:
            raise MediaError(ErrorCode.BAD_REQUEST, "the file is not uploaded yet")
        if stored != row.size:
            raise MediaError(ErrorCode.BAD_REQUEST, "the uploaded file has another size")
        if not await self.index.add_reference(key, conv_id, self.clock()):
            raise MediaError(ErrorCode.FORBIDDEN, "no upload of this key: ask MEDIA_UPLOAD")

    async def download(self, key: str, may_read: Callable[[int], Awaitable[bool]]) -> SignedUrl:
        """MEDIA_GET: a signed GET URL if `may_read(conv_id)` holds for a conversation
        referencing `key`."""
        if parse_key(key) is None:
            raise MediaError(ErrorCode.BAD_REQUEST, "the media key is malformed")
        for conv_id in await self.index.referencing(key, REFERENCING_MAX):
            if await may_read(conv_id):
                row = await self.index.get_upload(key)
                if row is None:
                    break
                exp = self._exp_s()
                url = self.objects.download_url(key, row.content_type, exp)
                return SignedUrl(key, url, exp * 1000)
        # the same answer for a key that does not exist: it tells a guesser nothing
        raise MediaError(
            ErrorCode.FORBIDDEN, "no conversation of yours holds a message with this key"
        )

    async def sweep(self, now_ms: int | None = None) -> int:
        """Delete a bounded number of orphaned uploads (housekeeping)."""
        now = self.clock() if now_ms is None else now_ms
        return await sweep_orphans(self.index, self.objects, now_ms=now, orphan_ms=self.orphan_ms)
