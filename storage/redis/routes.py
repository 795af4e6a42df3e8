r"""RouteStore on Redis: where each online (uid, device) is connected, shared by all nodes.

Keys (`<p>` is the configured prefix; `{uid}` is a hash tag, so all keys of one uid live
in one Redis Cluster slot and each script touches a single slot):

| key | type | value | TTL |
|---|---|---|---|
| `<p>route:{<uid>}:<device>` | string | `<node>\|<conn_id>\|<epoch>` | `ttl_s` (90 s) |
| `<p>online:{<uid>}` | hash | `<device>` → `<node>\|<conn_id>\|<epoch>\|<expires_ms>` | `ttl_s` |
| `<p>marker:{<node>}` | string | `1` | `ttl_s` |
| `<p>revoked:{<uid>}` | hash | `<device>` or `*` → revoked at (Unix s) | token lifetime |

Both TTLs are pushed back to `ttl_s` by every register and renewal.

The route key is the authority for one device; `online:{uid}` is the per-uid index that
lets fan-out find every device of many uids in one round trip (one pipelined HGETALL per
uid). A field carries its own expiry (wall-clock ms of the writing node) because Redis
cannot expire hash fields one by one in Redis 7: readers drop fields past it, and every
register and renewal prunes them. Values are a few dozen bytes.

Every write is a Lua script (registered once per store), so each operation on a route is
atomic:

- `register` sets the route key and the index field and returns the previous live route.
- `renew` is a compare-and-set: a route whose key holds this connection's value has its
  TTL pushed back; a key holding any other value (a newer login) is left alone.
- `remove` deletes the key and the index field only while they hold this connection's
  value.

Renewal after loss: when the key is *absent* — it expired while the node could not reach
Redis, or Redis lost its data (restart without persistence, failover to an empty
replica) — the renewal re-creates it (SET NX semantics: the absence is checked and the key
set inside one script). Live connections thus reappear in routes at their next renewal
and fan-out finds them again, with no re-login. A key holding a *different* value is
never overwritten, and neither is an absent key whose index field still names another
route with a newer epoch that has not expired: a stale connection never displaces a
newer login. (After a newer login logged out, a stale connection that has not yet been
kicked may re-create its own route; it is still connected, so pushes to it are not lost.)

Noticing the loss sooner: every node keeps a marker key beside its routes, set with the
routes' TTL and checked every second (`mark`: one `SET … GET`, so the cost does not grow
with the number of connections). A marker found missing means whatever erased it (a
flush, a restart or failover without the data, an outage longer than the TTL) erased the
routes too; the node then renews all of its routes at once instead of waiting for each
connection's next renewal, and tells its sessions to SYNC (see `gateway.routewatch`).

On Redis Cluster a master that loses its data (restarted empty, replaced by an empty
node) loses only the keys of its own slots, and one marker would live on one master
only. So a node keeps **one marker per master**: `<p>marker:{<n>}:<node>`, where `<n>` is
the smallest integer whose slot that master serves now (found from the client's slot
map each check; a few CRC16s). Every check sets them all (one pipeline per master), and
any marker that was set at the previous check and is missing now means a loss. A marker
key that is new because the slots moved (a reshard, a master added) is not a loss: only
keys this store has set before count, and those stay where their slot goes.

| key | type | value | TTL |
|---|---|---|---|
| `<p>marker:{<n>}:<node>` (cluster) | string | `1` | `ttl_s` |
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

from redis.asyncio.cluster import RedisCluster

from storage.errors import Revoked
from storage.models import Route
from storage.redis import raw
from storage.redis.connect import Client, check_prefix
from storage.redis.errors import op_timeout, unavailable
from storage.redis.scripts import LUA_GT, Coalescer, ScriptCall, run_pipelined

ROUTE_TTL_S: Final = 90
# Index fields parsed by `online`, remembered by their exact bytes (a field changes only
# when its route is registered or renewed, every 30 s, while fan-out reads it with every
# message): at most this many, then forgotten all at once.
PARSED_MAX: Final = 65_536
MARKER_SEARCH: Final = 1 << 20  # tags tried for a master's marker before giving up

# Index helpers shared by register and renew. KEYS[2] is the uid's online hash.
_LUA_INDEX = """
local function index_put(device, entry, ttl_ms, now_ms)
  redis.call('HSET', KEYS[2], device, entry)
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    local exp = tonumber(string.match(all[i + 1], '|(%d+)$'))
    if exp == nil or exp < now_ms then redis.call('HDEL', KEYS[2], all[i]) end
  end
  redis.call('PEXPIRE', KEYS[2], ttl_ms)
