"""An `imgw serve` subprocess: the one way the bench (bench.common.Gateway,
bench.probes.idle_rss) and the tests (tests/support/proc.py and the fixtures built on it) start
a gateway. Its output goes to a log file; it is ready once its port accepts (and an
optional check agrees); it is stopped with SIGTERM, killed if it does not exit.

Standard library only: tests import it without the bench's own dependencies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from protocol.codec import encode
from protocol.frames import Ping

_PR_SET_PDEATHSIG: Final = 1  # prctl(2)


class ServeError(RuntimeError):
    """The gateway exited, or did not listen in time; the message holds its log's tail."""


def serve_command(*args: str) -> list[str]:
    """`imgw serve ARGS` in this interpreter, whichever checkout is on its path."""
    return [sys.executable, "-m", "gateway.cli", "serve", *args]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


_PROBE = encode(Ping())  # before LOGIN: answered ERROR not_logged_in, then closed


def serving(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a gateway serves on `host`:`port`: it answers (or closes) a connection
    that sends PING before LOGIN. An open port proves nothing: a node binds it before it
    opens its backends (gateway/net/listen.py), and connections wait in the backlog meanwhile.
    A TLS port answers the plaintext with an alert or a close, which counts too."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(_PROBE)
            s.recv(1)  # ERROR not_logged_in, or EOF
            return True
    except ConnectionResetError:
        return True  # closed on us: someone is serving
    except OSError:  # refused, or nothing came back in time (TimeoutError is one)
        return False


class ServeProcess:
    """`imgw serve ARGS` on `host:port` (ARGS must make it listen there)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        port: int,
        log_path: Path,
        host: str = "127.0.0.1",
        nofile: int | None = None,
        new_session: bool = False,
        die_with_parent: bool = False,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.args = list(args)
        # settings passed as IMGW_* variables: secrets there stay out of `ps`
        self.env = dict(env or {})
        self.host, self.port = host, port
        self.log_path = log_path
        self.nofile = nofile  # the child's open-file limit (soft and hard)
        self.new_session = new_session  # its own session: a ^C here does not reach it
        # SIGTERM when this process dies, even killed with SIGKILL (Linux): a gateway in a
        # session of its own would outlive a killed bench otherwise
        self.die_with_parent = die_with_parent
        self._prctl: Callable[..., int] | None = None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float, ready: Callable[[], bool] | None = None) -> None:
        """Start it and wait until it serves (`serving`) and `ready()` (if given) is
        true."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # looked up here: the child, forked from a process with threads, only calls it
        self._prctl = (
            ctypes.CDLL(None, use_errno=True).prctl
            if self.die_with_parent and sys.platform.startswith("linux")
            else None
        )
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                serve_command(*self.args), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=self.new_session, cwd=self.cwd,
                env={**os.environ, **self.env} if self.env else None,
                preexec_fn=self._child_setup if self.nofile or self.die_with_parent else None,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise ServeError(
                    f"gateway exited with status {self.proc.returncode}:\n{self.log_tail()}"
                )
            if serving(self.host, self.port) and (ready is None or ready()):
                return
            if time.monotonic() > deadline:
                raise ServeError(
                    f"gateway did not listen on {self.host}:{self.port} in {timeout:g} s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)  # polling a port that has no event to await

    def _child_setup(self) -> None:
        """In the child, before it runs `imgw serve`: its open-file limit, and the
        signal it gets when its parent dies."""
        if self.nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        if self._prctl is not None:
            self._prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None, "not started"
        return self.proc.wait(timeout)

    def stop(self, timeout: float) -> int:
        """SIGTERM, then SIGKILL if it has not exited after `timeout` s; its exit status."""
        assert self.proc is not None, "not started"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL (a crash) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(30)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no gateway log)"
