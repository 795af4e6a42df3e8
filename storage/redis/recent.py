r"""The recent-message cache: the last `RECENT_MAX` messages of each conversation in Redis.

| key | type | value | TTL |
|---|---|---|---|
| `<p>recent:{<conv_id>}` | sorted set | score seq, member msgpack `[seq, msg_id, …]` | 24 h |
| `<p>recentfloor:{<conv_id>}` | string | decimal seq: nothing at or below it is cached | 24 h |

Each member is `[seq, msg_id, sender_uid, msg_type, content, server_ms, client_msg_id]`;
the TTL is pushed back by every write.

The one rule that makes it safe to answer from: **the cached seqs are always one
contiguous run** `lo..top`. Writes go through one Lua script that appends a run of
messages only where it continues the cached one; a run that starts past `top + 1` (a
write before it was lost, or a system message was never cached) replaces the cache, and
a run at or below `top` (a late write from another node) is ignored. So a read that
finds the seqs it asked for found all of them, in order, each exactly as committed.

What the cache cannot know is whether a newer message was committed but never cached
(its write failed); readers check that against MySQL's committed max seq (see
`MySQLRedisStore.read_after`). A recall rewrites a committed message, so before it
commits, `forget_upto(conv, seq)` removes every cached seq up to the recalled one and
raises the conversation's floor to it: a write of the original still on its way (cache
writes run beside the acks, so one can land after the recall's) is refused by the floor
rather than re-caching the recalled content.

A member is at most `content` + ~60 bytes: client content is capped at 2 KB by default
(16 KB by the schema), so no value comes near Redis' limits; the set is trimmed to
`RECENT_MAX` entries. Seqs up to 2**53 are cached (sorted-set scores are doubles).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, cast

import msgpack

from storage.models import StoredMessage
from storage.redis.connect import Client, check_prefix
from storage.redis.errors import op_timeout, unavailable
from storage.redis.scripts import ScriptCall, run_pipelined

RECENT_MAX: Final = 200
RECENT_TTL_MS: Final = 24 * 3600 * 1000
MAX_EXACT_SEQ: Final = 2**53

# KEYS[1] the sorted set, KEYS[2] its floor. ARGV: max entries, ttl ms, then (seq,
# member) pairs in seq order, consecutive. Returns how many were added. Safe to run twice.
_APPEND = """
local key = KEYS[1]
local floor = tonumber(redis.call('GET', KEYS[2]) or '0')
local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local cur = top[2] and tonumber(top[2]) or nil
local added = 0
for i = 3, #ARGV, 2 do
  local s = tonumber(ARGV[i])
  if s <= floor then
    -- recalled (or older than a recall): never cached again
  elseif cur == nil or s == cur + 1 then
    redis.call('ZADD', key, s, ARGV[i + 1])
    cur = s
    added = added + 1
  elseif s > cur + 1 then
    redis.call('DEL', key)
    redis.call('ZADD', key, s, ARGV[i + 1])
    cur = s
    added = added + 1
  end
end
if added > 0 then
  redis.call('ZREMRANGEBYRANK', key, 0, -(tonumber(ARGV[1]) + 1))
  redis.call('PEXPIRE', key, ARGV[2])
end
return added
"""

# KEYS[1] the sorted set, KEYS[2] its floor. ARGV: seq, ttl ms. Safe to run twice.
_FORGET = """
local floor = tonumber(redis.call('GET', KEYS[2]) or '0')
local seq = tonumber(ARGV[1])
if seq > floor then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
return 1
"""


def encode(m: StoredMessage) -> bytes:
    data: bytes = msgpack.packb(
        [m.seq, m.msg_id, m.sender_uid, m.msg_type, m.content, m.server_ms, m.client_msg_id],
        use_bin_type=True,
    )
    return data


def decode(conv_id: int, raw: bytes) -> StoredMessage:
    seq, msg_id, sender, msg_type, content, server_ms, cmid = msgpack.unpackb(raw, raw=False)
    return StoredMessage(conv_id, seq, msg_id, sender, msg_type, content, server_ms, cmid)


class RecentCache:
    """Every method raises `CacheUnavailable` on Redis trouble."""

    def __init__(self, client: Client, *, prefix: str = "", max_entries: int = RECENT_MAX) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._client = client
        self._limit = op_timeout(client)
        self._prefix = check_prefix(prefix)
        self._max = max_entries
        self._append = client.register_script(_APPEND)
        self._forget = client.register_script(_FORGET)

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def limit(self) -> int:
        """How many of a conversation's newest messages are kept."""
        return self._max

    def key(self, conv_id: int) -> str:
        return f"{self._prefix}recent:{{{conv_id}}}"

    def floor_key(self, conv_id: int) -> str:
        return f"{self._prefix}recentfloor:{{{conv_id}}}"

    async def add(self, msgs: Iterable[StoredMessage]) -> int:
        """Cache committed messages: one script call per conversation, all in one round
        trip. Returns how many entries were added."""
        runs: dict[int, list[StoredMessage]] = {}
        for m in msgs:
            if m.seq < MAX_EXACT_SEQ:
                runs.setdefault(m.conv_id, []).append(m)
        calls: list[ScriptCall] = []
        for conv_id, run in runs.items():
            run.sort(key=lambda m: m.seq)
            args: list[int | bytes] = [self._max, RECENT_TTL_MS]
            for m in run:
                args += [m.seq, encode(m)]
            calls.append((self._append, [self.key(conv_id), self.floor_key(conv_id)], args))
        async with unavailable("recent add", self._limit):
            return sum(int(n) for n in await run_pipelined(self._client, calls))

    async def range(self, conv_id: int, lo: int, hi: int) -> list[StoredMessage]:
        """The cached messages with lo <= seq <= hi, in seq order."""
        if hi < lo or lo >= MAX_EXACT_SEQ:
            return []
        async with unavailable("recent range", self._limit):
            found = await self._client.zrange(self.key(conv_id), lo, hi, byscore=True)
        raw = cast(list[bytes], found)  # members only (no scores), not decoded
        return [decode(conv_id, r) for r in raw]

    async def forget_upto(self, conv_id: int, seq: int) -> None:
        """Remove the cached seqs <= `seq` and never cache them again (for 24 h, longer
        than any write can be on its way)."""
        seq = min(max(seq, 0), MAX_EXACT_SEQ)
        call: ScriptCall = (
            self._forget,
            [self.key(conv_id), self.floor_key(conv_id)],
            [seq, RECENT_TTL_MS],
        )
        async with unavailable("recent forget", self._limit):
            await run_pipelined(self._client, [call])
