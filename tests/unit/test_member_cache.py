"""The embedded store's member cache is bounded: least recently used conversations go
first, and what it answers stays right (a changed conversation is read again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.embedded import EmbeddedStore
from storage.embedded import store as embedded


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
