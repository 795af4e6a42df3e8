"""A shard server's health (storage/mysql/health.py): which failures mark it down, and
its probe marking it up once it answers."""

from __future__ import annotations

import asyncio

import pytest

from storage.errors import StoreUnavailable
from storage.mysql import health as health_module
from storage.mysql.health import ServerHealth, unreachable


def _raised(make: object) -> BaseException:
    try:
        assert callable(make)
        make()
    except BaseException as e:
        return e
    raise AssertionError("nothing raised")


def _timed_out() -> None:
    raise StoreUnavailable("MySQL: TimeoutError()") from TimeoutError()


def _refused_statement() -> None:
    raise StoreUnavailable("MySQL: message shard moving") from ValueError("1146")


def _asked_what_landed() -> None:
    """The send path: the first failure re-raised `from None` after a second one."""
    try:
        _timed_out()
    except StoreUnavailable as failure:
        try:
            _timed_out()
        except StoreUnavailable:
            raise failure from None


def test_a_timeout_or_a_refused_connection_says_unreachable_a_refused_statement_not() -> None:
    assert unreachable(_raised(_timed_out))
    assert unreachable(_raised(_asked_what_landed))
    assert not unreachable(_raised(_refused_statement))
    assert not unreachable(ValueError("not a store failure"))


async def test_down_until_a_probe_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_module, "PROBE_S", 0.0)
    answers = asyncio.Queue[bool]()
    up = asyncio.Event()

    async def ping() -> None:
        if not await answers.get():
            raise StoreUnavailable("no")

    health = ServerHealth("db2:3306", ping, up.set)
    health.failed(_raised(_refused_statement))
    assert not health.down
    health.failed(_raised(_timed_out))
    assert health.down and health.down_count == 1
    health.failed(_raised(_timed_out))  # already down: one probe
    assert health.down_count == 1
    assert "db2:3306 is down" in str(health.error())
    answers.put_nowait(False)
    answers.put_nowait(True)
    await asyncio.wait_for(up.wait(), 5)
    assert not health.down and answers.empty()
    await health.close()
