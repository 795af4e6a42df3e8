"""The supervisor imports what its workers run before it forks them (a worker importing
it after its own fork would spend ~0.45 s of CPU each, a second of a restart on 2 cores).
Importing must start no thread: a fork copies only the thread that forks."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_the_supervisor_imports_the_workers_modules_without_starting_a_thread() -> None:
    code = textwrap.dedent(
        """
        import sys, threading
        from gateway.config import Config
        from gateway.supervisor import _import_worker

        _import_worker(Config(store="mysql://root:@127.0.0.1:1/none",
                              cache="redis://127.0.0.1:1/0", bus="amqp://g:g@127.0.0.1:1/"))
        wanted = ["gateway.server", "storage.mysql", "storage.mysql_redis", "asyncmy",
                  "storage.redis.recent", "storage.amqp", "aio_pika"]
        print(threading.active_count(), [m for m in wanted if m not in sys.modules])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split("\n")[0] == "1 []", out.stdout + out.stderr
