"""CPU per RedisRouteStore.online of 21 uids (one device each), old pipelined HGETALL vs script."""
import asyncio, sys, time, uvloop
sys.path.insert(0, sys.argv[1])
import redis.asyncio as aioredis
from storage.redis.routes import RedisRouteStore
from storage.models import Route
async def main():
    client = aioredis.Redis.from_url("redis://127.0.0.1:6379/0")
    store = RedisRouteStore(client, prefix="onlb:")
    uids = list(range(1000, 1021))
    for u in uids:
        await store.register(Route(u, "d", "n1", u, 1), 0) if False else None
    n = int(sys.argv[2])
    # populate index directly
    now = time.time_ns() // 1_000_000
    for u in uids:
        await client.hset(store.online_key(u), "d", f"n1|{u}|1|{now + 600_000}")
    r = await store.online(uids); assert len(r) == 21, r
    for rnd in range(3):
        c0 = time.process_time()
        for _ in range(n):
            await store.online(uids)
        c = time.process_time() - c0
        print(f"{sys.argv[1]}: {1e6*c/n:.1f} us CPU per online(21 uids)")
    for u in uids: await client.delete(store.online_key(u))
    await client.aclose()
uvloop.run(main())
