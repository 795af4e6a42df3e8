"""The shard map: which MySQL server holds which message shards (docs/decisions.md,
"Message shards over several MySQL servers").

The map lives in the metadata database (`im_shard_map`: one row per contiguous range
of shard numbers and the server URL holding it). An empty map is the single-server
layout: every shard in the metadata database itself. A server URL in the map names a
host, port and database; user, password and the pool/timeout options come from the
metadata URL unless the map's URL gives its own user and password.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from storage.mysql.settings import MySQLSettings

MAP_DDL: Final = """CREATE TABLE IF NOT EXISTS im_shard_map (
    lo  INT UNSIGNED NOT NULL PRIMARY KEY,
    hi  INT UNSIGNED NOT NULL,
    url VARCHAR(512) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""


@dataclass(frozen=True, slots=True)
class ShardRange:
    """Shards `lo`..`hi` (inclusive) live on the server at `url`."""

    lo: int
    hi: int
    url: str


def split(shards: int, urls: Sequence[str]) -> list[ShardRange]:
    """`shards` shards in contiguous ranges over `urls`, as even as they divide."""
    if not urls:
        raise ValueError("no servers")
    if len(set(urls)) != len(urls):
        raise ValueError("a server is listed twice")
    if len(urls) > shards:
        raise ValueError(f"{len(urls)} servers for {shards} shards: at most one server a shard")
    for url in urls:
        check_url(url)
    out: list[ShardRange] = []
    lo = 0
    for i, url in enumerate(urls):
        n = shards // len(urls) + (1 if i < shards % len(urls) else 0)
        out.append(ShardRange(lo, lo + n - 1, url))
        lo += n
    return out


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme != "mysql" or not parts.hostname:
        raise ValueError(f"a server in the shard map must be mysql://[user@]host:port/db: {url!r}")
    opts = dict(parse_qsl(parts.query))
    replica = opts.pop("replica", None)
    if opts:
        raise ValueError(
            f"a shard map URL takes only ?replica= (the rest comes from --store): {url!r}"
        )
    if replica is not None and not replica.startswith("mysql://"):
        raise ValueError(f"replica must be a mysql:// URL: {url!r}")


def place(url: str) -> str:
    """`url` without its options (the replica): the server itself."""
    return urlunsplit(urlsplit(url)._replace(query=""))


def server_settings(meta: MySQLSettings, url: str) -> MySQLSettings:
    """The settings of the server at `url`: its host, port and database; the metadata
    URL's credentials unless `url` has its own; the metadata URL's options."""
    parts = urlsplit(url)
    s = MySQLSettings.from_url(urlunsplit(parts._replace(query="")))
    return dataclasses.replace(
        meta,
        host=s.host,
        port=s.port,
        database=s.database,
        user=s.user if parts.username else meta.user,
        password=s.password if parts.username else meta.password,
        replica=dict(parse_qsl(parts.query)).get("replica", ""),
    )


def replica_settings(server: MySQLSettings) -> MySQLSettings | None:
    """The settings of `server`'s read replica, if it has one: its place, the server's
    credentials unless the replica URL has its own, a timeout of at most 1 s (a replica
    that hangs is given up quickly: the primary answers)."""
    if not server.replica:
        return None
    r = server_settings(dataclasses.replace(server, replica=""), server.replica)
    return dataclasses.replace(r, replica="", timeout_s=min(server.timeout_s, 1.0))


def same_place(a: MySQLSettings, b: MySQLSettings) -> bool:
    """Whether two settings name the same database on the same server."""
    return (a.host, a.port, a.database) == (b.host, b.port, b.database)


def masked(url: str) -> str:
    """`url` without its password, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def owners(ranges: Sequence[ShardRange], shards: int) -> list[str]:
    """The server URL of each shard (index = shard number); raises on a gap or overlap."""
    out: list[str | None] = [None] * shards
    for r in ranges:
        if not 0 <= r.lo <= r.hi < shards:
            raise ValueError(f"shard range {r.lo}-{r.hi} outside 0-{shards - 1}")
        for i in range(r.lo, r.hi + 1):
            if out[i] is not None:
                raise ValueError(f"shard {i} is mapped twice")
            out[i] = r.url
    missing = [i for i, u in enumerate(out) if u is None]
    if missing:
        raise ValueError(f"shards {missing} are on no server")
    return [u for u in out if u is not None]


def ranges_of(owner: Sequence[str]) -> list[ShardRange]:
    """The contiguous ranges of a per-shard owner list (the inverse of `owners`)."""
    out: list[ShardRange] = []
    for i, url in enumerate(owner):
        if out and out[-1].url == url and out[-1].hi == i - 1:
            out[-1] = ShardRange(out[-1].lo, i, url)
        else:
            out.append(ShardRange(i, i, url))
    return out
