"""The orphan sweep (storage/media/sweep.py) on fakes: bounded batches, the object
deleted before its row, rows claimed first (a reference or a renewed URL keeps them)."""

from __future__ import annotations

import dataclasses

from storage.media.index_sqlite import CLAIMED_MS, Upload
from storage.media.sweep import sweep_orphans

DAY = 86_400_000
NOW = 10 * DAY


class Index:
    def __init__(self, uploads: list[Upload]) -> None:
        self.rows = {u.key: u for u in uploads}
        self.log: list[str] = []
        self.renew_on_read: set[str] = set()

    async def orphans(self, before_ms: int, limit: int) -> list[Upload]:
        found = [u for u in self.rows.values() if not u.referenced and u.created_ms < before_ms]
        return sorted(found, key=lambda u: u.created_ms)[:limit]

    async def claim(self, key: str, before_ms: int) -> bool:
        row = self.rows.get(key)
        if row is not None and key in self.renew_on_read:  # a new URL handed out meanwhile
            row = self.rows[key] = dataclasses.replace(row, created_ms=NOW)
        if row is None or row.referenced or row.created_ms == CLAIMED_MS:
            return False
        if row.created_ms >= before_ms:
            return False
        self.rows[key] = dataclasses.replace(row, created_ms=CLAIMED_MS)
        return True

    async def forget(self, key: str, before_ms: int) -> bool:
        row = self.rows.get(key)
        if row is None or row.referenced or row.created_ms >= before_ms:
            return False
        del self.rows[key]
        self.log.append(f"row {key}")
        return True


class Objects:
    def __init__(self, index: Index) -> None:
        self.index = index

    async def delete(self, key: str) -> None:
        self.index.log.append(f"object {key}")


def upload(i: int, *, age_ms: int, referenced: bool = False) -> Upload:
    return Upload(f"k{i:02d}", 1, 10, "image/png", NOW - age_ms, referenced)


async def test_the_sweep_is_bounded_and_deletes_the_object_first() -> None:
    index = Index([upload(i, age_ms=2 * DAY - i) for i in range(10)])
    objects = Objects(index)
    deleted = await sweep_orphans(index, objects, now_ms=NOW, orphan_ms=DAY, batch=3, batches=2)
    assert deleted == 6 and len(index.rows) == 4
    assert index.log[:2] == ["object k00", "row k00"]  # oldest first, object then row
    assert await sweep_orphans(index, objects, now_ms=NOW, orphan_ms=DAY) == 4
    assert index.rows == {}


async def test_young_referenced_and_renewed_uploads_stay() -> None:
    index = Index(
        [
            upload(1, age_ms=DAY - 1),  # not a day old
            upload(2, age_ms=3 * DAY, referenced=True),
            upload(3, age_ms=3 * DAY),  # renewed between the listing and the delete
            upload(4, age_ms=3 * DAY),
        ]
    )
    index.renew_on_read.add("k03")
    assert await sweep_orphans(index, Objects(index), now_ms=NOW, orphan_ms=DAY) == 1
    assert sorted(index.rows) == ["k01", "k02", "k03"]
    assert index.log == ["object k04", "row k04"]


async def test_a_claimed_row_left_by_a_stopped_sweep_is_finished() -> None:
    index = Index([upload(1, age_ms=NOW - CLAIMED_MS)])  # created_ms == CLAIMED_MS
    assert await sweep_orphans(index, Objects(index), now_ms=NOW, orphan_ms=DAY) == 1
    assert index.log == ["object k01", "row k01"] and index.rows == {}
