"""`--preload`: the rows the bench stores before measuring are rows the stores read as
their own (on SQLite and on MariaDB): history, idempotency, sync positions, and the next
seq of a preloaded conversation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bench.preload import DEVICE, UNREAD, Volume, preload
from storage.embedded import EmbeddedStore
from storage.models import AppendStatus, NewMessage
from storage.mysql import MySQLSettings, MySQLStore
from tests.support.services import drop_mysql, fresh_mysql

VOL = Volume.of(2_000, 100)


@pytest.fixture(params=["embedded", "mysql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "embedded":
        path = tmp_path / "data" / "imgw.db"
        preload(f"sqlite:///{path}", VOL, log=lambda _: None)
        s: Any = EmbeddedStore(str(path))
        await s.start()
        yield s
        await s.close()
    else:
        url = await fresh_mysql(shards=4)
        try:
            preload(url, VOL, log=lambda _: None)
            s = MySQLStore(MySQLSettings.from_url(url))
            await s.start()
            yield s
            await s.close()
        finally:
            await drop_mysql(url)


async def test_preloaded_rows_read_as_the_stores_own(store: Any) -> None:
    conv = 7
    top = VOL.max_seq(conv)
    assert top == VOL.messages // VOL.conversations
    a, b = VOL.members(conv)
    assert sorted(await store.member_uids(conv)) == [a, b]

    msgs, more = await store.read_after(conv, 0, 100, min_seq=0, max_seq=None)
    assert [m.seq for m in msgs] == list(range(1, top + 1)) and not more
    assert msgs[2].client_msg_id == f"pre.{conv}.3"

    sent = await store.find_sent(msgs[2].sender_uid, f"pre.{conv}.3")
    assert sent is not None and (sent.conv_id, sent.seq) == (conv, 3)

    page = await store.sync(a, DEVICE, changed_since_ms=0, after=None, limit=10)
    rows = {r.conv_id: r for r in page.rows}
    assert set(rows) == {conv - 1, conv}  # a is the higher member of conv - 1
    assert rows[conv].max_seq == top
    assert rows[conv].read_seq == top - UNREAD
    assert rows[conv].delivered_seq == top
    assert 0 < rows[conv].unread <= UNREAD  # the unread ones the other member sent

    # A new message goes after the preloaded ones, and a preloaded id is a duplicate.
    res = await store.append(
        [
            NewMessage(conv, a, "after-preload", 1, b"hi"),
            NewMessage(conv, msgs[2].sender_uid, f"pre.{conv}.3", 1, msgs[2].content),
        ]
    )
    assert res[0].status is AppendStatus.STORED and res[0].message.seq == top + 1
    assert res[1].status is AppendStatus.DUPLICATE and res[1].message.seq == 3
