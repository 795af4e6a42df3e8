"""The MySQL revocation log (storage/mysql/revocations.py) on the real MariaDB: reads by
the database's clock, pages, pruning, and the migration that adds its table."""

from __future__ import annotations

import pytest

from storage.mysql import MySQLSettings, MySQLStore
from storage.revocations import ALL_DEVICES, SYNC_OVERLAP_MS, Revocation
from tests.support.services import downgrade_then_migrate, drop_mysql, fresh_mysql

NOW = 1_800_000_000


async def test_the_mysql_log_reads_changes_by_the_database_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = await fresh_mysql()
    store = MySQLStore(MySQLSettings.from_url(url))
    await store.start()
    try:
        log = store.revocations
        assert log.shared
        await log.record(Revocation(2**64 - 1, ALL_DEVICES, NOW, 2**40))
        for device in ("a", "b", "c"):
            await log.record(Revocation(5, device, NOW, 2**40))
        await log.record(Revocation(5, "a", NOW - 10, 2**39))  # never lowers the times
        await log.record(Revocation(6, "a", NOW, 1))  # long expired
        live = [
            Revocation(5, "a", NOW, 2**40),
            Revocation(5, "b", NOW, 2**40),
            Revocation(5, "c", NOW, 2**40),
            Revocation(2**64 - 1, ALL_DEVICES, NOW, 2**40),
        ]
        rows, now_ms = await log.changed_since(None)
        assert rows == live
        monkeypatch.setattr("storage.mysql.revocations.LOAD_PAGE", 2)  # pages end mid-uid
        assert (await log.changed_since(None))[0] == live
        assert (await log.changed_since(now_ms + 60_000))[0] == []
        changed, _ = await log.changed_since(now_ms - SYNC_OVERLAP_MS)
        assert len(changed) == 5  # the expired one too: the copy ignores it
        assert await log.prune(NOW) == 1
    finally:
        await store.close()
        await drop_mysql(url)


async def test_migrate_adds_the_revocation_table_to_schema_8() -> None:
    url = await fresh_mysql()
    try:
        done = await downgrade_then_migrate(url, 8, "DROP TABLE im_revocation")
        assert done
        store = MySQLStore(MySQLSettings.from_url(url))
        await store.start()
        try:
            await store.revocations.record(Revocation(5, "a", NOW, NOW + 60))
        finally:
            await store.close()
    finally:
        await drop_mysql(url)
