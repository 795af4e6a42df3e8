"""Gateways as real processes, for restarts, kills and signals (on bench.serve, the one
helper that starts `imgw serve` for the bench and the tests)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from bench.serve import ServeProcess, free_port
from tests.support.wire import TOKEN_KEY

__all__ = ["GatewayProcess", "free_port"]


class GatewayProcess:
    def __init__(
        self, data_dir: Path, port: int | None = None, *extra: str, nofile: int | None = None
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.extra = extra
        self.nofile = nofile  # the child's open-file limit (soft and hard)
        self.log = data_dir.parent / f"gateway-{self.port}.log"
        self.server = ServeProcess(
            [
                "--port", str(self.port), "--data-dir", str(data_dir),
                "--token-key", TOKEN_KEY, "--node-id", "proc", *extra,
            ],
            port=self.port, log_path=self.log, nofile=nofile,
        )  # fmt: skip

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.server.proc

    def start(self, timeout: float = 15.0) -> GatewayProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.server.start(timeout)
        return self

    def signal(self, sig: int) -> None:
        self.server.signal(sig)

    def wait(self, timeout: float = 15.0) -> int:
        return self.server.wait(timeout)

    def kill(self) -> None:
        self.server.kill()

    def stop(self) -> int:
        """SIGTERM and wait: the exit status."""
        self.signal(signal.SIGTERM)
        return self.wait()
