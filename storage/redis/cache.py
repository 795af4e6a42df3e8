r"""The Redis accelerator of the production store: idempotency records, member lists, max
seq hints, read positions and delivered cursors.

MySQL is the authority; every key here can be lost at any moment and is rebuilt from it.
So every key has a TTL, every write that races with another node is a compare-and-set or
max-merge Lua script (an older value never replaces a newer one), and no value exceeds
10 KB. `{…}` is the hash tag: each operation touches one Redis Cluster slot.

| key | type | value | TTL |
|---|---|---|---|
| `<p>dedup:{<sender>}:<client_msg_id>` | string | msgpack `SentRecord` fields | 25 h |
| `<p>members:{<conv_id>}` | hash | `v` version, `n` chunks, `d0`… msgpack | 10 min |
| `<p>read:{<uid>}` | hash | `<conv_id>` → decimal seq | 7 d, each advance |
| `<p>delivered:{<uid>}:<device>` | hash | `<conv_id>` → decimal seq | 7 d, each advance |

- `dedup` holds msgpack `[conv_id, seq, msg_id, server_ms, msg_type, digest]` (~50 bytes),
  written with SET NX: the first record of a send is the original ack and never replaced.
- `members` holds one `MemberSnapshot` as msgpack `[order, joined_seqs, former]` (current
  members in join order, their joined seqs, then `uid, joined_seq, left_seq` triples of
  former members), cut into chunks of at most 8 KB (`d0`, `d1`…; a 1,000-member group
  with small uids is about 10 KB, with full 64-bit uids about 19 KB, so two or three
  chunks), written only by a newer version.
- `read` and `delivered` only move up (max-merge); their TTL is pushed back on
  every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, cast

import msgpack

from storage.errors import CacheUnavailable
from storage.models import SentRecord
from storage.redis.connect import Client, check_prefix
from storage.redis.errors import op_timeout, unavailable
from storage.redis.scripts import LUA_GT

DEDUP_TTL_S: Final = 25 * 3600
MEMBERS_TTL_S: Final = 600  # bounds a stale snapshot if Redis failed mid-refresh
CURSOR_TTL_S: Final = 7 * 24 * 3600
MEMBER_CHUNK_BYTES: Final = 8 * 1024

# KEYS[1] members hash. ARGV: version, ttl_s, chunk, chunk, … Returns 1 if written.
_PUT_MEMBERS = (
    LUA_GT
    + """
