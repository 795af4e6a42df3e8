r"""Snowflake worker ids leased in Redis, so that two live workers never share one.

Keys: `<p>{wid}:<n>` (n in 0..1023; one hash tag, so the scripts touch one Redis
Cluster slot) → the owner's id, TTL `ttl_s` (60 s). A worker
acquires the first free id from a random starting point in one script (SET NX over the
range), renews it every `ttl_s / 4` by compare-and-set, and deletes it on a clean exit.

A renewal that finds the key gone (it expired while Redis was unreachable, or Redis lost
its data) takes it back if it is still free; one that finds it owned by another worker
gives the id up at once (`worker_id` -1: the gateway stops minting and answers sends
`unavailable`) and takes a fresh one. While Redis is unreachable the worker keeps its id
(sends must not stop with Redis) and renews every second, so that when Redis returns it
re-takes its key within a second; a worker that starts in that second and finds the key
expired could take the same id, and the two would share it until the first one's
renewal. That window, after an outage longer than the TTL, is the remaining risk; ids
are unique per message shard by primary key, not across shards.
"""

from __future__ import annotations

import random
from typing import Final

from storage.errors import CacheUnavailable
from storage.redis.connect import Client
from storage.redis.errors import op_timeout, unavailable
from storage.snowflake import MAX_WORKER

LEASE_TTL_S: Final = 60

# KEYS: the lease key of every id, in order. ARGV: owner, ttl_ms, start.
# Returns the acquired id, or -1.
_ACQUIRE = """
local owner, ttl, start, count = ARGV[1], ARGV[2], tonumber(ARGV[3]), #KEYS
for i = 0, count - 1 do
  local n = (start + i) % count
  if redis.call('SET', KEYS[n + 1], owner, 'NX', 'PX', ttl) then return n end
end
return -1
"""

# KEYS[1]: the lease key. ARGV: owner, ttl_ms. 1 renewed or re-taken, 0 owned by another.
_RENEW = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class WorkerIdLease:
    """One worker's lease. `worker_id` is -1 until `acquire` succeeds."""

    def __init__(
        self, client: Client, *, prefix: str, owner: str, ttl_s: float = LEASE_TTL_S
    ) -> None:
        self._client = client
        self._limit = op_timeout(client)
        self._prefix = prefix
        self.owner = owner
        self.ttl_ms = int(ttl_s * 1000)
        self.worker_id = -1
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @property
    def renew_every_s(self) -> float:
        return self.ttl_ms / 4000

    def key(self, n: int) -> str:
        return f"{self._prefix}{{wid}}:{n}"

    async def acquire(self) -> int:
        """Take a free id; CacheUnavailable when Redis is unreachable or all are taken."""
        start = random.randrange(MAX_WORKER + 1)
        keys = [self.key(n) for n in range(MAX_WORKER + 1)]
        args: list[str | int] = [self.owner, self.ttl_ms, start]
        async with unavailable("worker id lease", self._limit):
            n = int(await self._acquire(keys=keys, args=args))
        if n < 0:
            raise CacheUnavailable(
                f"redis: all {MAX_WORKER + 1} snowflake worker ids are leased "
                f"(keys {self._prefix}{{wid}}:*); too many live workers share this Redis"
            )
        self.worker_id = n
        return n

    async def renew(self) -> bool:
        """Keep the lease; True when the id changed (it was taken by another worker)."""
        async with unavailable("worker id renewal", self._limit):
            kept = int(
                await self._renew(keys=[self.key(self.worker_id)], args=[self.owner, self.ttl_ms])
            )
        if kept:
            return False
        self.worker_id = -1  # someone else's now: never mint on it again
        await self.acquire()
        return True

    async def close(self) -> None:
        await self._client.aclose()

    async def release(self) -> None:
        if self.worker_id < 0:
            return
        async with unavailable("worker id release", self._limit):
            await self._release(keys=[self.key(self.worker_id)], args=[self.owner])
        self.worker_id = -1
