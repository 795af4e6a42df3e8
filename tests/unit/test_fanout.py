"""Fan-out without sockets or servers: the in-memory route store, a recording bus, and
sessions that record what is written to them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from gateway import envelope, fanout
from gateway.fanout import FanOut
from gateway.metrics import Metrics
from protocol.codec import encode
from protocol.frames import SyncHint
from storage.embedded.routes import MemoryRouteStore
from storage.models import Route
from storage.ports import Delivery

ME = "node-a"


class Sink:
    """A session: what fan-out writes to it, and the route it logged in with."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


class CountingRoutes(MemoryRouteStore):
    def __init__(self) -> None:
        super().__init__()
        self.lookups: list[list[int]] = []
        self.fail = False

    async def online(self, uids: Sequence[int]) -> dict[int, list[Route]]:
        self.lookups.append(sorted(uids))
        if self.fail:
            raise ConnectionError("redis: lookup failed")
        return await super().online(uids)


class RecordingBus:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.result = Delivery.OK

    async def publish(self, node: str, payload: bytes) -> Delivery:
        self.published.append((node, payload))
        return self.result


class World:
    def __init__(self) -> None:
        self.routes = CountingRoutes()
        self.bus = RecordingBus()
        self.sessions: dict[int, Sink] = {}
        self.lookup_failures = 0
        self.background: set[asyncio.Task[Any]] = set()
        self.fan = FanOut(
            node_id=ME,
            loop=asyncio.get_running_loop(),
            routes=self.routes,
            bus=self.bus,  # type: ignore[arg-type]  # publish is all fan-out uses
            sessions=self.sessions,  # type: ignore[arg-type]  # route and write: all it uses
            local=self.here,  # type: ignore[arg-type]
            metrics=Metrics(),
            spawn=self.spawn,
            on_lookup_failed=self.failed,
            log=_NoLog(),
            throttle=lambda key: 0,
        )

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    def here(self, uid: int) -> list[Sink]:
        return [s for s in self.sessions.values() if s.route.uid == uid]

    def failed(self) -> None:
        self.lookup_failures += 1

    async def login(self, uid: int, device: str, node: str = ME, conn_id: int = 0) -> Sink:
        conn_id = conn_id or len(self.sessions) + 100
        route = Route(uid, device, node, conn_id, epoch=conn_id)
        await self.routes.register(route)
        sink = Sink(route)
        if node == ME:
            self.sessions[conn_id] = sink
        return sink


class _NoLog:
    def warning(self, *args: object, **kw: object) -> None:
        pass


async def test_one_lookup_and_one_write_a_connection_for_an_iteration() -> None:
    """Deliveries of one iteration: one route lookup for all their users, and one write
    to each connection carrying its frames in order."""
    w = World()
    a, b, c = await w.login(1, "ios"), await w.login(2, "ios"), await w.login(3, "web")
    w.fan.deliver([1, 2], b"m1")
    w.fan.deliver([2, 3], b"m2")
    assert await w.fan.settled()
    assert w.routes.lookups == [[1, 2, 3]]
    assert (a.written, b.written, c.written) == ([b"m1"], [b"m1m2"], [b"m2"])


async def test_the_sender_is_skipped_and_its_other_devices_are_not() -> None:
    w = World()
    phone, laptop = await w.login(1, "ios"), await w.login(1, "mac")
    w.fan.deliver([1], b"m", phone)  # type: ignore[arg-type]
    assert await w.fan.settled()
    assert (phone.written, laptop.written) == ([], [b"m"])


async def test_a_route_of_another_login_is_not_this_connection() -> None:
    """The route store names conn 100 with a newer epoch than the session here holds
    (it logged in again elsewhere and the id came back): nothing is written to it."""
    w = World()
    old = await w.login(1, "ios", conn_id=100)
    await w.routes.register(Route(1, "ios", ME, 100, epoch=999))
    w.fan.deliver([1], b"m")
    assert await w.fan.settled()
    assert old.written == []


