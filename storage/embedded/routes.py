"""In-process RouteStore for the embedded deployment: the same compare-and-set rules as
the Redis adapter, with expiry checked on read."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from storage.models import Route

ROUTE_TTL_S = 90.0


class MemoryRouteStore:
    def __init__(self, *, ttl_s: float = ROUTE_TTL_S, clock: Callable[[], float] = time.monotonic):
        self._ttl = ttl_s
        self._clock = clock
        # uid -> device -> (route, expires_at)
        self._by_uid: dict[int, dict[str, tuple[Route, float]]] = {}

    async def register(self, route: Route) -> Route | None:
        devices = self._by_uid.setdefault(route.uid, {})
        prev = devices.get(route.device)
        devices[route.device] = (route, self._clock() + self._ttl)
        if prev is None or prev[1] < self._clock():
            return None
        return prev[0]

    async def renew(self, routes: Sequence[Route]) -> None:
        expires = self._clock() + self._ttl
        for route in routes:
            devices = self._by_uid.get(route.uid)
            cur = devices.get(route.device) if devices else None
            if devices is not None and cur is not None and cur[0] == route:
                devices[route.device] = (route, expires)

    async def remove(self, route: Route) -> bool:
        devices = self._by_uid.get(route.uid)
        cur = devices.get(route.device) if devices else None
        if devices is None or cur is None or cur[0] != route:
            return False
        del devices[route.device]
        if not devices:
            del self._by_uid[route.uid]
        return True

    async def get(self, uid: int, device: str) -> Route | None:
        devices = self._by_uid.get(uid)
        cur = devices.get(device) if devices else None
        if cur is None or cur[1] < self._clock():
            return None
        return cur[0]

    async def online(self, uids: Sequence[int]) -> dict[int, list[Route]]:
        now = self._clock()
        out: dict[int, list[Route]] = {}
        for uid in uids:
            devices = self._by_uid.get(uid)
            if devices:
                live = [r for r, exp in devices.values() if exp >= now]
                if live:
                    out[uid] = live
        return out

    async def ttl(self, uid: int, device: str) -> float | None:
        devices = self._by_uid.get(uid)
        cur = devices.get(device) if devices else None
        if cur is None or cur[1] < self._clock():
            return None
        return cur[1] - self._clock()

    async def close(self) -> None:
        self._by_uid.clear()
