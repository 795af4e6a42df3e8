"""Which addresses a load machine sends to: an agent loads only the gateways its
`--allow` rules name (bench.agent), and a gateway on loopback takes the agents'
loopback source addresses, another their own (bench.remote)."""

from __future__ import annotations

import ipaddress
import socket


def allowed(host: str, allow: list[str]) -> bool:
    """Whether `host` (an address or a name) is one the agent may load: inside one of
    the `allow` networks, or equal to one of its host names."""
    if host in allow:
        return True
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    for rule in allow:
        try:
            net = ipaddress.ip_network(rule, strict=False)
        except ValueError:
            continue
        if addresses and all(ipaddress.ip_address(str(a).split("%")[0]) in net for a in addresses):
            return True
    return False


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one."""
    try:
        return all(
            ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback
            for info in socket.getaddrinfo(host, None)
        )
    except (OSError, ValueError):
        return False