local cur = redis.call('HGET', KEYS[1], 'v')
if cur and not gt(ARGV[1], cur) then return 0 end
redis.call('DEL', KEYS[1])
local fields = {'v', ARGV[1], 'n', tostring(#ARGV - 2)}
for i = 3, #ARGV do
  fields[#fields + 1] = 'd' .. (i - 3)
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

# KEYS[1] string. ARGV: seq, ttl_s. Returns 1 if raised.
# KEYS[1] hash. ARGV: field, seq, ttl_s. Returns the new seq, or nil if it did not move.
_ADVANCE = (
    LUA_GT
    + """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local moved = cur == false or gt(ARGV[2], cur)
if moved then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
if moved then return ARGV[2] end
return false
"""
)


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    """A conversation's member rows at one membership version."""

    conv_id: int
    version: int
    rows: dict[int, tuple[int, int | None]]  # uid -> (joined_seq, left_seq or None)
    order: list[int]  # current members (left_seq None) in join order


def encode_members(snapshot: MemberSnapshot) -> bytes:
    """msgpack `[order, joined_seqs, former]`; raises ValueError if `order` is not exactly
    the current members of `rows`."""
    joined: list[int] = []
    for uid in snapshot.order:
        row = snapshot.rows.get(uid)
        if row is None or row[1] is not None:
            raise ValueError(f"uid {uid} in order is not a current member")
        joined.append(row[0])
    former: list[int] = []
    current = 0
    for uid, (joined_seq, left_seq) in snapshot.rows.items():
        if left_seq is None:
            current += 1
        else:
            former += (uid, joined_seq, left_seq)
    if current != len(snapshot.order) or len(set(snapshot.order)) != current:
        raise ValueError("order must list each current member once")
    return msgpack.packb([snapshot.order, joined, former])  # type: ignore[no-any-return]


def decode_members(conv_id: int, version: int, data: bytes) -> MemberSnapshot:
    order, joined, former = msgpack.unpackb(data)
    rows: dict[int, tuple[int, int | None]] = {
        uid: (seq, None) for uid, seq in zip(order, joined, strict=True)
    }
    for i in range(0, len(former), 3):
        rows[former[i]] = (former[i + 1], former[i + 2])
    return MemberSnapshot(conv_id, version, rows, list(order))


def _int(raw: bytes | str | None) -> int | None:
    return None if raw is None else int(raw)


def _seq(value: int) -> int:
    if value < 0:
        raise ValueError(f"negative seq or version {value}")
    return int(value)


class RedisCache:
    """The accelerator (see the module docstring for the keys). Every method raises
    `CacheUnavailable` on Redis trouble, except `ping`, which answers False."""

    def __init__(self, client: Client, *, prefix: str = ""):
        self._client = client
        self._limit = op_timeout(client)
        self._prefix = check_prefix(prefix)
        self._put_members = client.register_script(_PUT_MEMBERS)
        self._advance = client.register_script(_ADVANCE)

    # -- keys -----------------------------------------------------------------------------

    def dedup_key(self, sender_uid: int, client_msg_id: str) -> str:
        return f"{self._prefix}dedup:{{{sender_uid}}}:{client_msg_id}"

    def members_key(self, conv_id: int) -> str:
        return f"{self._prefix}members:{{{conv_id}}}"

    def read_key(self, uid: int) -> str:
        return f"{self._prefix}read:{{{uid}}}"

    def delivered_key(self, uid: int, device: str) -> str:
        return f"{self._prefix}delivered:{{{uid}}}:{device}"

    # -- idempotency ----------------------------------------------------------------------

    async def get_sent(self, sender_uid: int, client_msg_id: str) -> SentRecord | None:
        async with unavailable("dedup get", self._limit):
            raw = await self._client.get(self.dedup_key(sender_uid, client_msg_id))
        if raw is None:
            return None
        conv_id, seq, msg_id, server_ms, msg_type, digest = msgpack.unpackb(raw)
        return SentRecord(
            sender_uid, client_msg_id, conv_id, seq, msg_id, server_ms, msg_type, digest
        )

    async def put_sent(self, records: Sequence[SentRecord]) -> None:
        """Store idempotency records (one pipeline). An existing record is kept: it is the
        original ack."""
        if not records:
            return
        async with (
            unavailable("dedup put", self._limit),
            self._client.pipeline(transaction=False) as pipe,
        ):
            for r in records:
                value = msgpack.packb(
                    [r.conv_id, r.seq, r.msg_id, r.server_ms, r.msg_type, r.digest]
                )
                key = self.dedup_key(r.sender_uid, r.client_msg_id)
                pipe.set(key, value, ex=DEDUP_TTL_S, nx=True)
            await pipe.execute()

    # -- members --------------------------------------------------------------------------

    async def get_members(self, conv_id: int) -> MemberSnapshot | None:
        async with unavailable("members get", self._limit):
            # bytes: connect.py opens every client with decode_responses=False
            fields = cast(dict[bytes, bytes], await self._client.hgetall(self.members_key(conv_id)))
        try:
            version = int(fields[b"v"])
            data = b"".join(fields[b"d%d" % i] for i in range(int(fields[b"n"])))
        except KeyError:
            return None  # absent (or not written by this code): a miss
        return decode_members(conv_id, version, data)

    async def put_members(self, snapshot: MemberSnapshot) -> bool:
        """Cache `snapshot` unless the cached version is the same or newer, so a node that
        read an older snapshot can never replace a newer one. Returns whether it wrote."""
        data = encode_members(snapshot)
        chunks = [
            data[i : i + MEMBER_CHUNK_BYTES] for i in range(0, len(data), MEMBER_CHUNK_BYTES)
        ] or [b""]
        args: list[int | bytes] = [_seq(snapshot.version), MEMBERS_TTL_S, *chunks]
        async with unavailable("members put", self._limit):
            written = await self._put_members(keys=[self.members_key(snapshot.conv_id)], args=args)
        return bool(written)

    async def drop_members(self, conv_id: int) -> None:
        async with unavailable("members drop", self._limit):
            await self._client.delete(self.members_key(conv_id))

    # -- positions ----------------------------------------------------------------------

    async def advance_read(self, conv_id: int, uid: int, seq: int) -> int | None:
        """Move the member's read position up to `seq`; the new position, or None if it
        was already there or beyond."""
        return await self._advance_field(self.read_key(uid), conv_id, seq, "read advance")

    async def get_reads(self, uid: int, conv_ids: Iterable[int]) -> dict[int, int]:
        return await self._get_fields(self.read_key(uid), conv_ids, "read get")

    async def advance_delivered(self, conv_id: int, uid: int, device: str, seq: int) -> int | None:
        """As advance_read, for this device's delivered cursor."""
        key = self.delivered_key(uid, device)
        return await self._advance_field(key, conv_id, seq, "delivered advance")

    async def get_delivered(self, uid: int, device: str, conv_ids: Iterable[int]) -> dict[int, int]:
        return await self._get_fields(self.delivered_key(uid, device), conv_ids, "delivered get")

    async def _advance_field(self, key: str, conv_id: int, seq: int, what: str) -> int | None:
        async with unavailable(what, self._limit):
            moved = await self._advance(keys=[key], args=[conv_id, _seq(seq), CURSOR_TTL_S])
        return _int(moved)

    async def _get_fields(self, key: str, conv_ids: Iterable[int], what: str) -> dict[int, int]:
        wanted = list(dict.fromkeys(conv_ids))
        if not wanted:
            return {}
        async with unavailable(what, self._limit):
            values = cast(list[bytes | None], await self._client.hmget(key, wanted))
        return {c: int(v) for c, v in zip(wanted, values, strict=True) if v is not None}

    # -- health ---------------------------------------------------------------------------

    async def ping(self) -> bool:
        """Whether Redis answers (for readiness checks); never raises for Redis trouble."""
        try:
            async with unavailable("ping", self._limit):
                return bool(await self._client.ping())
        except CacheUnavailable:
            return False

    async def close(self) -> None:
        """Close the client's pool (the route store may share it: closing twice is fine)."""
        await self._client.aclose()
