"""Running registered Lua scripts, one or many per round trip.

A single script call goes through redis-py's `AsyncScript` (EVALSHA, SCRIPT LOAD and retry
on NOSCRIPT). Many calls go through `run_pipelined`: one non-transactional pipeline of
EVALSHA, one script call per item, so each call touches one hash slot and the batch stays
cluster-safe (packed and read by `storage.redis.raw`: the scripts used this way are safe
to run twice). redis-py's own pipeline support for scripts sends a SCRIPT EXISTS before
every pipeline (a second round trip); here the pipeline is sent as is, and only when
Redis answers NOSCRIPT (its script cache was flushed, e.g. by a restart) are the scripts
loaded and the refused calls sent again. A refused call did not run, so that is safe.
On Redis Cluster the pipeline is one per master (`raw.cluster_pipeline`), and SCRIPT LOAD goes to
every master.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, ClassVar

from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from storage.errors import CacheUnavailable
from storage.pacing import Pacer
from storage.redis import raw
from storage.redis.connect import Client
from storage.redis.errors import unavailable
from storage.redis.raw import Reply

# Comparison of canonical non-negative decimal strings (no leading zeros): exact for the
# whole u64 range, where Lua's doubles are not.
LUA_GT = """
local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
"""

ScriptCall = tuple[AsyncScript, Sequence[str], Sequence[str | int | bytes]]


async def run_pipelined(
    client: Client, calls: Sequence[ScriptCall], *, raise_errors: bool = True
) -> list[Reply]:
    """Run `calls` in one pipeline round trip (two more only after a script cache flush);
    returns the replies in order. The first error reply is raised, or with
    `raise_errors=False` returned in its place."""
    if not calls:
        return []
    results = await _send(client, calls)
    missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
    if missing:
        for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
            script.sha = await client.script_load(script.script)
        retried = await _send(client, [calls[i] for i in missing])
        for i, r in zip(missing, retried, strict=True):
            results[i] = r
    if raise_errors:
        for r in results:
            if isinstance(r, Exception):
                raise r
    return results


async def _send(client: Client, calls: Sequence[ScriptCall]) -> list[Reply]:
    if isinstance(client, RedisCluster):
        return await raw.cluster_pipeline(
            client,
            [(b"EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls],
        )
    return await raw.pipeline(
        client,
        [raw.pack(b"EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls],
    )


class Coalescer:
    """Script calls sent together in one pipeline (`run_pipelined`): a storm of logins or
    disconnects costs a round trip and a pooled connection per pipeline, not per call.
    When a pipeline goes is a `Pacer`'s (storage/pacing.py): at most MAX_IN_FLIGHT out,
    at most one every LINGER_S under load, at once when idle.

    Each caller gets its own reply: its own error reply as `CacheUnavailable` (one bad
    call fails only its caller), and each caller its own `CacheUnavailable` when the
    pipeline itself fails."""

    MAX_IN_FLIGHT: ClassVar[int] = 2
    MAX_CALLS: ClassVar[int] = 1024  # per pipeline
    LINGER_S: ClassVar[float] = 0.02  # a login under load waits at most this for its route

    def __init__(self, client: Client, what: str, limit_s: float) -> None:
        self._client = client
        self._what = what
        self._limit = limit_s
        self._pending: list[tuple[ScriptCall, asyncio.Future[Reply]]] = []
        self._pacer = Pacer(
            self._next,
            lambda: len(self._pending),
            self._cancel_pending,
            in_flight=self.MAX_IN_FLIGHT,
            linger_s=self.LINGER_S,
        )

    async def call(self, call: ScriptCall) -> Reply:
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending.append((call, fut))
        self._pacer.request()
        return await fut

    def _next(self) -> Coroutine[Any, Any, None]:
        batch = self._pending[: self.MAX_CALLS]
        del self._pending[: self.MAX_CALLS]
        return self._send(batch)

    def _cancel_pending(self) -> None:  # shutdown: so are the calls still waiting
        batch, self._pending = self._pending, []
        for _, fut in batch:
            fut.cancel()

    async def _send(self, batch: list[tuple[ScriptCall, asyncio.Future[Reply]]]) -> None:
        try:
            async with unavailable(self._what, self._limit):
                results = await run_pipelined(
                    self._client, [call for call, _ in batch], raise_errors=False
                )
        except Exception as e:
            for _, fut in batch:
                if not fut.done():  # a fresh exception each: they are raised in many tasks
                    fut.set_exception(_unavailable(str(e), e))
            return
        except BaseException:  # cancelled (shutdown): so are the calls
            for _, fut in batch:
                fut.cancel()
            raise
        for (_, fut), result in zip(batch, results, strict=True):
            if fut.done():
                continue
            if isinstance(result, Exception):
                fut.set_exception(_unavailable(f"redis: {self._what} failed: {result}", result))
            else:
                fut.set_result(result)


def _unavailable(text: str, cause: BaseException) -> CacheUnavailable:
    e = CacheUnavailable(text)
    e.__cause__ = cause
    return e