end
"""

# KEYS: route, online, revoked. ARGV: value, device, entry, ttl_ms, now_ms, iat (-1: v1).
# Returns the previous value, or nil if none (or if it was this very route: a retry), or
# {revoked_at} without touching anything when a revocation covers the token.
_REGISTER = (
    _LUA_INDEX
    + """
local revs = redis.call('HMGET', KEYS[3], ARGV[2], '*')
local rev = math.max(tonumber(revs[1] or '-1'), tonumber(revs[2] or '-1'))
local iat = tonumber(ARGV[6])
if rev >= 0 and (iat < 0 or iat <= rev) then return {tostring(rev)} end
local prev = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
index_put(ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]))
if prev == ARGV[1] then return false end
return prev
"""
)

# KEYS: route, online. ARGV: value, device, entry, ttl_ms, now_ms, epoch.
# Returns 1 renewed, 2 re-created (the key was absent), 0 refused (another route owns it).
_RENEW = (
    LUA_GT
    + _LUA_INDEX
    + """
local now_ms = tonumber(ARGV[5])
local cur = redis.call('GET', KEYS[1])
local status = 1
if cur == false then
  local held = redis.call('HGET', KEYS[2], ARGV[2])
  if held and string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
    local epoch, exp = string.match(held, '|(%d+)|(%d+)$')
    if epoch and tonumber(exp) >= now_ms and gt(epoch, ARGV[6]) then return 0 end
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
  status = 2
elseif cur ~= ARGV[1] then
  return 0
else
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
index_put(ARGV[2], ARGV[3], ARGV[4], now_ms)
return status
"""
)

# KEYS: route, online. ARGV: value, device. Returns 1 if anything of this route was deleted.
_REMOVE = """
local removed = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  removed = 1
end
local held = redis.call('HGET', KEYS[2], ARGV[2])
if held and string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  redis.call('HDEL', KEYS[2], ARGV[2])
  removed = 1
