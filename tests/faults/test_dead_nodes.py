"""Which nodes are dead, as every node learns it from the outbox leases on MariaDB: a
node whose lease lapsed or was claimed by a survivor is dead, stays dead once the
survivor deleted its row, and is alive again once it holds a lease (a restart with the
same node id). The node skips duplicate-login kicks to dead nodes (gateway/node.py)."""

from __future__ import annotations

from typing import Any

from gateway.outbox import OutboxKeeper
from storage.models import OutboxRow
from storage.mysql import MySQLSettings, MySQLStore
from tests.support.services import drop_mysql, fresh_mysql


class _Log:
    def warning(self, *_: Any, **__: Any) -> None:
        pass


async def _nothing(_: OutboxRow) -> None:
    pass


async def _settled() -> bool:
    return True


async def test_lapsed_claimed_and_swept_nodes_are_dead_until_they_lease_again() -> None:
    url = await fresh_mysql()
    store = MySQLStore(MySQLSettings.from_url(url))
    await store.start()
    try:
        outbox = store.outbox()
        assert outbox is not None
        me = OutboxKeeper(
            outbox, "me", lease_s=5.0, redeliver=_nothing, settled=_settled,
            owes_hints=lambda: False, log=_Log(),
        )  # fmt: skip
        await outbox.keep_lease("alive", 5_000)
        await outbox.keep_lease("killed", -1_000)  # lapsed a second ago
        await outbox.keep_lease("claimed", -1_000)
        await outbox.keep_lease("survivor", 5_000)
        assert sorted(await outbox.claim_lapsed("survivor", 5_000)) == ["claimed", "killed"]
        await outbox.release("killed", "survivor")  # swept and deleted: no row left
        await me.tick()
        assert not me.is_dead("me") and not me.is_dead("alive")
        assert not me.is_dead("survivor")
        assert me.is_dead("claimed")  # claimed, being swept: its expiry is fresh
        assert not me.is_dead("killed")  # deleted before this node ever saw it dead
        assert not me.is_dead("never-seen")
        await outbox.keep_lease("alive", -1_000)  # stops renewing
        await me.tick()  # (claims it: the sweep owes nothing and releases it)
        assert me.is_dead("alive")
        await me.tick()  # its row is gone now: still remembered dead
        assert me.is_dead("alive")
        await outbox.keep_lease("alive", 5_000)  # restarted with the same node id
        await me.tick()
        assert not me.is_dead("alive")
    finally:
        await store.close()
        await drop_mysql(url)
