"""A production gateway (MySQL + Redis) whose links to both run through fault-injecting
TCP proxies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gateway.server import Server
from tests.conftest import make_config
from tests.support.services import drop_mysql, drop_redis, fresh_mysql, fresh_redis_url
from tests.support.tcpproxy import TcpProxy


@dataclass
class Prod:
    server: Server
    mysql: TcpProxy
    redis: TcpProxy
    redis_url: str  # direct, not proxied (for the test's own inspection)

    @property
    def port(self) -> int:
        return self.server.port


def _via(url: str, proxy_port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy_port}")
    return parts._replace(netloc=netloc).geturl()


@pytest.fixture
async def prod(tmp_path: Path) -> AsyncIterator[Prod]:
    mysql_url = await fresh_mysql()
    redis_url = fresh_redis_url()
    mysql_proxy = TcpProxy("127.0.0.1", 3306)
    redis_proxy = TcpProxy("127.0.0.1", 6379)
    await mysql_proxy.start()
    await redis_proxy.start()
    server = Server(
        make_config(
            tmp_path,
            store=_via(mysql_url, mysql_proxy.port),
            cache=_via(redis_url, redis_proxy.port),
            rate_burst=10_000,
            rate_per_s=10_000,
            route_renew_s=1.0,  # renewals every second with traffic (30 s in production)
        )
    )
    await server.start()
    try:
        yield Prod(server, mysql_proxy, redis_proxy, redis_url)
    finally:
        mysql_proxy.restore()
        redis_proxy.restore()
        await server.shutdown()
        await mysql_proxy.close()
        await redis_proxy.close()
        await drop_mysql(mysql_url)
        await drop_redis(redis_url)
