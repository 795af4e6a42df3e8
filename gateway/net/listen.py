"""The client port's listening socket, bound before the backends are opened.

A gateway that starts takes a second or two to open its store, route store and bus.
Bound only after that, its port refuses every connection in the meantime: after a crash
of a node with 100,000 clients, thousands of them are refused, back off (several seconds
by the time they have been refused a few times) and come back last. Bound first, with
the backends opened after, the kernel completes their handshakes into the listen backlog
and the gateway takes them as soon as it is ready, in arrival order.

Only for the first start of a node or of a supervisor's workers: a worker the supervisor
starts again while the others serve binds when it is ready, after its backends, so
that the kernel keeps sending new connections to the workers that serve them.
"""

from __future__ import annotations

import socket
from typing import Final

# Per socket; Linux caps it at net.core.somaxconn. A deeper queue (65,535 with the sysctl
# raised) was measured in a 100,000-client storm: no handshake dropped, and no faster
# (docs/decisions.md, "The client port is bound before the backends are opened").
BACKLOG: Final = 4096


def bind_listener(host: str, port: int, *, reuse_port: bool, backlog: int) -> socket.socket | None:
    """A non-blocking TCP socket listening on `host`:`port` (with SO_REUSEADDR, and
    SO_REUSEPORT when asked), as `loop.create_server` would bind it. None when `host`
    names several addresses: create_server binds them all when the node is ready."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    addrs = {(family, addr) for family, _, _, _, addr in infos}
    if len(addrs) != 1:
        return None
    family, addr = addrs.pop()
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
