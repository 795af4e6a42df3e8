"""The open-file limit, and the connections it leaves room for.

Every client connection is a file descriptor. A process that runs out of them cannot
accept (the kernel completes the handshakes, the accept fails with EMFILE, and clients
see their connections reset), and worse, cannot open a store, cache or bus connection
or answer on the admin port. So a worker raises its soft limit to the hard one at start
and never admits more connections than the limit minus `FD_RESERVE`: past that, new
clients are refused at once (closed before LOGIN) while everything else keeps working.
"""

from __future__ import annotations

import contextlib
import resource
from typing import Final

# Descriptors kept for everything but clients: the MySQL pool, the Redis pool (64 by
# default), the bus, the listeners and the admin port, logs, with room to spare. A quarter
# of the limit when that is less, but at least MIN_RESERVE (a small limit still admits
# clients, and still leaves the process what it needs to run).
FD_RESERVE: Final = 512
MIN_RESERVE: Final = 64
# Targets tried when the hard limit is "unlimited" (the kernel's nr_open, or macOS's
# OPEN_MAX, is lower than the first).
_UNLIMITED_TARGETS: Final = (1 << 20, 1 << 16, 10240)


def raise_nofile() -> int:
    """Raise the soft open-file limit to the hard limit (children inherit it); returns
    the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    targets = _UNLIMITED_TARGETS if hard == resource.RLIM_INFINITY else (hard,)
    for target in targets:
        if soft >= target:
            break
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            break
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connection_cap(configured: int, nofile: int, reserve: int = FD_RESERVE) -> int:
    """The connections one process may hold: `configured`, unless the open-file limit
    leaves room for fewer."""
    return max(0, min(configured, nofile - min(reserve, max(MIN_RESERVE, nofile // 4))))
