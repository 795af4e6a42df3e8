"""What every bench scenario shares: logging, latency histograms, /proc sampling of the
gateway under test, and that gateway itself (spawned on a fresh backend, or attached to
by pid)."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from hdrh.histogram import HdrHistogram

from bench.serve import ServeError, ServeProcess, free_port
from gateway.redact import redact_url

if TYPE_CHECKING:
    from bench.preload import Volume

HIST_MIN_US: Final = 1
HIST_MAX_US: Final = 60_000_000
HIST_DIGITS: Final = 3
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
PAGE: Final = os.sysconf("SC_PAGE_SIZE")
START_HOW: Final = {
    3306: "start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid "
    "--exec /usr/sbin/mariadbd",
    6379: 'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
    5672: "rabbitmq-server -detached",
}


class BenchError(Exception):
    """The run cannot go on; the message says why and what to do."""


_NAME = ["bench"]


def set_log_name(name: str) -> None:
    _NAME[0] = name


def log(msg: str) -> None:
    print(f"[{_NAME[0]} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def deadline_alarm(seconds: float, why: str) -> Iterator[None]:
    """Raise TimeoutError(why) in the main thread after `seconds` (SIGALRM): the backstop
    of a run whose every wait is bounded by its own deadline."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(why)

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(max(1, math.ceil(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_generator(idx: int, main: Coroutine[Any, Any, None], out: Any) -> None:
    """The body of a generator process: ^C is the driver's, the open-file limit is
    raised, `main` runs on uvloop, and a failure is reported to the driver as
    ("error", idx, text) before the process exits 1."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from gateway.net.openfiles import raise_nofile

    raise_nofile()
    import uvloop

    from gateway.gctune import quiet_gc

    quiet_gc()  # a collection in a generator is latency it would wrongly blame on the gateway
    try:
        uvloop.run(main)
    except BaseException as e:
        out.put(("error", idx, f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from None


# -- latency histograms ----------------------------------------------------------------


def new_hist() -> HdrHistogram:
    return HdrHistogram(HIST_MIN_US, HIST_MAX_US, HIST_DIGITS)


def record_us(hist: HdrHistogram, ns: int) -> None:
    hist.record_value(min(max(ns // 1000, HIST_MIN_US), HIST_MAX_US))


def hist_of(encoded: list[bytes]) -> HdrHistogram:
    """Merge histograms encoded by several processes."""
    h = new_hist()
    for e in encoded:
        h.decode_and_add(e)
    return h


def ms(hist: HdrHistogram, pct: float | None = None) -> float:
    if hist.get_total_count() == 0:
        return 0.0
    us = hist.get_max_value() if pct is None else hist.get_value_at_percentile(pct)
    return round(float(us) / 1000.0, 3)


# -- /proc -----------------------------------------------------------------------------


def free_port_range(n: int, host: str = "127.0.0.1") -> int:
    """A base port whose next `n` ports are free, below the kernel's ephemeral range (so
    no outgoing connection takes one of them meanwhile): admin ports of n workers."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(200):
        base = 10_000 + secrets.randbelow(max(1, low - 10_000 - n))
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise BenchError(f"found no {n} consecutive free ports for the admin listeners")


def proc_cpu_split(pid: int) -> tuple[int, int] | None:
    """(utime, stime) of `pid` in clock ticks (user and kernel time), or None if it is
    gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]), int(fields[12])  # fields 14 and 15 of stat(5)


def proc_rss(pid: int | str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


def proc_pss(pid: int) -> int | None:
    """Proportional set size: shared pages (code forked copy-on-write from a supervisor)
    divided among the processes sharing them, so a sum over workers counts them once."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def host_busy_ticks() -> int | None:
    """CPU ticks the machine spent busy (all cores; everything but idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields) - fields[3] - fields[4]


def find_pid(*names: str, port: int | None = None) -> int | None:
    """The first process whose comm is one of `names` (e.g. the local mariadbd); with
    `port`, the one listening on that TCP port (a second MariaDB or a Redis Cluster on
    the same machine has the same comm)."""
    inodes = _listening_inodes(port) if port is not None else None
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() not in names:
                        continue
                if inodes is None or _holds_socket(entry, inodes):
                    return int(entry)
            except OSError:
                continue
    return None


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on TCP `port` (IPv4 and IPv6)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        found.add(inode)
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return found


def _holds_socket(pid: str, inodes: set[str]) -> bool:
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def kernel_memory() -> dict[str, int]:
    """Kernel memory that grows with connections: slab (socket structures) and TCP
    buffer pages, in bytes (both the machine's, whatever the network namespace); and
    `tcp_sockets`, the TCP sockets in use in this process's network namespace."""
    out = {"slab": 0, "tcp_buffers": 0, "tcp_sockets": 0}
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Slab:"):
                out["slab"] = int(line.split()[1]) * 1024
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                parts = line.split()
                out["tcp_buffers"] = int(parts[parts.index("mem") + 1]) * PAGE
                out["tcp_sockets"] = int(parts[parts.index("inuse") + 1])
    return out


def tcp_ext(name: str) -> int | None:
    """A machine-wide TCP counter of /proc/net/netstat (`TcpExt: ...`), e.g.
    ListenOverflows: handshakes dropped because an accept queue was full."""
    try:
        with open("/proc/net/netstat") as f:
            lines = [line.split() for line in f if line.startswith("TcpExt:")]
        names, values = lines[0], lines[1]
        return int(values[names.index(name)])
    except (OSError, IndexError, ValueError):
        return None


def somaxconn() -> int | None:
    """net.core.somaxconn: the kernel's cap on a listen backlog."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def available_memory() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def machine_info() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "memory_available_bytes": available_memory(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


@dataclass
class Sampler:
    """CPU and RSS of groups of processes, at most once a second. A group is a name and
    a callable giving its current pids (a supervisor's workers change as they restart)."""

    groups: dict[str, Callable[[], list[int]]] = field(default_factory=dict)
    # name -> (time, CPU ticks, RSS, processes alive, of the CPU ticks the kernel's)
    samples: dict[str, list[tuple[float, int, int, int, int]]] = field(default_factory=dict)
    last: float = 0.0

    def watch(self, name: str, pids: Callable[[], list[int]]) -> None:
        self.groups[name] = pids

    def sample(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < 1.0:
            return
        self.last = now
        for name, pids_of in self.groups.items():
            ticks = sys_ticks = rss = alive = 0
            for pid in pids_of():
                t, r = proc_cpu_split(pid), proc_rss(pid)
                if t is not None and r is not None:
                    ticks, rss, alive = ticks + t[0] + t[1], rss + r, alive + 1
                    sys_ticks += t[1]
            if alive:
                self.samples.setdefault(name, []).append((now, ticks, rss, alive, sys_ticks))
        busy = host_busy_ticks()
        if busy is not None:  # the whole machine, as group "host" (100 = one core busy)
            self.samples.setdefault("host", []).append((now, busy, 0, 1, 0))

    def between(self, name: str, t0: float, t1: float) -> tuple[float | None, int | None]:
        """(mean CPU %, max RSS) of group `name` over samples taken in [t0, t1]."""
        rows = [s for s in self.samples.get(name, []) if t0 <= s[0] <= t1]
        if len(rows) < 2:
            return None, max((r[2] for r in rows), default=None)
        cpu = 100.0 * (rows[-1][1] - rows[0][1]) / CLK_TCK / (rows[-1][0] - rows[0][0])
        return round(cpu, 1), max(r[2] for r in rows)

    def cpu_seconds(self, name: str, t0: float, t1: float) -> float | None:
        """CPU seconds (user + system) group `name` used between the first and the last
        sample taken in [t0, t1]; None with fewer than two samples there."""
        rows = [s for s in self.samples.get(name, []) if t0 <= s[0] <= t1]
        if len(rows) < 2:
            return None
        return (rows[-1][1] - rows[0][1]) / CLK_TCK

    def cpu_us_per_op(self, name: str, t0: float, t1: float, ops_per_s: float) -> float | None:
        """CPU µs group `name` spent per operation over [t0, t1], given the rate of
        operations in that window: the figure that holds on any machine, where
        throughput on a shared one swings. None without samples or operations."""
        rows = [s for s in self.samples.get(name, []) if t0 <= s[0] <= t1]
        if len(rows) < 2 or ops_per_s <= 0:
            return None
        cpu_s = (rows[-1][1] - rows[0][1]) / CLK_TCK
        wall = rows[-1][0] - rows[0][0]
        return round(1e6 * cpu_s / wall / ops_per_s, 1)

    def kernel_percent(self, name: str, t0: float, t1: float) -> float | None:
        """The share of group `name`'s CPU time over [t0, t1] that was kernel time (system
        calls: socket reads and writes, epoll). On loopback a socket write also runs the
        peer's TCP receive path, so this is where a client's traffic costs the server
        without any code of its own running. None without CPU time in the window."""
        rows = [s for s in self.samples.get(name, []) if t0 <= s[0] <= t1]
        if len(rows) < 2 or rows[-1][1] <= rows[0][1]:
            return None
        return round(100.0 * (rows[-1][4] - rows[0][4]) / (rows[-1][1] - rows[0][1]), 1)

    def latest_rss(self, name: str) -> int | None:
        rows = self.samples.get(name)
        return rows[-1][2] if rows else None

    def max_rss(self, name: str) -> int | None:
        return max((r[2] for r in self.samples.get(name, [])), default=None)


# -- backing services -------------------------------------------------------------------


def require_port(host: str, port: int, name: str) -> None:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as e:
        how = START_HOW.get(port, "")
        raise BenchError(f"{name} is not reachable on {host}:{port} ({e}); start it: {how}") from e


def drop_database(url: str) -> None:
    import pymysql

    parts = urlsplit(url)
    conn = pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        autocommit=True,
        connect_timeout=5,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{parts.path.lstrip('/')}`")
    finally:
        conn.close()


def drop_redis_prefix(url: str) -> int:
    """Delete the keys under the URL's ?prefix= (all of the bench's run); nothing without
    a prefix, so a shared Redis is never wiped."""
    import asyncio

    from storage.redis import redis_from_url

    async def drop() -> int:
        client, prefix = redis_from_url(url, socket_timeout=10)  # a hung Redis fails the step
        try:
            if not prefix:
                return 0
            n = 0
            batch: list[bytes] = []
            async for k in client.scan_iter(match=prefix + "*", count=5000):
                batch.append(k)
                if len(batch) >= 5000:
                    n += await client.delete(*batch)
                    batch = []
            if batch:
                n += await client.delete(*batch)
            return n
        finally:
            await client.aclose()

    return asyncio.run(drop())


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query)))


# -- the gateway under test --------------------------------------------------------------


@dataclass
class GatewaySpec:
    """How to start `imgw serve`. `store`: None for the embedded default; a mysql:// URL
    without a database name gets a fresh database `imgw_bench_<random>` (dropped after
    the run unless keep_data). A redis:// cache without ?prefix= gets a private prefix
    (its keys deleted after the run)."""

    store: str | None = None
    cache: str = "memory://"
    bus: str = "local://"
    workers: int = 1
    shards: int = 16
    servers: list[str] = field(default_factory=list)  # more MySQL servers, host:port
    host: str = "127.0.0.1"  # the address it listens on (and its admin ports)
    port: int = 0
    hb: int = 30
    idle: int = 75
    extra: list[str] = field(default_factory=list)
    keep_data: bool = False
    log_path: Path | None = None
    preload: Volume | None = None  # rows stored before the gateway starts


class Gateway:
    """An `imgw serve` subprocess (a supervisor with workers when workers > 1), stopped
    with SIGTERM; or, with `attach`, processes that are already running."""

    def __init__(self, spec: GatewaySpec, workdir: Path, kid: str, secret: str) -> None:
        self.spec = spec
        self.workdir = workdir
        self.host = spec.host
        self.port = spec.port or free_port(self.host)
        self.admin_port = free_port_range(spec.workers, self.host)
        self.kid, self.secret = kid, secret
        self.log_path = spec.log_path or workdir / "gateway.log"
        self.fresh_db: str | None = None
        self.fresh_cache: str | None = None
        self.store = spec.store or f"sqlite:///{workdir / 'data' / 'imgw.db'}"
        if self.store.startswith("mysql://") and urlsplit(self.store).path in ("", "/"):
            parts = urlsplit(self.store)
            self.store = self.fresh_db = urlunsplit(
                parts._replace(path=f"/imgw_bench_{secrets.token_hex(4)}")
            )
        # The fresh database on every further server: the shard map spreads over them all.
        self.more_servers: list[str] = []
        if spec.servers:
            if not self.fresh_db:
                raise BenchError("--servers needs a fresh database: a --store without one")
            parts = urlsplit(self.fresh_db)
            auth = parts.netloc.rpartition("@")[0]
            self.more_servers = [
                urlunsplit(parts._replace(netloc=f"{auth}@{hp}" if auth else hp))
                for hp in spec.servers
            ]
        if self.store.startswith("mysql://") and "pool" not in self.store and spec.workers > 12:
            # MariaDB's default max_connections is 151: share ~120 among the workers.
            self.store = _with_query(self.store, pool=str(max(1, 120 // spec.workers)))
        self.cache = spec.cache
        if self.cache.startswith("redis") and "prefix" not in dict(
            parse_qsl(urlsplit(self.cache).query)
        ):
            self.cache = self.fresh_cache = _with_query(
                self.cache, prefix=f"imgwbench:{secrets.token_hex(4)}:"
            )
        self.server: ServeProcess | None = None  # once started
        self.exit_code: int | None = None
        self.attached: list[int] = []

    @classmethod
    def attach(cls, pids: list[int]) -> Gateway:
        gw = cls.__new__(cls)
        gw.server, gw.attached, gw.exit_code = None, list(pids), None
        gw.fresh_db = gw.fresh_cache = None
        gw.more_servers = []
        gw.store = gw.cache = ""
        return gw

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The `imgw serve` process, once started (None when attached)."""
        return self.server.proc if self.server is not None else None

    def pids(self) -> list[int]:
        """The gateway's processes: the supervisor and its workers, or the attached."""
        roots = [self.proc.pid] if self.proc is not None else self.attached
        out = []
        for pid in roots:
            out.append(pid)
            out.extend(children_of(pid))
        return out

    def check_services(self) -> None:
        for url, port, name in (
            (self.store, 3306, "MariaDB"), (self.cache, 6379, "Redis"),
            (self.spec.bus, 5672, "RabbitMQ"),
        ):  # fmt: skip
            if url.startswith(("mysql://", "redis://", "amqp://")):
                parts = urlsplit(url)
                require_port(parts.hostname or "127.0.0.1", parts.port or port, name)
        for url in self.more_servers:
            parts = urlsplit(url)
            require_port(parts.hostname or "127.0.0.1", parts.port or 3306, "MariaDB")

    def migrate(self, timeout: float) -> None:
        if not self.store.startswith("mysql://"):
            return  # the embedded store migrates itself
        # the store by environment, the servers without their credentials (migrate takes
        # --store's): no password on a command line
        cmd = [sys.executable, "-m", "gateway.cli", "db", "migrate"]
        cmd += ["--shards", str(self.spec.shards)]
        if self.more_servers:
            urls = [self.store.split("?")[0], *self.more_servers]
            cmd += ["--servers", ",".join(map(_without_credentials, urls))]
        env = {**os.environ, "IMGW_STORE": self.store}
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
        if done.returncode != 0:
            raise BenchError(f"imgw db migrate failed: {done.stderr.strip() or done.stdout}")
        servers = f" over {1 + len(self.more_servers)} servers" if self.more_servers else ""
        db = urlsplit(self.store).path.lstrip("/")
        log(f"database {db} ready ({self.spec.shards} shards{servers})")

    def preload(self) -> dict[str, Any] | None:
        """Store the spec's preload volume (after migrate, before start); its summary."""
        if self.spec.preload is None or not self.spec.preload.messages:
            return None
        from bench.preload import preload

        return preload(self.store, self.spec.preload, log=log)

    def start(self, timeout: float) -> None:
        spec = self.spec
        # URLs and the key by environment: their secrets stay out of `ps`
        env = {"IMGW_STORE": self.store, "IMGW_CACHE": self.cache, "IMGW_BUS": spec.bus,
               "IMGW_TOKEN_KEYS": f"{self.kid}:{self.secret}"}  # fmt: skip
        args = [
            "--host", self.host, "--port", str(self.port),
            "--data-dir", str(self.workdir / "data"),
            "--node-id", f"bench-{secrets.token_hex(2)}", "--log-level", "warning",
            "--admin-port", str(self.admin_port), "--workers", str(spec.workers),
            "--hb", str(spec.hb), "--idle", str(spec.idle),
            *spec.extra,
        ]  # fmt: skip
        # Its own session: a ^C here reaches the driver only, which then stops it; a
        # driver killed outright takes it down too (SIGTERM on its parent's death).
        server = ServeProcess(
            args, host=self.host, port=self.port, log_path=self.log_path, new_session=True,
            die_with_parent=True, env=env,
        )  # fmt: skip
        self.server, self.exit_code = server, None
        want = spec.workers + 1 if spec.workers > 1 else 1
        try:
            server.start(timeout, ready=lambda: len(self.pids()) >= want)
        except ServeError as e:
            raise BenchError(str(e)) from None
        log(
            f"gateway pid {server.pid} ({spec.workers} worker(s)) on {self.host}:{self.port}; "
            f"store {redact_url(self.store)}, cache {redact_url(self.cache)}, "
            f"bus {redact_url(spec.bus)}"
        )

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}/metrics"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return all(proc_rss(p) is not None for p in self.attached)

    def kill(self) -> None:
        """SIGKILL the gateway and its workers (a crash)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.server is not None:
            self.server.kill()
            self.exit_code = self.server.proc.returncode if self.server.proc else None

    def stop(self, timeout: float) -> int | None:
        """SIGTERM (a drain); SIGKILL to all its processes after `timeout` s."""
        server = self.server
        if server is None or server.proc is None or self.exit_code is not None:
            return self.exit_code
        if server.running():
            server.signal(signal.SIGTERM)
            try:
                server.wait(timeout)
            except subprocess.TimeoutExpired:
                log("gateway did not exit after SIGTERM; killing it")
                self.kill()
        self.exit_code = server.proc.returncode
        return self.exit_code

    def cleanup(self) -> None:
        if self.spec.keep_data:
            return
        for db in [self.fresh_db, *self.more_servers] if self.fresh_db else []:
            try:
                drop_database(db)
                log(f"dropped database {urlsplit(db).path.lstrip('/')} on {urlsplit(db).port}")
            except Exception as e:
                log(f"could not drop the bench database: {e}")
        if self.fresh_cache:
            try:
                n = drop_redis_prefix(self.fresh_cache)
                log(f"deleted {n} Redis keys under the bench's prefix")
            except Exception as e:
                log(f"could not delete the bench's Redis keys: {e}")

    def log_tail(self, n: int = 30) -> str:
        if self.server is None:
            return "(no gateway log)"
        return self.server.log_tail(n)
