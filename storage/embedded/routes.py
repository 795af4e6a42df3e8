"""In-process RouteStore for the embedded deployment: the same compare-and-set rules as
the Redis adapter, with expiry checked on read.

Memory matters here (one entry per logged-in device, a million on a big node): a user
with one device costs one dict slot and one (route, expires) tuple; only users with
several devices get a dict of their own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from storage.errors import Revoked
from storage.models import Route

ROUTE_TTL_S = 90.0

_Entry = tuple[Route, float]  # (route, expires at)


class MemoryRouteStore:
    def __init__(self, *, ttl_s: float = ROUTE_TTL_S, clock: Callable[[], float] = time.monotonic):
        self._ttl = ttl_s
        self._clock = clock
        # uid -> the entry of its only device, or device -> entry when it has several
        self._by_uid: dict[int, _Entry | dict[str, _Entry]] = {}
        self._marked: set[str] = set()  # nodes that called mark()
        self._revoked: dict[int, dict[str, int]] = {}  # uid -> device or "*" -> revoked at
        self._revoked_until: dict[int, float] = {}  # uid -> wall-clock end of its record

    def _entries(self, uid: int) -> Iterator[_Entry]:
        slot = self._by_uid.get(uid)
        if slot is None:
            return
        if isinstance(slot, dict):
            yield from slot.values()
        else:
            yield slot

    def _entry(self, uid: int, device: str) -> _Entry | None:
        slot = self._by_uid.get(uid)
        if slot is None:
            return None
        if isinstance(slot, dict):
            return slot.get(device)
        return slot if slot[0].device == device else None

    def _put(self, route: Route, expires: float) -> None:
        slot = self._by_uid.get(route.uid)
        entry = (route, expires)
        if slot is None or (not isinstance(slot, dict) and slot[0].device == route.device):
            self._by_uid[route.uid] = entry
        elif isinstance(slot, dict):
            slot[route.device] = entry
        else:
            self._by_uid[route.uid] = {slot[0].device: slot, route.device: entry}

    def _delete(self, uid: int, device: str) -> None:
        slot = self._by_uid.get(uid)
        if isinstance(slot, dict):
            slot.pop(device, None)
            if len(slot) == 1:
                self._by_uid[uid] = next(iter(slot.values()))
            elif not slot:
                del self._by_uid[uid]
        elif slot is not None and slot[0].device == device:
            del self._by_uid[uid]

    async def register(self, route: Route, *, iat: int | None = None) -> Route | None:
        revoked = self._revoked_at(route.uid, route.device)
        if revoked is not None and (iat is None or iat <= revoked):
            raise Revoked(f"tokens of {route.uid}/{route.device} revoked at {revoked}")
        prev = self._entry(route.uid, route.device)
        now = self._clock()
        self._put(route, now + self._ttl)
        if prev is None or prev[1] < now or prev[0] == route:
            return None
        return prev[0]

    async def renew(self, routes: Sequence[Route]) -> None:
        expires = self._clock() + self._ttl
        for route in routes:
            cur = self._entry(route.uid, route.device)
            if cur is None or cur[1] < self._clock():
                # Absent or expired: re-create it, as the Redis store does after a loss.
                self._put(route, expires)
            elif cur[0] == route:
                self._put(route, expires)

    async def remove(self, route: Route) -> bool:
        cur = self._entry(route.uid, route.device)
        if cur is None or cur[0] != route:
            return False
        self._delete(route.uid, route.device)
        return True

    async def get(self, uid: int, device: str) -> Route | None:
        cur = self._entry(uid, device)
        if cur is None or cur[1] < self._clock():
            return None
        return cur[0]

    async def ttl(self, uid: int, device: str) -> float | None:
        cur = self._entry(uid, device)
        now = self._clock()
        if cur is None or cur[1] < now:
            return None
        return cur[1] - now

    async def online(self, uids: Sequence[int]) -> dict[int, list[Route]]:
        now = self._clock()
        out: dict[int, list[Route]] = {}
        for uid in uids:
            live = [r for r, exp in self._entries(uid) if exp >= now]
            if live:
                out[uid] = live
        return out

    async def revoke(self, uid: int, device: str | None, at_s: int, keep_s: int) -> None:
        held = self._revoked.setdefault(uid, {})
        key = "*" if device is None else device
        held[key] = max(held.get(key, 0), at_s)
        self._revoked_until[uid] = time.time() + keep_s

    def _revoked_at(self, uid: int, device: str) -> int | None:
        held = self._revoked.get(uid)
        if held is None:
            return None
        if self._revoked_until.get(uid, 0) < time.time():
            del self._revoked[uid]
            return None
        found = [at for key, at in held.items() if key in ("*", device)]
        return max(found) if found else None

    async def mark(self, node: str) -> bool:
        """In-process routes are lost only with the process: only the first call says
        True."""
        first = node not in self._marked
        self._marked.add(node)
        return first

    async def close(self) -> None:
        self._by_uid.clear()
