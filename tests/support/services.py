"""Real backing services for tests: a fresh MySQL database and a private Redis key prefix
per test. A service that is down fails the test with what to run; it is never skipped."""

from __future__ import annotations

import secrets
import socket

import aiomysql

from storage.mysql import MySQLSettings, migrate
from storage.redis import redis_from_url

MYSQL_HOST = "127.0.0.1"
MYSQL_PORT = 3306
REDIS_URL = "redis://127.0.0.1:6379/0"

_HOW = {
    3306: "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd",
    6379: 'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
    5672: "rabbitmq-server -detached",
}


def require_port(port: int, name: str) -> None:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as e:
        raise RuntimeError(
            f"{name} is not reachable on 127.0.0.1:{port} ({e}); start it: {_HOW.get(port, '')}"
        ) from e


async def fresh_mysql(shards: int = 2) -> str:
    """Create and migrate a private database; its mysql:// URL."""
    require_port(MYSQL_PORT, "MariaDB")
    name = f"imgw_t_{secrets.token_hex(6)}"
    url = f"mysql://root:@{MYSQL_HOST}:{MYSQL_PORT}/{name}?shards={shards}&timeout=3"
    await migrate(MySQLSettings.from_url(url))
    return url


def fresh_redis_url() -> str:
    """A Redis URL with a private key prefix (delete with drop_redis)."""
    require_port(6379, "Redis")
    return f"{REDIS_URL}?prefix=imgwtest:{secrets.token_hex(6)}:"


async def drop_redis(url: str) -> None:
    client, prefix = redis_from_url(url, socket_timeout=10)  # never hang the suite
    try:
        keys = [k async for k in client.scan_iter(match=prefix + "*", count=1000)]
        for i in range(0, len(keys), 1000):
            await client.delete(*keys[i : i + 1000])
    finally:
        await client.aclose()


async def drop_mysql(url: str) -> None:
    settings = MySQLSettings.from_url(url)
    conn = await aiomysql.connect(
        host=settings.host,
        port=settings.port,
        user=settings.user,
        password=settings.password,
        autocommit=True,
    )
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"DROP DATABASE IF EXISTS `{settings.database}`")
    finally:
        conn.close()
