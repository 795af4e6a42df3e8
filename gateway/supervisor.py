"""`imgw serve --workers N`: N worker processes under a supervisor.

Each worker is a whole gateway node (its own node id, push queue, send batcher and
leased snowflake worker id) listening on the same port with SO_REUSEPORT, so the kernel
spreads new connections over them. On its own start the supervisor binds each worker's
socket before anything else and hands it over at the fork, so that connections made
while the workers open their backends wait in the backlogs instead of being refused
(gateway/net/listen.py); it keeps no copy. Otherwise it holds no sockets and no backends; it
forks the workers, restarts one that exits while the supervisor is not stopping (after a
crash with exponential backoff; after a clean exit, such as an `imgw drain` of that one
worker, at once: a rolling restart), and on SIGTERM or SIGINT forwards SIGTERM to every
worker, waits for all of them to drain, and exits 0.

The workers are forked, not executed: each gets its configuration, secrets included, in
memory, never on a command line of its own, and shows the supervisor's, whose secrets
`imgw serve` masked before anything else (gateway.cli.cmdline).

A worker that keeps dying within `FAST_FAIL_S` of its start (bad config, a backend that
is down) while no other worker has been up that long is given up on after
`MAX_FAST_FAILS` tries: the supervisor stops the others and exits 1, so that the service
manager sees the failure. While other workers serve, it is retried every BACKOFF_CAP_S.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import time
from dataclasses import dataclass
from typing import Final

import structlog

from gateway.config import Config
from gateway.logs import configure
from gateway.net.listen import BACKLOG, bind_listener

_STOP_SIGNALS: Final = {signal.SIGTERM, signal.SIGINT}
FAST_FAIL_S: Final = 10.0
MAX_FAST_FAILS: Final = 5
BACKOFF_CAP_S: Final = 10.0
POLL_S: Final = 0.1


@dataclass
class _Slot:
    index: int
    pid: int = 0
    started: float = 0.0
    fast_fails: int = 0
    restart_at: float = 0.0  # when pid == 0: the time to start it again


def worker_config(config: Config, index: int) -> Config:
    """The configuration of worker `index`: one process, its own node id and admin port."""
    return dataclasses.replace(
        config,
        workers=1,
        node_id=f"{config.node_id}-w{index}" if config.node_id else "",
        admin_port=config.admin_port + index if config.admin_port else 0,
    )


def drain_grace_s(config: Config) -> float:
    """How long a drain of `config`'s workers may take before stragglers get SIGKILL:
    every connection a worker may hold at the drain rate, then the in-flight requests.
    A service manager's stop timeout (systemd TimeoutStopSec=, compose
    stop_grace_period) should be longer (deploy/ is checked against it)."""
    per_worker = config.max_connections / max(1, config.workers)
    kicks = per_worker / config.drain_rate if config.drain_rate else 0
    return 2 * config.shutdown_timeout + 30 + kicks


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.slots = [_Slot(i) for i in range(config.workers)]
        self.stopping = False
        self.failed = False
        self.log = structlog.get_logger("imgw.supervisor").bind(pid=os.getpid())
        # Each worker's socket for its first start, bound before anything else (`run`).
        self.listeners: dict[int, socket.socket] = {}

    def bind_listeners(self) -> None:
        cfg = self.config
        for slot in self.slots:
            sock = bind_listener(cfg.host, cfg.port, reuse_port=True, backlog=BACKLOG)
            if sock is None:
                return  # several addresses: each worker binds them when it is ready
            self.listeners[slot.index] = sock

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop_signal)
        self.log.info("supervisor starting workers", workers=len(self.slots))
        _import_worker(self.config)
        for slot in self.slots:
            self._spawn(slot)
        stop_deadline = 0.0
        grace = drain_grace_s(self.config)
        while True:
            self._reap()
            now = time.monotonic()
            if self.stopping:
                if not stop_deadline:
                    stop_deadline = now + grace
                if not any(s.pid for s in self.slots):
                    break
                if now > stop_deadline:
                    self._signal_all(signal.SIGKILL)
            else:
                for slot in self.slots:
                    if not slot.pid and now >= slot.restart_at:
                        self._spawn(slot)
            time.sleep(POLL_S)
        self.log.info("supervisor stopped", failed=self.failed)
        return 1 if self.failed else 0

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        if not self.stopping:
            self.log.info("draining all workers", signal=signal.Signals(signum).name)
        self.stopping = True
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, sig: int) -> None:
        for slot in self.slots:
            if slot.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, sig)

    def close_listeners(self) -> None:
        for sock in self.listeners.values():
            sock.close()
        self.listeners.clear()

    def _spawn(self, slot: _Slot) -> None:
        cfg = worker_config(self.config, slot.index)
        listener = self.listeners.pop(slot.index, None)  # its first start only
        # A SIGTERM must neither be lost between fork() and recording the pid (the new
        # worker would miss the drain) nor run the supervisor's handler in the child.
        parent = os.getpid()
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                for sig in _STOP_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                _die_with_parent(parent)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
                # the other workers' sockets are theirs alone: a copy here would keep
                # one open (its backlog filling) after its worker died
                self.close_listeners()
                from gateway.server import run

                code = run(cfg, reuse_port=True, listener=listener)
            finally:
                os._exit(code)
        if listener is not None:
            listener.close()  # the worker's now
        slot.pid, slot.started = pid, time.monotonic()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # a pending one runs now
        self.log.info("worker started", worker=slot.index, worker_pid=pid)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = next((s for s in self.slots if s.pid == pid), None)
            if slot is not None:
                self._exited(slot, status)

    def _service_up(self) -> bool:
        """Some worker has run longer than FAST_FAIL_S: the service works, so a worker
        that keeps failing (its broker link, say) is retried rather than the whole
        service taken down."""
        now = time.monotonic()
        return any(s.pid and now - s.started >= FAST_FAIL_S for s in self.slots)

    def _exited(self, slot: _Slot, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        lived = time.monotonic() - slot.started
        slot.pid = 0
        if self.stopping:
            self.log.info("worker stopped", worker=slot.index, exit=code)
            if code not in (0, -signal.SIGTERM):  # SIGTERM before its handler was set
                self.failed = True
            return
        if code == 0:
            self.log.info("worker exited cleanly; starting it again", worker=slot.index)
            slot.fast_fails, slot.restart_at = 0, 0.0
            return
        slot.fast_fails = slot.fast_fails + 1 if lived < FAST_FAIL_S else 1
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        if slot.fast_fails > MAX_FAST_FAILS and not self._service_up():
            self.log.error(
                "worker keeps failing at start; giving up (see its log above)",
                worker=slot.index,
                tries=slot.fast_fails,
                last=how,
            )
            self.failed = True
            self.stopping = True
            self._signal_all(signal.SIGTERM)
            return
        delay = min(BACKOFF_CAP_S, 0.5 * 2 ** (slot.fast_fails - 1))
        slot.restart_at = time.monotonic() + delay
        self.log.warning(
            "worker died; restarting", worker=slot.index, how=how, lived_s=round(lived, 1),
            restart_in_s=delay,
        )  # fmt: skip


def supervise(config: Config) -> int:
    configure(config.log_format, config.log_level)
    supervisor = Supervisor(config)
    try:
        supervisor.bind_listeners()  # first: the imports below take a second or two
    except OSError as e:
        supervisor.log.error("cannot listen", host=config.host, port=config.port, error=str(e))
        supervisor.close_listeners()
        return 1
    _preload()
    return supervisor.run()


def _preload() -> None:
    """Import what every worker runs before forking them: the code is then shared
    copy-on-write instead of loaded again by each (tens of MB per worker)."""
    import importlib

    for name in ("gateway.server", "storage.mysql", "storage.redis", "storage.amqp",
                 "storage.mysql_redis", "gateway.handlers"):  # fmt: skip
        importlib.import_module(name)


def _die_with_parent(parent: int) -> None:
    """Linux: SIGTERM this worker (a drain) when the supervisor dies, so that a killed
    supervisor leaves no worker holding the port behind a new one."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the supervisor died before prctl
        os.kill(os.getpid(), signal.SIGTERM)


def _import_worker(config: Config) -> None:
    """What every worker runs, imported once here before the forks rather than by each
    worker after its own (tests/unit/test_supervisor_imports.py: importing starts no
    thread, which a fork would lose)."""
    import gateway.server  # noqa: F401
    from storage.factory import import_backends

    import_backends(config.store_url(), config.cache, config.bus)
