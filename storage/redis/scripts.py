"""Running registered Lua scripts, one or many per round trip.

A single script call goes through redis-py's `AsyncScript` (EVALSHA, SCRIPT LOAD and retry
on NOSCRIPT). Many calls go through `run_pipelined`: one non-transactional pipeline of
EVALSHA, one script call per item, so each call touches one hash slot and the batch stays
cluster-safe (packed and read by `storage.redis.raw`: the scripts used this way are safe
to run twice). redis-py's own pipeline support for scripts sends a SCRIPT EXISTS before
every pipeline (a second round trip); here the pipeline is sent as is, and only when
Redis answers NOSCRIPT (its script cache was flushed, e.g. by a restart) are the scripts
loaded and the refused calls sent again. A refused call did not run, so that is safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from storage.redis import raw

# Comparison of canonical non-negative decimal strings (no leading zeros): exact for the
# whole u64 range, where Lua's doubles are not.
LUA_GT = """
local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
"""

ScriptCall = tuple[AsyncScript, Sequence[str], Sequence[str | int | bytes]]


async def run_pipelined(client: aioredis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    """Run `calls` in one pipeline round trip (two more only after a script cache flush);
    returns the replies in order. The first error reply is raised."""
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
    for r in results:
        if isinstance(r, Exception):
            raise r
    return results


async def _send(client: aioredis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    return await raw.pipeline(
        client,
        [raw.pack(b"EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls],
    )
