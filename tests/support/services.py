"""Real backing services for tests: a fresh MySQL database and a private Redis key prefix
per test. A service that is down fails the test with what to run; it is never skipped."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from pathlib import Path

import aiomysql

from storage.mysql import MySQLSettings, migrate
from storage.mysql.shardmap import same_place, server_settings
from storage.redis import redis_from_url

MYSQL_HOST = "127.0.0.1"
MYSQL_PORT = 3306
# The second MariaDB server of the shard-map tests (scripts/mariadb-second).
MYSQL2_PORT = int(os.environ.get("IMGW_MARIADB2_PORT", "3307"))
_SECOND = Path(__file__).resolve().parents[2] / "scripts" / "mariadb-second"
# A primary with binary logs and its replica (scripts/mariadb-replica: GTID, semi-sync).
REPLICA_PRIMARY_PORT = int(os.environ.get("IMGW_REPLICA_PRIMARY_PORT", "3308"))
REPLICA_PORT = int(os.environ.get("IMGW_REPLICA_PORT", "3309"))
REPLICA_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mariadb-replica"
REDIS_URL = "redis://127.0.0.1:6379/0"
# A 3-master Redis Cluster of the tests' own (scripts/redis-cluster: started when its
# ports do not answer, stopped at the end by the session that started it).
CLUSTER_PORTS = (7101, 7102, 7103)
CLUSTER_URL = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in CLUSTER_PORTS) + "/"
CLUSTER_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "redis-cluster"
# `scripts/redis-cluster --replicas 1`: 3 masters and 3 replicas, a cluster of its own
REPLICATED_CLUSTER_PORTS = (7111, 7112, 7113, 7114, 7115, 7116)
REPLICATED_CLUSTER_URL = (
    "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in REPLICATED_CLUSTER_PORTS) + "/"
)
# scripts/redis-sentinel: a master and its replica (7121, 7122), three Sentinels
SENTINEL_PORTS = (7131, 7132, 7133)
SENTINEL_URL = "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in SENTINEL_PORTS) + "/imgw"
SENTINEL_SCRIPT = CLUSTER_SCRIPT.with_name("redis-sentinel")

_HOW = {
    3306: (
        "start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid "
        "--exec /usr/sbin/mariadbd"
    ),
    6379: 'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
    5672: "rabbitmq-server -detached",
    MYSQL2_PORT: f"{_SECOND} start",
}
_second_checked = False


def require_port(port: int, name: str) -> None:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as e:
        raise RuntimeError(
            f"{name} is not reachable on 127.0.0.1:{port} ({e}); start it: {_HOW.get(port, '')}"
        ) from e


def second_mysql() -> None:
    """Make sure the second MariaDB server answers, starting it (scripts/mariadb-second,
    once per test session) if it does not; a failure fails the test, never skips it."""
    global _second_checked
    if _second_checked:
        return
    try:
        require_port(MYSQL2_PORT, "the second MariaDB")
    except RuntimeError:
        done = subprocess.run(
            [str(_SECOND), "start"], capture_output=True, text=True, timeout=90, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"cannot start the second MariaDB ({_SECOND} start): {done.stderr.strip()}"
            ) from None
        require_port(MYSQL2_PORT, "the second MariaDB")
    _second_checked = True


def replicated_mysql() -> None:
    """Make sure the primary and its replica answer and replicate, starting them
    (scripts/mariadb-replica, idempotent) otherwise; a failure fails the test."""
    done = subprocess.run(
        [str(REPLICA_SCRIPT), "start"], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"cannot start the replicated MariaDB ({REPLICA_SCRIPT} start): {done.stderr.strip()}"
        )


async def fresh_mysql(shards: int = 2, *, sharded: bool = False) -> str:
    """Create and migrate a private database; its mysql:// URL. `sharded`: the shards
    split over two servers (the first half in this database on 3306, the second in a
    database of the same name on the second server), with the metadata on 3306."""
    require_port(MYSQL_PORT, "MariaDB")
    name = f"imgw_t_{secrets.token_hex(6)}"
    url = f"mysql://root:@{MYSQL_HOST}:{MYSQL_PORT}/{name}?shards={shards}&timeout=3"
    servers = None
    if sharded:
        second_mysql()
        servers = [
            f"mysql://root@{MYSQL_HOST}:{MYSQL_PORT}/{name}",
            f"mysql://root@{MYSQL_HOST}:{MYSQL2_PORT}/{name}",
        ]
    await migrate(MySQLSettings.from_url(url), servers)
    return url


def fresh_redis_url() -> str:
    """A Redis URL with a private key prefix (delete with drop_redis)."""
    require_port(6379, "Redis")
    return f"{REDIS_URL}?prefix=imgwtest:{secrets.token_hex(6)}:"


def _cluster_script(command: str, *, replicas: bool = False) -> str:
    ports = REPLICATED_CLUSTER_PORTS if replicas else CLUSTER_PORTS
    env = {**os.environ, "IMGW_CLUSTER_PORTS": " ".join(map(str, ports))}
    args = ["--replicas", "1"] if replicas else []
    done = subprocess.run(
        [str(CLUSTER_SCRIPT), *args, command],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    if done.returncode != 0:
        by_hand = " ".join(["scripts/redis-cluster", *args, "start"])
        raise RuntimeError(
            f"{CLUSTER_SCRIPT.name} {command} failed ({done.returncode}): "
            f"{done.stdout}{done.stderr}; start it by hand: {by_hand}"
        )
    return done.stdout.strip()


def start_redis_cluster() -> bool:
    """Make sure the test cluster answers; True when this call started it."""
    return _cluster_script("start").endswith("started")


def stop_redis_cluster() -> None:
    _cluster_script("stop")


def start_replicated_cluster() -> bool:
    """Make sure the 3-master, 3-replica cluster answers with every master replicated
    (started afresh when a node is missing, a killed master's included); True when this
    call started it."""
    return _cluster_script("start", replicas=True).endswith("started")


def stop_replicated_cluster() -> None:
    _cluster_script("stop", replicas=True)


def start_sentinels() -> bool:
    """Make sure the Sentinels answer and agree on a master that has a replica in sync
    (all started afresh when not, a killed master's setup included); True when this call
    started them."""
    done = subprocess.run(
        [str(SENTINEL_SCRIPT), "start"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{SENTINEL_SCRIPT.name} start failed ({done.returncode}): "
            f"{done.stdout}{done.stderr}; start it by hand: scripts/redis-sentinel start"
        )
    return done.stdout.strip().endswith("started")


def fresh_cluster_url() -> str:
    """A Redis Cluster URL with a private key prefix (delete with drop_redis)."""
    return with_prefix(CLUSTER_URL)


def with_prefix(base: str) -> str:
    """The Redis URL `base` (no query) with a private key prefix (delete with
    drop_redis)."""
    return f"{base}?prefix=imgwtest:{secrets.token_hex(6)}:"


async def drop_redis(url: str) -> None:
    client, prefix = redis_from_url(url, socket_timeout=10)  # never hang the suite
    try:
        keys = [k async for k in client.scan_iter(match=prefix + "*", count=1000)]
        for i in range(0, len(keys), 1000):
            await client.delete(*keys[i : i + 1000])
    finally:
        await client.aclose()


async def drop_mysql(url: str) -> None:
    """Drop a test database, and its shard servers' databases if it has a shard map."""
    settings = MySQLSettings.from_url(url)
    others: list[MySQLSettings] = []
    conn = await aiomysql.connect(
        host=settings.host,
        port=settings.port,
        user=settings.user,
        password=settings.password,
        autocommit=True,
    )
    try:
        async with conn.cursor() as cur:
            try:
                await cur.execute(f"SELECT url FROM `{settings.database}`.im_shard_map")
                for (server,) in await cur.fetchall():
                    s = server_settings(settings, server)
                    if not same_place(s, settings):
                        others.append(s)
            except aiomysql.Error:
                pass  # no database, or no map
            await cur.execute(f"DROP DATABASE IF EXISTS `{settings.database}`")
    finally:
        conn.close()
    for s in others:
        conn = await aiomysql.connect(
            host=s.host, port=s.port, user=s.user, password=s.password, autocommit=True
        )
        try:
            async with conn.cursor() as cur:
                await cur.execute(f"DROP DATABASE IF EXISTS `{s.database}`")
        finally:
            conn.close()


async def downgrade_then_migrate(url: str, version: int, *statements: str) -> list[str]:
    """Take the database at `url` back to schema `version` (after `statements`, which
    undo what later versions added), check that a store refuses to start on it and says
    to run `imgw db migrate`, migrate, check the version recorded; migrate's report."""
    from storage.mysql import MySQLStore
    from storage.mysql.schema import SCHEMA_VERSION

    s = MySQLSettings.from_url(url)
    conn = await aiomysql.connect(host=s.host, port=s.port, user=s.user, password=s.password,
                                  db=s.database, autocommit=True)  # fmt: skip
    try:
        async with conn.cursor() as cur:
            for stmt in statements:
                await cur.execute(stmt)
            await cur.execute(
                "UPDATE im_meta SET value=%s WHERE name='schema_version'", (str(version),)
            )
        store = MySQLStore(s)
        try:
            await store.start()
        except Exception as e:
            assert "imgw db migrate" in str(e), e
        else:
            raise AssertionError("a store started on an older schema")
        finally:
            await store.close()
        done = await migrate(s)
        async with conn.cursor() as cur:
            await cur.execute("SELECT value FROM im_meta WHERE name='schema_version'")
            assert (await cur.fetchone())[0] == str(SCHEMA_VERSION)
        return done
    finally:
        conn.close()


async def mysql_rows(port: int, database: str | None, query: str) -> list[tuple[object, ...]]:
    """The rows of one autocommitted `query` on the MariaDB server at 127.0.0.1:`port`
    (root, no password), in `database` (None: none selected)."""
    conn = await aiomysql.connect(
        host="127.0.0.1", port=port, user="root", password="", db=database, autocommit=True
    )
    try:
        async with conn.cursor() as cur:
            await cur.execute(query)
            return list(await cur.fetchall())
    finally:
        conn.close()
