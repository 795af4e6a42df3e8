"""Token revocations kept by the authoritative store, with the route store as their cache.

A revocation refuses, until it expires, every token of a uid (or of one device) minted at
or before its time, and every v1 token of it (whose minting time is unknown). The route
store checks revocations in the same step that installs a route (on Redis, inside the
register script), so a LOGIN racing a revocation on another node is either refused or
installed in time to be kicked. But the route store may lose everything at any moment
(a FLUSHDB, a Redis restart without persistence, a failover to an empty replica, the
restart of an embedded gateway): a revocation kept there alone would be forgotten, and
the revoked token let in again.

So a revocation is first written to the authoritative store's `RevocationLog`
(`im_revocation`: SQLite in storage/embedded/revocations.py, MySQL's metadata database in
storage/mysql/revocations.py), then to the route store. `DurableRevocations`, in front of
the route store, also keeps a copy of every live revocation in the node's memory,
loaded from the log before the first LOGIN and brought up to date from it every route
check (`mark`, once a second): rows changed since the previous read, less an overlap
for rows committed late. A LOGIN is refused when either the copy or the route store
covers its token; it checks the copy in memory, so it costs no store round trip, even
in a reconnect storm.

What a loss of the route store leaves open: a revocation made on another node less than
a route check before the route store lost it, and not yet read from the log by this
node, lets a LOGIN on this node through for that moment (its sessions were kicked when
it was made). A log that cannot be read leaves the copy as it was; before the copy was
first loaded, a LOGIN is answered `unavailable` rather than let in unchecked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import structlog

from storage.errors import Revoked, StoreUnavailable
from storage.models import Route
from storage.ports import RouteStore

ALL_DEVICES: Final = "*"  # the device of a revocation of every device of the uid
# A row stamped this long before the previous read ended but committed after it is still
# read by the next one (one statement commits in far less; as SYNC's overlap).
SYNC_OVERLAP_MS: Final = 10_000
PRUNE_EVERY_S: Final = 600.0  # expired revocations leave the copy and the log
SYNC_LOG_EVERY_S: Final = 60.0  # a failing sync is logged at most this often

log = structlog.get_logger("imgw.store")


@dataclass(frozen=True, slots=True)
class Revocation:
    """Tokens of `uid` on `device` (ALL_DEVICES: every device) minted at or before
    `revoked_s` are refused until `expires_s` (Unix seconds)."""

    uid: int
    device: str
    revoked_s: int
    expires_s: int


def covers(revoked_s: int, iat: int | None) -> bool:
    """Whether a revocation made at `revoked_s` refuses a token minted at `iat` (None:
    a v1 token, whose minting time is unknown: always)."""
    return iat is None or iat <= revoked_s


class RevocationLog(Protocol):
    """Revocations in the authoritative store (`im_revocation`, one row per uid and
    device: a later revocation raises its times, never lowers them)."""

    # Whether other processes write it too (MySQL), so that it must be read again for
    # what they wrote; the embedded store's is written by its own gateway alone.
    shared: bool

    async def record(self, revocation: Revocation) -> None:
        """Write it durably (merged into the row of its uid and device)."""
        ...

    async def changed_since(self, since_ms: int | None) -> tuple[list[Revocation], int]:
        """The revocations written at or after `since_ms` of the log's clock (None: every
        one not expired), and the log's clock (ms) when they were read."""
        ...

    async def prune(self, now_s: int) -> int:
        """Delete (some of) the revocations expired by `now_s`; how many."""
        ...

    async def close(self) -> None: ...


class RevocationCopy:
    """The live revocations, by uid, in memory: uid -> device (or ALL_DEVICES) ->
    (revoked_s, expires_s)."""

    __slots__ = ("_by_uid",)

    def __init__(self) -> None:
        self._by_uid: dict[int, dict[str, tuple[int, int]]] = {}

    def __len__(self) -> int:
        return sum(len(held) for held in self._by_uid.values())

    def add(self, r: Revocation) -> None:
        held = self._by_uid.setdefault(r.uid, {})
        at, until = held.get(r.device, (r.revoked_s, r.expires_s))
        held[r.device] = (max(at, r.revoked_s), max(until, r.expires_s))

    def covering(self, uid: int, device: str, iat: int | None, now_s: float) -> int | None:
        """The time of the latest unexpired revocation that covers a token of `uid` on
        `device` minted at `iat`; None if none does."""
        held = self._by_uid.get(uid)
        if held is None:  # nearly every LOGIN: one dict lookup
            return None
        found: int | None = None
        for key in (ALL_DEVICES, device):
            entry = held.get(key)
            if entry is not None and entry[1] >= now_s and covers(entry[0], iat):
                found = entry[0] if found is None else max(found, entry[0])
        return found

    def prune(self, now_s: float) -> None:
        """Forget the revocations expired by `now_s`."""
        for uid in list(self._by_uid):
            held = self._by_uid[uid]
            for device in [d for d, (_, until) in held.items() if until < now_s]:
                del held[device]
            if not held:
                del self._by_uid[uid]


