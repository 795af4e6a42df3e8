"""Packed pipelines (storage/redis/raw.py): the same replies redis-py gives, error replies
returned in place, one retry after a connection died with a Redis restart, and a
pipeline cut off by its caller's timeout never leaves replies for the next one."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from storage.redis import raw, redis_from_url


def test_field_pairs_of_either_protocol() -> None:
    assert list(raw.field_pairs({b"a": b"1"})) == [(b"a", b"1")]  # RESP3 map
    assert list(raw.field_pairs([b"a", b"1", b"b", b"2"])) == [(b"a", b"1"), (b"b", b"2")]


def test_pack_is_resp() -> None:
    assert raw.pack(b"SET", "k", 12) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n"
    assert raw.pack(b"GET", b"a\r\nb") == b"*2\r\n$3\r\nGET\r\n$4\r\na\r\nb\r\n"
    assert raw.pack(b"ECHO", "é") == b"*2\r\n$4\r\nECHO\r\n$2\r\n\xc3\xa9\r\n"
    with pytest.raises(TypeError):
        raw.pack(b"SET", "k", 1.5)  # type: ignore[arg-type]


async def test_replies_in_order_with_errors_in_place(client: aioredis.Redis, prefix: str) -> None:
    k, h = f"{prefix}k", f"{prefix}h"
    await client.hset(h, mapping={"a": b"1", "b": b"\x00\xff"})
    replies = await raw.pipeline(
        client,
        [
            raw.pack(b"SET", k, b"v\r\n"),
            raw.pack(b"GET", k),
            raw.pack(b"HGETALL", h),
            raw.pack(b"INCR", k),  # not an integer: an error reply
            raw.pack(b"HGETALL", f"{prefix}none"),
        ],
    )
    assert replies[:2] == [b"OK", b"v\r\n"]
    assert dict(raw.field_pairs(replies[2])) == {b"a": b"1", b"b": b"\x00\xff"}
    assert isinstance(replies[3], ResponseError)
    assert list(raw.field_pairs(replies[4])) == []
    assert await raw.pipeline(client, []) == []


async def test_one_retry_after_the_connection_died(client: aioredis.Redis, prefix: str) -> None:
    """Every pooled connection killed (as by a Redis restart): the pipeline still answers."""
    await raw.pipeline(client, [raw.pack(b"SET", f"{prefix}k", b"1")])
    await client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert await raw.pipeline(client, [raw.pack(b"GET", f"{prefix}k")]) == [b"1"]


async def test_a_cut_off_pipeline_leaves_nothing_for_the_next(prefix: str) -> None:
    """A reply still on its way when the caller gave up (a BLPOP answering after 0.5 s,
    cut off at 0.2 s) is never read as the answer to the next pipeline."""
    client, _ = redis_from_url("redis://127.0.0.1:6379/0?max_connections=1")
    try:
        await raw.pipeline(client, [raw.pack(b"SET", f"{prefix}a", b"A")])
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await raw.pipeline(client, [raw.pack(b"BLPOP", f"{prefix}none", b"0.5")])
        await asyncio.sleep(0.5)  # the BLPOP's nil reply would have arrived by now
        assert await raw.pipeline(client, [raw.pack(b"GET", f"{prefix}a")]) == [b"A"]
    finally:
        await client.aclose()