end
return removed
"""

# KEYS: the revoked hash. ARGV: field, at_s, keep_ms.
_REVOKE = """
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
redis.call('HSET', KEYS[1], ARGV[1], tostring(math.max(cur, tonumber(ARGV[2]))))
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
"""

_RENEWED, _RECREATED = 1, 2


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def route_value(route: Route) -> str:
    return f"{route.node}|{route.conn_id}|{route.epoch}"


def parse_route(uid: int, device: str, raw: bytes | str) -> Route:
    """`<node>|<conn_id>|<epoch>` (split from the right: the node id may hold a `|`)."""
    node, conn_id, epoch = _text(raw).rsplit("|", 2)
    return Route(uid, device, node, int(conn_id), int(epoch))


def parse_entry(uid: int, device: str, raw: bytes | str) -> tuple[Route, int]:
    """An index field: the route and its expiry in wall-clock ms."""
    value, _, expires_ms = _text(raw).rpartition("|")
    return parse_route(uid, device, value), int(expires_ms)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class RedisRouteStore:
    """`storage.ports.RouteStore` on Redis (see the module docstring for the keys).

    Errors reaching Redis raise `CacheUnavailable`. `close()` closes `client`'s pool."""

    def __init__(self, client: Client, *, prefix: str = "", ttl_s: int = ROUTE_TTL_S):
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self._client = client
        self._limit = op_timeout(client)
        self._prefix = check_prefix(prefix)
        self._ttl_ms = ttl_s * 1000
        self._parsed: dict[tuple[int, bytes | str, bytes | str], tuple[Route, int]] = {}
        self._register = client.register_script(_REGISTER)
        self._renew = client.register_script(_RENEW)
        self._remove = client.register_script(_REMOVE)
        self._revoke = client.register_script(_REVOKE)
        self._renewed = 0
        self._recreated = 0
        self._refused = 0
        # Logins and disconnects come in storms: their script calls are coalesced.
        self._coalesced = Coalescer(client, "route register/remove", self._limit)
        # Redis Cluster: per node id, the marker keys set by the last good check, and
        # the nodes whose marker a failed check found missing (reported by the next)
        self._marked: dict[str, set[str]] = {}
        self._loss_seen: set[str] = set()

    # -- keys -----------------------------------------------------------------------------

    def route_key(self, uid: int, device: str) -> str:
        return f"{self._prefix}route:{{{uid}}}:{device}"

    def online_key(self, uid: int) -> str:
        return f"{self._prefix}online:{{{uid}}}"

    def revoked_key(self, uid: int) -> str:
        return f"{self._prefix}revoked:{{{uid}}}"

    def marker_key(self, node: str) -> str:
        return f"{self._prefix}marker:{{{node}}}"

    def cluster_marker_key(self, node: str, tag: int) -> str:
        return f"{self._prefix}marker:{{{tag}}}:{node}"

    def _keys(self, route: Route) -> list[str]:
        return [self.route_key(route.uid, route.device), self.online_key(route.uid)]

    # -- RouteStore -----------------------------------------------------------------------

    async def register(self, route: Route, *, iat: int | None = None) -> Route | None:
        """Install `route`, replacing and returning the previous live route of the device,
        unless a revocation covers the token (`Revoked`: checked in the same script). The
        registrations and removals of one loop iteration share one pipeline."""
        now = _now_ms()
        value = route_value(route)
        args: list[str | int] = [
            value,
            route.device,
            f"{value}|{now + self._ttl_ms}",
            self._ttl_ms,
            now,
            -1 if iat is None else iat,
        ]
        keys = [*self._keys(route), self.revoked_key(route.uid)]
        prev = await self._coalesced.call((self._register, keys, args))
        if isinstance(prev, list):
            raise Revoked(f"tokens of {route.uid}/{route.device} revoked at {_text(prev[0])}")
        return None if prev is None else parse_route(route.uid, route.device, prev)

    async def renew(self, routes: Sequence[Route]) -> None:
        """Push back the TTL of each route still owned by its connection, or re-create it
        if its key is absent (see "Renewal after loss" above): one pipeline, one script
        call per route."""
        if not routes:
            return
        now = _now_ms()
        expires = now + self._ttl_ms
        calls: list[ScriptCall] = []
        for route in dict.fromkeys(routes):  # a connection may be queued twice in a tick
            value = route_value(route)
            entry = f"{value}|{expires}"
            args: list[str | int] = [value, route.device, entry, self._ttl_ms, now, route.epoch]
            calls.append((self._renew, self._keys(route), args))
        async with unavailable("route renew", self._limit):
            results = await run_pipelined(self._client, calls)
        for status in results:
            if status == _RENEWED:
                self._renewed += 1
            elif status == _RECREATED:
                self._recreated += 1
            else:
                self._refused += 1

    async def remove(self, route: Route) -> bool:
        """Delete the route if it is still this connection's."""
        call: ScriptCall = (self._remove, self._keys(route), [route_value(route), route.device])
        return bool(await self._coalesced.call(call))

    async def get(self, uid: int, device: str) -> Route | None:
        async with unavailable("route get", self._limit):
            raw = await self._client.get(self.route_key(uid, device))
        return None if raw is None else parse_route(uid, device, raw)

    async def ttl(self, uid: int, device: str) -> float | None:
        """Seconds until the route expires, None if there is none."""
        async with unavailable("route ttl", self._limit):
            ms = await self._client.pttl(self.route_key(uid, device))
        return None if ms is None or ms < 0 else ms / 1000

    async def online(self, uids: Sequence[int]) -> dict[int, list[Route]]:
        """Online routes of each uid (uids with none are omitted): one pipelined HGETALL
        per uid, one round trip (packed by `raw`: this runs for every fan-out); index
        fields past their expiry are ignored. A field seen before is not parsed again."""
        wanted = list(dict.fromkeys(uids))
        if not wanted:
            return {}
        async with unavailable("route online", self._limit):
            client = self._client
            if isinstance(client, RedisCluster):
                replies = await raw.cluster_pipeline(
                    client, [(b"HGETALL", self.online_key(uid)) for uid in wanted]
                )
            else:  # the hot path: packed once, one write
                replies = await raw.pipeline(
                    client, [raw.pack(b"HGETALL", self.online_key(uid)) for uid in wanted]
                )
            for r in replies:
                if isinstance(r, Exception):
                    raise r
        now = _now_ms()
        out: dict[int, list[Route]] = {}
        parsed = self._parsed
        for uid, fields in zip(wanted, replies, strict=True):
            live: list[Route] = []
            for device, entry in raw.field_pairs(fields):
                if (known := parsed.get((uid, device, entry))) is None:
                    if len(parsed) >= PARSED_MAX:
                        parsed.clear()
                    known = parsed[uid, device, entry] = parse_entry(uid, _text(device), entry)
                route, expires_ms = known
                if expires_ms >= now:
                    live.append(route)
            if live:
                out[uid] = live
        return out

    async def revoke(self, uid: int, device: str | None, at_s: int, keep_s: int) -> None:
        args: list[str | int] = ["*" if device is None else device, at_s, keep_s * 1000]
        async with unavailable("revoke", self._limit):
            await self._revoke(keys=[self.revoked_key(uid)], args=args)

    async def mark(self, node: str) -> bool:
        """Set the node's marker (TTL: the routes' TTL) and say whether it was missing; on
        Redis Cluster one per master, and whether one set before is missing."""
        client = self._client
        if isinstance(client, RedisCluster):
            return await self._mark_cluster(client, node)
        async with unavailable("route marker", self._limit):
            prev = await client.set(self.marker_key(node), b"1", px=self._ttl_ms, get=True)
        return prev is None

    async def _mark_cluster(self, client: RedisCluster, node: str) -> bool:
        before = self._marked.get(node, set())
        async with unavailable("route marker", self._limit):
            await client.initialize()  # at once when the client knows the slots already
            keys = self.marker_keys(client, node)
            replies = await raw.cluster_pipeline(
                client, [(b"SET", k, b"1", b"PX", self._ttl_ms, b"GET") for k in keys]
            )
            done = [
                (k, r) for k, r in zip(keys, replies, strict=True) if not isinstance(r, Exception)
            ]
            # A marker found missing counts even if another master failed this check:
            # this check set it again, so the next one would find it and miss the loss
            # (a master replaced by an empty node answers while the others still say
            # CLUSTERDOWN).
            if any(r is None and k in before for k, r in done):
                self._loss_seen.add(node)
            self._marked[node] = before | {k for k, _ in done}
            for r in replies:
                if isinstance(r, Exception):
                    raise r
        self._marked[node] = set(keys)
        if node in self._loss_seen:
            self._loss_seen.discard(node)
            return True
        return False

    def marker_keys(self, client: RedisCluster, node: str) -> list[str]:
        """One marker key per master of the client's current slot map: the key of the
        smallest tag whose slot the master serves."""
        # the masters that serve a slot now (a master left without slots keeps its
        # place in the client's node list, and no tag would ever find it)
        slots = client.nodes_manager.slots_cache.values()
        wanted = {nodes[0].name for nodes in slots if nodes}
        keys: list[str] = []
        for tag in range(MARKER_SEARCH):
            if not wanted:
                break
            key = self.cluster_marker_key(node, tag)
            owner = client.get_node_from_key(key)
            if owner is not None and owner.name in wanted:
                wanted.discard(owner.name)
                keys.append(key)
        return keys

    async def close(self) -> None:
        await self._client.aclose()

    def statistics(self) -> dict[str, int]:
        """Renewal outcomes since start: renewed, re-created after loss, refused (the
        device belongs to another connection now)."""
        return {"renewed": self._renewed, "recreated": self._recreated, "refused": self._refused}
