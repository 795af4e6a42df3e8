"""The bench samples the CPU of the MariaDB and Redis serving the gateway under test:
with a second server of the same program on the machine (a second MariaDB, a Redis
Cluster), it must find the one listening on the store's port."""

from __future__ import annotations

import os
import socket

from bench.common import find_pid


def _comm() -> str:
    with open("/proc/self/comm") as f:
        return f.read().strip()


def test_the_process_listening_on_the_port_is_found() -> None:
    with socket.socket() as listening, socket.socket() as other:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        other.bind(("127.0.0.1", 0))  # bound, not listening
        assert find_pid(_comm(), port=listening.getsockname()[1]) == os.getpid()
        assert find_pid(_comm(), port=other.getsockname()[1]) is None


def test_without_a_port_the_name_decides() -> None:
    assert find_pid("no-such-program-here") is None
    assert find_pid(_comm()) is not None
