"""Housekeeping on MySQL: idempotency records are kept 48 h (the protocol promises 24)
and then pruned in bounded batches; the message rows stay."""

from __future__ import annotations

import time

from storage.models import NewMessage
from storage.mysql import MySQLSettings, MySQLStore
from tests.support.services import drop_mysql, fresh_mysql


async def test_dedup_records_pruned_after_48h_only() -> None:
    url = await fresh_mysql()
    clock = [int(time.time() * 1000)]
    store = MySQLStore(MySQLSettings.from_url(url), clock=lambda: clock[0])
    await store.start()
    try:
        conv = await store.open_p2p(1, 2)
        await store.append([NewMessage(conv, 1, f"old-{i}", 1, b"x") for i in range(5)])
        clock[0] += 47 * 3600 * 1000
        await store.append([NewMessage(conv, 1, "recent", 1, b"y")])
        assert await store.prune_dedup() == 0  # nothing is 48 h old yet
        clock[0] += 2 * 3600 * 1000
        assert await store.prune_dedup(limit=3) == 3  # bounded
        assert await store.prune_dedup() == 2
        assert await store.find_sent(1, "recent") is not None
        assert await store.find_sent(1, "old-0") is None
        msgs, _ = await store.read_after(conv, 0, 50, min_seq=0, max_seq=None)
        assert len(msgs) == 6  # messages are never pruned
    finally:
        await store.close()
        await drop_mysql(url)
