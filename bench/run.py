"""One bench run's context: the gateway under test (spawned or attached), the sampler of
its processes, and the timeline that the charts are drawn from.

`host`:`port` is where the load connects: the gateway's TCP port, or with `--transport
ws` its WebSocket listener (`ws_path` then names the path; None for plain TCP)."""

from __future__ import annotations

import argparse
import functools
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.common import BenchError, Gateway, GatewaySpec, Sampler, find_pid, log
from bench.fleet import FleetView
from bench.serve import free_port
from bench.wsclient import WS_PATH, parse_ws_addr
from gateway.net.hostport import split_host_port


def test_certificate(workdir: Path) -> list[str]:
    """A throwaway CA-signed certificate for 127.0.0.1 in `workdir`; the `imgw serve`
    arguments that use it."""
    try:
        import trustme
    except ImportError as e:
        raise BenchError(
            "--tls with --spawn-gateway makes a test certificate with trustme: "
            "pip install trustme (./scripts/test installs it), or run your own TLS "
            "gateway and pass --addr"
        ) from e
    cert = trustme.CA().issue_cert("127.0.0.1", "localhost")
    chain, key = workdir / "tls-chain.pem", workdir / "tls-key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    return ["--tls-cert", str(chain), "--tls-key", str(key)]


class Run:
    def __init__(self, args: argparse.Namespace, workers: int) -> None:
        self.args = args
        self.sampler = Sampler()
        self.timeline: list[dict[str, Any]] = []
        self.view: FleetView | None = None  # the latest, kept for a run that fails
        self.t0 = time.monotonic()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"imgw-bench-{args.scenario}-"))
        self.gateway: Gateway | None = None
        self.workers = workers
        self.preloaded: dict[str, Any] | None = None
        # What the scenario measured so far: kept in the result when a later part fails.
        self.partial: dict[str, Any] = {}
        self.metrics_url: str | None = args.metrics_url  # the gateway's /metrics, if known
        self.ws_path: str | None = None
        ws = getattr(args, "transport", "tcp") == "ws"
        if args.spawn_gateway:
            self.kid, self.secret = "bench", secrets.token_hex(16)
            extra = list(args.gateway_arg)
            if getattr(args, "tls", False):
                extra += test_certificate(self.workdir)
            if ws:
                ws_port = free_port("127.0.0.1")
                extra += ["--ws-listen", f"127.0.0.1:{ws_port}"]
            spec = GatewaySpec(
                store=args.store, cache=args.cache or "memory://", bus=args.bus or "local://",
                workers=workers, shards=args.shards, hb=args.gateway_hb,
                servers=[h for h in getattr(args, "servers", "").split(",") if h],
                idle=args.gateway_idle, extra=extra, keep_data=args.keep_data,
                preload=getattr(args, "volume", None), port=args.gateway_port,
                host=getattr(args, "gateway_host", "127.0.0.1"), log_path=args.gateway_log,
            )  # fmt: skip
            self.gateway = Gateway(spec, self.workdir, self.kid, self.secret)
            self.host, self.port = self.gateway.host, self.gateway.port
            if ws:
                self.port, self.ws_path = ws_port, WS_PATH
            self.metrics_url = self.gateway.metrics_url
        else:
            if ws:
                self.host, self.port, self.ws_path = parse_ws_addr(args.addr)
            else:
                self.host, self.port = split_host_port(args.addr, default_host="127.0.0.1")
            self.kid, _, self.secret = args.token_key.partition(":")
            if args.gateway_pid:
                self.gateway = Gateway.attach(args.gateway_pid)

    def start(self) -> None:
        gw = self.gateway
        if gw is not None and gw.proc is None and not gw.attached:
            gw.check_services()
            gw.migrate(120)
            self.preloaded = gw.preload()
            gw.start(timeout=120 + 2 * self.workers)
            self.wait_ws_listener()
        if gw is not None:
            self.sampler.watch("gateway", gw.pids)
        elif not self.args.spawn_gateway:
            log("no --gateway-pid: the gateway's memory and CPU are not sampled")
        # A local MariaDB or Redis serves the gateway: sample them too.
        store = gw.store if gw is not None and gw.store else self.args.store or ""
        cache = gw.cache if gw is not None and gw.cache else self.args.cache or ""
        for name, url, default_port, comms in (
            ("mariadb", store, 3306, ("mariadbd", "mysqld")),
            ("redis", cache, 6379, ("redis-server",)),
        ):
            used = url.startswith(("mysql://", "redis://"))
            port = urlsplit(url).port or default_port if used else None
            pid = find_pid(*comms, port=port) if used else None
            if pid is not None:
                self.sampler.watch(name, functools.partial(list, (pid,)))
        self.sample(force=True)

    def wait_ws_listener(self, timeout: float = 30.0) -> None:
        """With WebSocket on a spawned gateway: wait until its WebSocket listener accepts
        (the gateway is ready once its TCP port serves; the two open together)."""
        if self.ws_path is None or self.gateway is None or self.gateway.proc is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"the gateway's WebSocket listener {self.host}:{self.port} did not "
                        f"accept in {timeout:g} s ({e}); does its imgw serve have --ws-listen?"
                    ) from None
            time.sleep(0.05)  # polling a port that has no event to await

    def sample(self, force: bool = False) -> None:
        self.sampler.sample(force)

    def point(self, now: float, view: FleetView) -> dict[str, Any]:
        rows = self.sampler.samples.get("gateway", [])
        return {
            "t": round(now - self.t0, 2),
            "held": view.held,
            "drops": view.drops,
            "errors": view.error_count,
            "gateway_rss_bytes": rows[-1][2] if rows else None,
            "generator_rss_bytes": view.rss,
        }

    def finish(self, status: int) -> dict[str, Any]:
        """Stop what was spawned, clean up; what the result should say about it."""
        out: dict[str, Any] = {}
        if self.view is not None:
            v = self.view
            out["last_view"] = {
                "held": v.held, "logins": v.logins, "drops": v.drops, "errors": v.errors,
                "kicks": v.kicks, "generator_rss_bytes": v.rss,
            }  # fmt: skip
        gw = self.gateway
        if gw is not None:
            out["gateway_pids"] = out.get("gateway_pids") or gw.pids()
            if gw.proc is not None:
                code = gw.stop(timeout=120)
                out["gateway_exit_code"] = code
                if code not in (0, None):
                    log(f"gateway exited with status {code}:\n{gw.log_tail()}")
                gw.cleanup()
                if status == 0:
                    shutil.rmtree(self.workdir, ignore_errors=True)
                else:
                    log(f"gateway log kept: {gw.log_path}")
        return out