class DurableRevocations:
    """A `RouteStore`: `routes`, with every revocation also written to `revocations`
    (the authoritative store's log) first and kept in the node's memory (see the module
    docstring). Every other call goes to `routes` unchanged."""

    def __init__(
        self,
        routes: RouteStore,
        revocations: RevocationLog,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.routes = routes
        self.log = revocations
        self.copy = RevocationCopy()
        self._clock = clock
        self._monotonic = monotonic
        self._since_ms: int | None = None  # where the next read starts; None: not loaded
        self._syncing: asyncio.Task[None] | None = None
        self._pruned_at = monotonic()
        self._logged_at = -SYNC_LOG_EVERY_S
        self.sync_failures = 0

    @property
    def loaded(self) -> bool:
        """Whether the copy was loaded from the log (LOGINs are refused until then)."""
        return self._since_ms is not None

    # -- keeping the copy -----------------------------------------------------------------

    async def sync(self) -> None:
        """Bring the copy up to date from the log (the first time: load every live
        revocation). One read at a time: a caller arriving during one waits for it.
        Raises StoreUnavailable when the log cannot be read."""
        await asyncio.shield(self.sync_soon())

    async def _sync(self) -> None:
        rows, now_ms = await self.log.changed_since(self._since_ms)
        for r in rows:
            self.copy.add(r)
        self._since_ms = now_ms - SYNC_OVERLAP_MS
        if self._monotonic() - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = self._monotonic()
            now_s = int(self._clock())
            self.copy.prune(now_s)
            await self.log.prune(now_s)

    def _synced(self, task: asyncio.Task[None]) -> None:
        self._syncing = None
        if task.cancelled() or (e := task.exception()) is None:
            return
        self.sync_failures += 1
        now = self._monotonic()
        if now - self._logged_at >= SYNC_LOG_EVERY_S:
            self._logged_at = now
            log.warning(
                "revocations not read from the store; the node's copy is kept as it was"
                if self.loaded
                else "revocations not loaded from the store; LOGINs answer unavailable",
                error=repr(e),
                failures=self.sync_failures,
            )

    # -- RouteStore -----------------------------------------------------------------------

    async def register(self, route: Route, *, iat: int | None = None) -> Route | None:
        """As `routes.register`, refused (`Revoked`) also when the copy covers the token;
        the first LOGINs wait for the copy to be loaded."""
        if self._since_ms is None:
            try:
                await self.sync()
            except StoreUnavailable as e:
                raise StoreUnavailable(f"revocations not loaded yet: {e}") from e
        revoked = self.copy.covering(route.uid, route.device, iat, self._clock())
        if revoked is not None:
            raise Revoked(f"tokens of {route.uid}/{route.device} revoked at {revoked}")
        return await self.routes.register(route, iat=iat)

    async def revoke(self, uid: int, device: str | None, at_s: int, keep_s: int) -> None:
        """Write the revocation to the log (raises StoreUnavailable, having done
        nothing else, if it cannot), then to the copy and the route store."""
        r = Revocation(uid, ALL_DEVICES if device is None else device, at_s, at_s + keep_s)
        await self.log.record(r)
        self.copy.add(r)
        await self.routes.revoke(uid, device, at_s, keep_s)

    async def mark(self, node: str) -> bool:
        """As `routes.mark`; and (in the background) read what changed in the log since
        the last read, when other processes write it, or nothing was loaded yet."""
        lost = await self.routes.mark(node)
        if self.log.shared or self._since_ms is None:
            self.sync_soon()
        return lost

    def sync_soon(self) -> asyncio.Task[None]:
        """The sync running, or a new one (a failure is logged, and raised only to those
        awaiting it)."""
        task = self._syncing
        if task is None:
            task = self._syncing = asyncio.get_running_loop().create_task(self._sync())
            task.add_done_callback(self._synced)
        return task

    async def renew(self, routes: Sequence[Route]) -> None:
        await self.routes.renew(routes)

    async def remove(self, route: Route) -> bool:
        return await self.routes.remove(route)

    async def get(self, uid: int, device: str) -> Route | None:
        return await self.routes.get(uid, device)

    async def ttl(self, uid: int, device: str) -> float | None:
        return await self.routes.ttl(uid, device)

    async def online(self, uids: Sequence[int]) -> dict[int, list[Route]]:
        return await self.routes.online(uids)

    async def close(self) -> None:
        if (task := self._syncing) is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.routes.close()
        await self.log.close()
