"""`HOST:PORT` strings, checked once for every command that takes one."""

from __future__ import annotations

from typing import TypeAlias

Address: TypeAlias = tuple[str, int]


def split_host_port(spec: str, *, default_host: str = "", any_port: bool = False) -> Address:
    """``"host:port"`` or ``"[v6]:port"`` as (host, port); ValueError says what is wrong.
    An empty host is `default_host` when one is given, else an error. `any_port`: port 0
    (a free port, for a listener) is allowed."""
    host, sep, port = spec.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]") or default_host
    lowest = 0 if any_port else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) < 65536:
        raise ValueError(f"bad address {spec!r}: expected HOST:PORT, e.g. 127.0.0.1:7070")
    return host, int(port)