async def test_remote_users_get_one_publish_per_node_with_every_frame() -> None:
    w = World()
    await w.login(1, "ios", node="node-b", conn_id=7)
    await w.login(2, "ios", node="node-b", conn_id=8)
    await w.login(3, "ios", node="node-c", conn_id=9)
    w.fan.deliver([1, 2], b"m1")
    w.fan.deliver([3, 1], b"m2")
    assert await w.fan.settled()
    got = {node: envelope.unpack(data) for node, data in w.bus.published}
    assert len(w.bus.published) == 2
    assert got["node-b"] == (envelope.FRAMES, [[[7, 8], b"m1"], [[7], b"m2"]])
    assert got["node-c"] == (envelope.FRAMES, [[[9], b"m2"]])


async def test_a_failed_lookup_is_reported_and_settled_says_so() -> None:
    w = World()
    await w.login(1, "ios")
    w.routes.fail = True
    w.fan.deliver([1], b"m")
    assert not await w.fan.settled()
    assert (w.lookup_failures, w.fan.failures) == (1, 1)
    w.routes.fail = False
    w.fan.deliver([1], b"m")
    assert await w.fan.settled()  # only failures since the call count


async def test_without_routes_the_frames_still_reach_this_nodes_connections() -> None:
    """A failed lookup (Redis down, a master failing over): the users' connections here
    get their frames in order, the skipped one excepted; those on other nodes get nothing
    now (the route watch hints them once Redis answers)."""
    w = World()
    phone, laptop = await w.login(1, "ios"), await w.login(1, "mac")
    other = await w.login(2, "ios")
    await w.login(3, "ios", node="node-b", conn_id=7)
    w.routes.fail = True
    w.fan.deliver([1, 3], b"m1", phone)  # type: ignore[arg-type]
    w.fan.deliver([1, 2, 3], b"m2")
    assert not await w.fan.settled()
    assert (phone.written, laptop.written, other.written) == ([b"m2"], [b"m1m2"], [b"m2"])
    assert w.bus.published == []


async def test_a_lost_publish_is_followed_by_a_sync_hint_once_the_bus_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fanout, "MISSED_RETRY_S", 0.01)
    w = World()
    await w.login(1, "ios", node="node-b", conn_id=7)
    w.bus.result = Delivery.LOST
    w.fan.deliver([1], b"m")
    assert not await w.fan.settled()
    assert w.fan.owes_hints
    await asyncio.sleep(0.05)  # a retry round, still lost: the hint stays owed
    assert w.fan.owes_hints
    w.bus.result = Delivery.OK
    for _ in range(100):
        if not w.fan.owes_hints:
            break
        await asyncio.sleep(0.01)
    assert not w.fan.owes_hints
    node, data = w.bus.published[-1]
    assert (node, envelope.unpack(data)) == (
        "node-b",
        (envelope.FRAMES, [[[7], encode(SyncHint())]]),
    )
    w.fan.close()


async def test_nothing_to_deliver_costs_nothing() -> None:
    w = World()
    w.fan.deliver([], b"m")
    assert await w.fan.settled()
    assert w.routes.lookups == []


def test_envelope_round_trip_and_refusals() -> None:
    assert envelope.unpack(envelope.kick([3, 4])) == (envelope.KICK, [[[3, 4], b""]])
    assert envelope.unpack(envelope.revoke([5])) == (envelope.REVOKE, [[[5], b""]])
    frames = envelope.frames([([1, 2], b"x"), ([3], b"y")])
    assert envelope.unpack(frames) == (envelope.FRAMES, [[[1, 2], b"x"], [[3], b"y"]])
    for bad in (b"\xc1", encode(SyncHint()), b"\x92\xa1k\x90"):
        with pytest.raises(ValueError):
            envelope.unpack(bad)
