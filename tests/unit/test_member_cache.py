"""The embedded store's in-memory caches are bounded: the member cache drops the least
recently used conversations first, and what it answers stays right (a changed
conversation is read again); the writer's max-seq cache is cleared past its bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.embedded import EmbeddedStore
from storage.embedded import store as embedded
from storage.models import AppendStatus, NewMessage


async def test_member_cache_keeps_at_most_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "MEMBER_CACHE_ROWS", 30)
    store = EmbeddedStore(str(tmp_path / "s.db"))
    await store.start()
    try:
        groups = [(await store.create_group(1, f"g{i}", [1, 2, 3]))[0] for i in range(40)]
        hot = groups[0]
        for g in groups:
            assert await store.member_uids(g) == [1, 2, 3]
            assert await store.member_uids(hot) == [1, 2, 3]  # used all along
        cache = store._members
        assert sum(len(m.rows) for m in cache.values()) <= 30
        assert hot in cache and groups[1] not in cache  # least recently used went first
        await store.change_members(hot, 1, [4], [])
        assert await store.member_uids(hot) == [1, 2, 3, 4]  # read again after the change
    finally:
        await store.close()


async def test_seq_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "SEQ_CACHE_MAX", 5)
    store = EmbeddedStore(str(tmp_path / "s.db"))
    await store.start()
    try:
        groups = [(await store.create_group(1, f"g{i}", [1, 2]))[0] for i in range(12)]
        for g in groups:
            [r] = await store.append([NewMessage(g, 1, f"m{g}", 1, b"x")])
            assert r.status is AppendStatus.STORED and r.message is not None
            assert r.message.seq == 2  # after the "created" message, whatever was dropped
            assert len(store._seqs) <= 6  # bounded (cleared once past 5)
    finally:
        await store.close()


async def test_a_removed_member_is_gone_from_the_cached_list_at_once(tmp_path: Path) -> None:
    store = EmbeddedStore(str(tmp_path / "s.db"))
    await store.start()
    try:
        conv, _ = await store.create_group(1, "g", [2, 3])
        assert await store.member_uids(conv) == [1, 2, 3]  # cached now
        change = await store.change_members(conv, 1, [], [2])
        assert await store.member_uids(conv) == [1, 3]
        former = await store.get_membership(conv, 2)
        assert former is not None and former.left_seq == change.messages[-1].seq
        assert await store.member_uids(conv + 1000) == []  # unknown: nothing to cache
        assert conv + 1000 not in store._members
    finally:
        await store.close()
