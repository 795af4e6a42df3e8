"""Where the MySQL store is and how it is used: `mysql://` URL options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, unquote, urlsplit

DEFAULT_SHARDS: Final = 16  # message shard tables, fixed at the first migrate


@dataclass(frozen=True, slots=True)
class MySQLSettings:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    database: str = "imgw"
    shards: int = DEFAULT_SHARDS
    pool: int = 10
    timeout_s: float = 5.0  # per operation, then StoreUnavailable
    # A read replica of this server (a mysql:// URL; user and password default to this
    # URL's): PULL and HISTORY pages may come from it (storage/mysql/store.py).
    replica: str = ""

    @classmethod
    def from_url(cls, url: str) -> MySQLSettings:
        """`mysql://user:password@host:port/database?shards=16&pool=10&timeout=5`
        (`&replica=mysql://host:port/database`: a read replica)."""
        parts = urlsplit(url)
        if parts.scheme != "mysql":
            raise ValueError(f"not a mysql:// URL: {url!r}")
        opts = dict(parse_qsl(parts.query))
        database = parts.path.lstrip("/") or "imgw"
        try:
            settings = cls(
                host=parts.hostname or "127.0.0.1",
                port=parts.port or 3306,
                user=unquote(parts.username or "root"),
                password=unquote(parts.password or ""),
                database=database,
                shards=int(opts.pop("shards", DEFAULT_SHARDS)),
                pool=int(opts.pop("pool", 10)),
                timeout_s=float(opts.pop("timeout", 5.0)),
                replica=opts.pop("replica", ""),
            )
        except ValueError as e:
            raise ValueError(f"bad option in {url!r}: {e}") from e
        if opts:
            raise ValueError(f"unknown mysql options {sorted(opts)} in {url!r}")
        if settings.replica and not settings.replica.startswith("mysql://"):
            raise ValueError(f"replica must be a mysql:// URL in {url!r}")
        if not 1 <= settings.shards <= 1024:
            raise ValueError("shards must be 1..1024")
        return settings
