"""Many groups created at once (a login storm of group owners, the group bench's setup):
none fails. A creation that took a gap lock on its not-yet-existing seq row with a
locking read would deadlock with the others on their INSERTs into the same gap until
the retries ran out (ERROR unavailable)."""

from __future__ import annotations

import asyncio

import aiomysql
import pytest

from storage.models import StoreUnavailable
from storage.mysql import MySQLSettings, MySQLStore, migrate
from tests.support.services import drop_mysql, fresh_mysql


async def test_concurrent_group_creations_all_succeed() -> None:
    url = await fresh_mysql()
    store = MySQLStore(MySQLSettings.from_url(url + "&pool=40"))
    await store.start()
    try:
        for _ in range(3):
            made = await asyncio.gather(
                *(
                    store.create_group(owner, f"g{owner}", [owner + 1, owner + 2])
                    for owner in range(40)
                )
            )
            assert len({conv for conv, _ in made}) == 40
            assert {m.seq for _, m in made} == {1}
        convs = [conv for conv, _ in made]
        assert [await store.max_seq(c) for c in convs] == [1] * 40
    finally:
        await store.close()
        await drop_mysql(url)


async def test_migrate_upgrades_a_version_1_database() -> None:
    """A database made by the first release (no im_conv_seq.recalled_seq) is refused
    with what to run, and `migrate` upgrades it in place, keeping its data; migrating
    again changes nothing."""
    url = await fresh_mysql()
    settings = MySQLSettings.from_url(url)
    store = MySQLStore(settings)
    await store.start()
    conv = await store.open_p2p(1, 2)
    await store.close()
    conn = await aiomysql.connect(
        host=settings.host, port=settings.port, user=settings.user,
        password=settings.password, db=settings.database, autocommit=True,
    )  # fmt: skip
    try:
        async with conn.cursor() as cur:
            await cur.execute("ALTER TABLE im_conv_seq DROP COLUMN recalled_seq")
            await cur.execute("UPDATE im_meta SET value='1' WHERE name='schema_version'")
        old = MySQLStore(settings)
        with pytest.raises(StoreUnavailable, match="imgw db migrate"):
            await old.start()
        await old.close()
        assert "added im_conv_seq.recalled_seq" in await migrate(settings)
        assert "added im_conv_seq.recalled_seq" not in await migrate(settings)
        store = MySQLStore(settings)
        await store.start()
        assert await store.seq_bounds(conv) == (0, 0)
        await store.close()
    finally:
        conn.close()
        await drop_mysql(url)


async def test_a_request_that_meets_the_closed_pool_is_unavailable() -> None:
    """A node that stops (or fails to start) closes its pool under requests still in
    flight: they are answered `unavailable` (retry elsewhere), not `internal` from the
    driver's RuntimeError (seen in a reconnect storm whose new workers failed to start)."""
    url = await fresh_mysql()
    store = MySQLStore(MySQLSettings.from_url(url))
    await store.start()
    try:
        conv = await store.open_p2p(1, 2)
    finally:
        await store.close()
    try:
        with pytest.raises(StoreUnavailable, match="closed"):
            await store.max_seq(conv)
    finally:
        await drop_mysql(url)
