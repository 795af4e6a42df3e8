"""Which connections are gone with their process, as every node learns it from the
outbox leases on MariaDB: those of a node whose lease lapsed or was claimed by a
survivor (dead still once the survivor deleted its row, alive again once it holds a
lease), and those made before a node with the same node id started again (at or below
its lease's connection-id floor). The node skips duplicate-login kicks to them
(gateway/node.py)."""

from __future__ import annotations

from typing import Any

from gateway.outbox import OutboxKeeper
from storage.models import OutboxRow
from storage.mysql import MySQLSettings, MySQLStore
from storage.mysql.schema import SCHEMA_VERSION
from tests.support.services import downgrade_then_migrate, drop_mysql, fresh_mysql


class _Log:
    def warning(self, *_: Any, **__: Any) -> None:
        pass


async def _nothing(_: OutboxRow) -> None:
    pass


async def _settled() -> bool:
    return True


async def test_connections_of_lapsed_claimed_swept_and_restarted_nodes_are_gone() -> None:
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
        await outbox.keep_lease("alive", 5_000, conn_floor=1_000)
        await outbox.keep_lease("killed", -1_000)  # lapsed a second ago
        await outbox.keep_lease("claimed", -1_000)
        await outbox.keep_lease("survivor", 5_000)
        assert sorted(await outbox.claim_lapsed("survivor", 5_000)) == ["claimed", "killed"]
        await outbox.release("killed", "survivor")  # swept and deleted: no row left
        await me.tick()
        assert not me.gone("me", 1) and not me.gone("survivor", 1)
        assert not me.gone("alive", 1_001)  # made by its current process
        assert me.gone("alive", 1_000)  # by an earlier process with its node id
        assert me.gone("claimed", 2**62)  # claimed, being swept: its expiry is fresh
        assert not me.gone("killed", 1)  # deleted before this node ever saw it dead
        assert not me.gone("never-seen", 1)
        await outbox.keep_lease("alive", -1_000, conn_floor=1_000)  # stops renewing
        await me.tick()  # (claims it: the sweep owes nothing and releases it)
        assert me.gone("alive", 2**62)
        await me.tick()  # its row is gone now: still remembered dead
        assert me.gone("alive", 2**62)
        await outbox.keep_lease("alive", 5_000, conn_floor=5_000)  # started again
        await me.tick()
        assert not me.gone("alive", 5_001) and me.gone("alive", 5_000)
    finally:
        await store.close()
        await drop_mysql(url)


async def test_migrate_adds_the_connection_floor_to_schema_7() -> None:
    url = await fresh_mysql()
    try:
        done = await downgrade_then_migrate(
            url, 7, "ALTER TABLE im_node_lease DROP COLUMN conn_floor"
        )
        assert "added im_node_lease.conn_floor" in done and SCHEMA_VERSION >= 8
        store = MySQLStore(MySQLSettings.from_url(url))
        await store.start()
        try:
            outbox = store.outbox()
            assert outbox is not None
            await outbox.keep_lease("n", 5_000, conn_floor=77)
            assert (await outbox.leases())["n"].conn_floor == 77
        finally:
            await store.close()
    finally:
        await drop_mysql(url)
