"""RedisRouteStore against a real Redis: the same compare-and-set rules as the in-process
store, TTLs, the online index, and renewal after Redis loses its data."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from storage.errors import CacheUnavailable, Revoked
from storage.models import Route
from storage.redis import RedisRouteStore, redis_from_url
from tests.redis.conftest import url_with
from tests.support.services import drop_redis

TTL_MS = 90_000


def route(uid: int = 7, device: str = "phone", *, node: str = "n1", conn: int = 1) -> Route:
    return Route(uid, device, node, conn, time.time_ns())


async def test_register_returns_previous_live_route(routes: RedisRouteStore) -> None:
    first = route(conn=1)
    assert await routes.register(first) is None
    assert await routes.get(7, "phone") == first
    second = route(node="n2", conn=2)
    assert await routes.register(second) == first
    assert await routes.get(7, "phone") == second
    assert await routes.online([7]) == {7: [second]}


async def test_register_of_the_same_route_again_is_not_a_previous_login(
    routes: RedisRouteStore,
) -> None:
    """A retried register (reply lost) must not make the connection kick itself."""
    r = route()
    assert await routes.register(r) is None
    assert await routes.register(r) is None
    assert await routes.get(r.uid, r.device) == r


async def test_stale_connection_cannot_renew_or_remove_newer_login(
    routes: RedisRouteStore, client: aioredis.Redis
) -> None:
    old = route(conn=1)
    await routes.register(old)
    new = route(node="n2", conn=2)
    assert await routes.register(new) == old
    key = routes.route_key(7, "phone")
    await client.pexpire(key, 10_000)  # as if the newer login's renewal is due

    await routes.renew([old])
    assert await routes.get(7, "phone") == new
    assert 0 < await client.pttl(key) <= 10_000  # the stale renewal did not extend it
    assert await routes.remove(old) is False
    assert await routes.get(7, "phone") == new
    assert await routes.online([7]) == {7: [new]}
    assert routes.statistics()["refused"] == 1

    assert await routes.remove(new) is True
    assert await routes.get(7, "phone") is None
    assert await routes.online([7]) == {}
    assert not await client.hexists(routes.online_key(7), "phone")


async def test_renew_pushes_the_ttl_back(routes: RedisRouteStore, client: aioredis.Redis) -> None:
    r = route()
    await routes.register(r)
    key, index = routes.route_key(7, "phone"), routes.online_key(7)
    assert TTL_MS - 5_000 < await client.pttl(key) <= TTL_MS
    assert TTL_MS - 5_000 < await client.pttl(index) <= TTL_MS
    await client.pexpire(key, 5_000)
    await client.pexpire(index, 5_000)
    await routes.renew([r])
    assert TTL_MS - 5_000 < await client.pttl(key) <= TTL_MS
    assert TTL_MS - 5_000 < await client.pttl(index) <= TTL_MS
    assert routes.statistics()["renewed"] == 1


async def test_routes_expire_without_renewal_and_renewal_brings_them_back(
    client: aioredis.Redis, prefix: str
) -> None:
    """The one test that waits: Redis expires the key, the index field expires by clock."""
    routes = RedisRouteStore(client, prefix=prefix, ttl_s=2)
    r = route()
    await routes.register(r)
    assert 0 < await client.pttl(routes.route_key(7, "phone")) <= 2_000
    await asyncio.sleep(2.3)
    assert await routes.get(7, "phone") is None
    assert await routes.online([7]) == {}
    # The connection is still alive: its next renewal re-creates the route.
    await routes.renew([r])
    assert await routes.get(7, "phone") == r
    assert await routes.online([7]) == {7: [r]}
    assert routes.statistics()["recreated"] == 1


async def test_marker_says_when_the_routes_were_lost(
    routes: RedisRouteStore, client: aioredis.Redis, prefix: str
) -> None:
    assert await routes.mark("n1") is True  # a node's first mark: nothing before it
    assert await routes.mark("n1") is False
    assert await routes.mark("n2") is True  # each node has its own
    assert 0 < await client.pttl(routes.marker_key("n1")) <= TTL_MS
    await drop_redis(url_with(prefix=prefix))  # FLUSHDB, a restart without persistence
    assert await routes.mark("n1") is True
    assert await routes.mark("n1") is False


async def test_register_refuses_a_revoked_token_in_the_same_script(
    routes: RedisRouteStore,
) -> None:
    await routes.revoke(7, "phone", 1_000, 3600)
    with pytest.raises(Revoked):
        await routes.register(route(), iat=None)  # v1: minting time unknown
    with pytest.raises(Revoked):
        await routes.register(route(), iat=1_000)  # minted at the revocation
    assert await routes.get(7, "phone") is None  # nothing installed
    r = route()
    assert await routes.register(r, iat=1_001) is None  # minted after it
    assert await routes.get(7, "phone") == r
    assert await routes.register(route(device="tablet")) is None  # another device
    await routes.revoke(7, None, 2_000, 3600)  # every device
    with pytest.raises(Revoked):
        await routes.register(route(device="tablet"), iat=1_500)


async def test_online_ignores_and_prunes_expired_index_fields(
    routes: RedisRouteStore, client: aioredis.Redis
) -> None:
    live = route(device="phone")
    await routes.register(live)
    index = routes.online_key(7)
    past = time.time_ns() // 1_000_000 - 1_000
    await client.hset(index, "tablet", f"n9|99|1|{past}")
    assert await routes.online([7]) == {7: [live]}
    await routes.renew([live])  # every write prunes the dead fields of the uid
    assert await client.hkeys(index) == [b"phone"]


async def test_online_of_many_uids_is_one_round_trip(
    counting_client: tuple[aioredis.Redis, Callable[[], int]], prefix: str
) -> None:
    client, sends = counting_client
    routes = RedisRouteStore(client, prefix=prefix)
    uids = list(range(1, 1_001))
    registered = [route(uid, "phone", conn=uid) for uid in uids]
    await asyncio.gather(*(routes.register(r) for r in registered))
    await routes.register(route(5, "pc", node="n2", conn=5_000))

    before = sends()
    started = time.perf_counter()
    online = await routes.online([*uids, 5, 2_000_000])  # a repeat and an offline uid
    elapsed = time.perf_counter() - started
    assert sends() - before == 1
    assert elapsed < 1.0
    assert len(online) == 1_000 and 2_000_000 not in online
    assert online[1] == [registered[0]]
    assert sorted(r.device for r in online[5]) == ["pc", "phone"]

    await routes.renew(registered)  # warm: scripts loaded
    before = sends()
    await routes.renew(registered)
    assert sends() - before == 1
    assert routes.statistics()["renewed"] == 2_000


async def test_concurrent_registrations_share_one_round_trip(
    counting_client: tuple[aioredis.Redis, Callable[[], int]], prefix: str
) -> None:
    """A login storm: the registrations of one loop iteration go in one pipeline, and
    each still gets its own previous route."""
    client, sends = counting_client
    routes = RedisRouteStore(client, prefix=prefix)
    await routes.register(route(1, "warm"))  # loads the script
    first = [route(uid, "phone", conn=uid) for uid in range(1, 501)]
    assert await asyncio.gather(*(routes.register(r) for r in first)) == [None] * 500
    newer = [route(uid, "phone", conn=10_000 + uid) for uid in range(1, 501)]
    before = sends()
    assert await asyncio.gather(*(routes.register(r) for r in newer)) == first
    assert sends() - before == 1
    assert (await routes.online([7]))[7] == [newer[6]]
    before = sends()  # a mass disconnect: stale routes refused, current ones removed
    stale = await asyncio.gather(*(routes.remove(r) for r in first))
    current = await asyncio.gather(*(routes.remove(r) for r in newer))
    assert stale == [False] * 500 and current == [True] * 500
    assert sends() - before == 2
    assert list(await routes.online(range(1, 501))) == [1]  # only the "warm" device


async def test_registrations_made_while_pipelines_are_out_go_in_the_next_one(
    counting_client: tuple[aioredis.Redis, Callable[[], int]], prefix: str
) -> None:
    """Logins trickling in one per loop iteration (a busy node turns its loop over
    thousands of times a second): while two pipelines are out the rest gather, so 300
    registrations take far fewer round trips than 300 (one per iteration before: 300;
    here 40-60, as many as come back while the loop turns), and each caller still gets
    its own answer."""
    client, sends = counting_client
    routes = RedisRouteStore(client, prefix=prefix)
    await routes.register(route(1, "warm"))  # loads the script
    before = sends()
    tasks = []
    for uid in range(1, 301):
        tasks.append(asyncio.ensure_future(routes.register(route(uid, "phone", conn=uid))))
        await asyncio.sleep(0)  # the next iteration
    assert await asyncio.gather(*tasks) == [None] * 300
    assert sends() - before < 100
    assert len(await routes.online(range(1, 301))) == 300


async def test_one_bad_registration_fails_only_its_own_caller(
    routes: RedisRouteStore, client: aioredis.Redis
) -> None:
    """A call whose script errors (here: uid 7's index key holds a string) shares its
    pipeline with 19 good ones: only its caller gets CacheUnavailable."""
    await client.set(routes.online_key(7), "not a hash")
    results = await asyncio.gather(
        *(routes.register(route(uid, "phone", conn=uid)) for uid in range(1, 21)),
        return_exceptions=True,
    )
    assert isinstance(results[6], CacheUnavailable) and "WRONGTYPE" in str(results[6])
    assert results[:6] + results[7:] == [None] * 19
    assert len(await routes.online([u for u in range(1, 21) if u != 7])) == 19


async def test_registrations_fail_together_when_redis_is_down(prefix: str) -> None:
    client, _ = redis_from_url("redis://127.0.0.1:1/0?timeout=0.5")
    routes = RedisRouteStore(client, prefix=prefix)
    results = await asyncio.gather(
        *(routes.register(route(uid, "phone")) for uid in range(20)), return_exceptions=True
    )
    assert all(isinstance(r, CacheUnavailable) for r in results)
    assert len({id(r) for r in results}) == 20  # one exception object per caller
    await routes.close()


async def test_renew_reloads_scripts_after_a_script_cache_flush(
    routes: RedisRouteStore, client: aioredis.Redis
) -> None:
    rs = [route(uid, "phone", conn=uid) for uid in (1, 2, 3)]
    for r in rs:
        await routes.register(r)
    await client.script_flush()
    await routes.renew(rs)
    assert routes.statistics() == {"renewed": 3, "recreated": 0, "refused": 0}
    await client.script_flush()
    assert await routes.remove(rs[0]) is True


async def test_renew_after_redis_lost_its_data(
    routes: RedisRouteStore, client: aioredis.Redis, prefix: str
) -> None:
    a = route(uid=1, conn=1)
    b = route(uid=2, conn=2)
    await routes.register(a)
    await routes.register(b)
    await drop_redis(url_with(prefix=prefix))  # what a restart without persistence does to our keys
    assert await routes.online([1, 2]) == {}

    await routes.renew([a, b])  # live connections reappear at their next renewal
    assert await routes.get(1, "phone") == a
    assert await routes.online([1, 2]) == {1: [a], 2: [b]}
    assert 0 < await client.pttl(routes.route_key(1, "phone")) <= TTL_MS
    assert routes.statistics()["recreated"] == 2

    # A newer login of device 1 after the loss: the stale connection never displaces it.
    newer = route(uid=1, node="n2", conn=3)
    assert await routes.register(newer) == a
    await routes.renew([a])
    assert await routes.get(1, "phone") == newer
    assert await routes.online([1]) == {1: [newer]}


async def test_absent_key_is_not_recreated_over_a_newer_live_index_entry(
    routes: RedisRouteStore, client: aioredis.Redis
) -> None:
    old = route(conn=1)
    await routes.register(old)
    new = route(node="n2", conn=2)
    await routes.register(new)
    await client.delete(routes.route_key(7, "phone"))  # only the key went missing
    await routes.renew([old])
    assert await routes.get(7, "phone") is None
    assert await routes.online([7]) == {7: [new]}
    await routes.renew([new])
    assert await routes.get(7, "phone") == new


async def test_remove_cleans_the_index_even_after_the_key_expired(
    routes: RedisRouteStore, client: aioredis.Redis
) -> None:
    r = route()
    await routes.register(r)
    await client.delete(routes.route_key(7, "phone"))
    assert await routes.remove(r) is True
    assert await client.hlen(routes.online_key(7)) == 0
    assert await routes.remove(r) is False


async def test_devices_of_one_uid_are_independent(routes: RedisRouteStore) -> None:
    phone, pc = route(device="phone", conn=1), route(device="pc", node="n2", conn=2)
    await routes.register(phone)
    await routes.register(pc)
    online = await routes.online([7])
    assert sorted(online[7], key=lambda r: r.device) == [pc, phone]
    assert await routes.remove(phone) is True
    assert await routes.online([7]) == {7: [pc]}


async def test_node_ids_with_separators_round_trip(routes: RedisRouteStore) -> None:
    r = route(node="dc1|gw-3:7", conn=2**64 - 1)
    await routes.register(r)
    assert await routes.get(7, "phone") == r
    assert await routes.online([7]) == {7: [r]}
    await routes.renew([r])
    assert await routes.remove(r) is True


async def test_empty_calls_touch_nothing(
    counting_client: tuple[aioredis.Redis, Callable[[], int]], prefix: str
) -> None:
    client, sends = counting_client
    routes = RedisRouteStore(client, prefix=prefix)
    before = sends()
    assert await routes.online([]) == {}
    await routes.renew([])
    assert sends() == before


async def test_every_route_key_has_a_ttl(
    routes: RedisRouteStore, client: aioredis.Redis, prefix: str
) -> None:
    rs = [route(uid, dev, conn=uid) for uid in (1, 2) for dev in ("phone", "pc")]
    for r in rs:
        await routes.register(r)
    await routes.renew(rs)
    await routes.remove(rs[0])
    keys = {k async for k in client.scan_iter(match=prefix + "*")}  # SCAN may repeat a key
    assert len(keys) == 5  # 3 routes, 2 indexes
    for key in keys:
        assert 0 < await client.ttl(key) <= 90
        assert await client.memory_usage(key) < 10_000


async def test_close_closes_the_pool(prefix: str, client: aioredis.Redis) -> None:
    name = "imgw-close-" + prefix.split(":")[1]
    own, _ = redis_from_url(url_with(prefix=prefix), client_name=name)
    routes = RedisRouteStore(own, prefix=prefix)
    await routes.register(route())

    async def named() -> int:
        return sum(1 for c in await client.client_list() if c.get("name") == name)

    assert await named() == 1
    await routes.close()
    for _ in range(100):  # the server notices the closed socket at once, but not in sync
        if await named() == 0:
            break
        await asyncio.sleep(0.01)
    assert await named() == 0


async def test_a_connection_killed_under_the_pool_is_replaced_once(
    prefix: str, client: aioredis.Redis
) -> None:
    """As after a Redis restart: the pooled socket is dead; the call retries once at once."""
    own, _ = redis_from_url(url_with(prefix=prefix))
    routes = RedisRouteStore(own, prefix=prefix)
    r = route()
    await routes.register(r)
    victim = await own.client_id()
    assert await client.client_kill_filter(_id=victim) == 1
    assert await routes.get(7, "phone") == r
    assert await own.client_id() != victim
    await routes.close()
