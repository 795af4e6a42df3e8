"""Gateways as real processes, for restarts, kills and signals."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.wire import TOKEN_KEY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayProcess:
    def __init__(
        self, data_dir: Path, port: int | None = None, *extra: str, nofile: int | None = None
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.extra = extra
        self.nofile = nofile  # the child's open-file limit (soft and hard)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"gateway-{self.port}.log"

    def start(self, timeout: float = 15.0) -> GatewayProcess:
        cmd = [
            sys.executable, "-m", "gateway.cli", "serve", "--port", str(self.port),
            "--data-dir", str(self.data_dir), "--token-key", TOKEN_KEY, "--node-id", "proc",
            *self.extra,
        ]  # fmt: skip
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=self._limits
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"gateway did not listen on {self.port}: {self.log.read_text()}")

    def _limits(self) -> None:
        if self.nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait: the exit status."""
        self.signal(signal.SIGTERM)
        return self.wait()
