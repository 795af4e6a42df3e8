"""The orphan sweep against an uploader coming back at the same moment, on the real
media index (SQLite and MySQL): however the two interleave, the sweep never deletes the
object of an upload a message references."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.media import Media, MediaError
from storage.media.index_sqlite import MediaIndex, SqliteMediaIndex
from storage.media.objects import FileObjects

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
T0 = 1_750_000_000_000
DATA = b"a file to race the sweep with"
SHA = hashlib.sha256(DATA).hexdigest()
UID = 7


class RacingObjects(FileObjects):
    """File objects where `before_delete` runs just before the sweep deletes an object."""

    before_delete: Callable[[], Awaitable[None]] | None = None

    async def delete(self, key: str) -> None:
        if self.before_delete is not None:
            hook, self.before_delete = self.before_delete, None
            await hook()
        await super().delete(key)


@pytest.fixture(params=["sqlite", "mysql"])
async def index(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MediaIndex]:
    if request.param == "sqlite":
        idx: MediaIndex = SqliteMediaIndex(str(tmp_path / "imgw.db"))
        await idx.open()
        try:
            yield idx
        finally:
            await idx.close()
        return
    from storage.media.index_mysql import MySQLMediaIndex
    from storage.mysql import MySQLSettings
    from tests.support.services import drop_mysql, fresh_mysql

    url = await fresh_mysql()
    idx = MySQLMediaIndex(MySQLSettings.from_url(url))
    await idx.open()
    try:
        yield idx
    finally:
        await idx.close()
        await drop_mysql(url)


async def test_an_upload_renewed_and_sent_while_swept_keeps_its_object(
    index: MediaIndex, tmp_path: Path
) -> None:
    now = [T0]
    objects = RacingObjects("file://", str(tmp_path / "media"), b"0123456789abcdef")
    media = Media(
        index, objects, max_size=1000, types=("image/*",), url_ttl_s=900,
        orphan_ms=DAY_MS, clock=lambda: now[0],
    )  # fmt: skip
    signed = await media.upload(UID, SHA, len(DATA), "image/png")
    path = objects.path(signed.key)

    def put() -> None:  # what the listener does with a PUT
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(DATA)

    put()
    now[0] += DAY_MS + HOUR_MS  # never sent: an orphan now

    async def the_uploader_comes_back() -> None:
        # between the sweep's decision and its delete: ask again, PUT again, send
        with contextlib.suppress(MediaError):
            await media.upload(UID, SHA, len(DATA), "image/png")
            put()
            await media.check_reference(UID, 99, signed.key)

    objects.before_delete = the_uploader_comes_back
    await media.sweep()
    row = await index.get_upload(signed.key)
    if row is not None and row.referenced:
        assert await objects.size_of(signed.key) == len(DATA), "a referenced object deleted"
    # afterwards the file can be uploaded and sent again
    again = await media.upload(UID, SHA, len(DATA), "image/png")
    put()
    await media.check_reference(UID, 99, again.key)
    assert await index.referencing(again.key, 10) == [99]
    assert await media.sweep(now[0] + 3 * DAY_MS) == 0
    assert await objects.size_of(again.key) == len(DATA)
