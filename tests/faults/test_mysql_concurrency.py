"""Many groups created at once (a login storm of group owners, the group bench's setup):
none fails. Each creation used to take a gap lock on its not-yet-existing seq row with
a locking read, and concurrent creations deadlocked on their INSERTs into the same gap
until the retries ran out (ERROR unavailable)."""

from __future__ import annotations

import asyncio

from storage.mysql import MySQLSettings, MySQLStore
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
