"""Pipelines of packed commands on a redis-py connection pool, for the hot paths.

redis-py's `Pipeline` costs ~15 us of Python per command (argument encoding, per-command
bookkeeping, response callbacks); the route lookups of fan-out and the script calls of
route renewals and the recent cache send thousands of commands a second, where that was
over a fifth of a worker's CPU at 4,000 msg/s. Here a command is packed once into RESP
by `pack`, a pipeline is one write of the joined bytes, and the replies are read in
order with the connection's own parser (hiredis when installed) and returned raw: as
the connection's protocol gives them (an HGETALL reply is a dict on RESP3, the default
of redis-py 8, and a flat `[field, value, …]` list on RESP2: `field_pairs` reads both).

Only for commands that are safe to send twice (reads, and scripts that are idempotent):
after a broken connection — a pooled socket that died with a Redis restart — the whole
pipeline is sent once more on a fresh connection, as the client's own retry policy
does. The caller bounds the time (`storage.redis.errors.unavailable`); a pipeline cut
off mid-way closes its connection, so no later pipeline reads its replies.

On Redis Cluster there is no single connection to write to (`cluster_pipeline`): the
commands go through redis-py's cluster pipeline, which groups them by the master of each
key's slot, sends one pipeline per master concurrently, and sends a command answered
MOVED, ASK or TRYAGAIN (a slot moved or moving) again on its own, following the
redirection. Slower per command than the packed path, and correct. Callers choose by
the client's type, so the single-Redis path always takes the packed one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

Arg = bytes | str | int
Command = tuple[Arg, ...]  # a command's name and arguments, not yet packed


def _arg(a: Arg) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, int):
        return b"%d" % a
    raise TypeError(f"cannot send {type(a).__name__} to Redis")


def pack(*args: Arg) -> bytes:
    """One command in RESP: `*<n>` then `$<len>` and the bytes of each argument."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = _arg(a)
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


# A reply as the RESP parser returns it. Any: its shape is the command's (bytes, int,
# None, a list or map of replies); each caller reads the commands it sent.
Reply = Any


def field_pairs(reply: Reply) -> Iterable[tuple[bytes, bytes]]:
    """The (field, value) pairs of a raw HGETALL reply, RESP3 map or RESP2 list."""
    if isinstance(reply, dict):
        return reply.items()
    return zip(reply[::2], reply[1::2], strict=True)


async def pipeline(client: aioredis.Redis, commands: Sequence[bytes]) -> list[Reply]:
    """Send packed `commands` in one write; their replies in order. An error reply is
    returned as its exception (a `ResponseError`), not raised."""
    if not commands:
        return []
    payload = b"".join(commands)
    pool = client.connection_pool
    for attempt in (1, 2):
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(payload)
            replies: list[Reply] = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as e:
                    replies.append(e)
            return replies
        except RedisConnectionError:
            await conn.disconnect()
            if attempt == 2:
                raise
        except BaseException:
            await conn.disconnect()  # replies may be left unread: never reuse it
            raise
        finally:
            await pool.release(conn)
    raise AssertionError("unreachable")


async def cluster_pipeline(client: RedisCluster, commands: Sequence[Command]) -> list[Reply]:
    """`commands` on Redis Cluster: each routed by its key's slot, redirections followed
    (see the module docstring). Every key one command touches must share a slot."""
    if not commands:
        return []
    pipe = client.pipeline()
    for name, *args in commands:  # redis-py routes by the name as a str
        pipe.execute_command(name.decode() if isinstance(name, bytes) else str(name), *args)
    replies: list[Reply] = await pipe.execute(raise_on_error=False)
    return replies
