"""Where a bench controller and its agents meet: Redis, through a few keys.

    imgw bench agent --coordinator redis://host:6379/0        (on each load machine)
    imgw bench connect --agents 3 --coordinator redis://host:6379/0 --addr ...

Every key starts with the URL's `?prefix=` (default `imgwbench:`):

- `agent:<name>`: an agent's registration (JSON: host, pid, cores, state idle or busy,
  run), a 5 s lease renewed each second;
- `inbox:<name>`: the agent's list of messages (work, go, stop), read with BLPOP;
- `ctl:<run>`: the controller's lease on a run, 5 s, renewed each second; agents stop
  when it is gone;
- `report:<run>:<name>`: the agent's latest report (JSON: state, counts, CPU, RSS,
  kernel memory), rewritten each second, kept 60 s;
- `abort:<run>`: set by a controller that gives up (10 min): every agent stops;
- `out:<run>`: what the generator processes of a chat or group run send their driver
  (msgpack), relayed by their agents, read by the controller with BLPOP.

The messages in an inbox are JSON objects with a `kind`: `work` (a run id and the
agent's share: connections to hold, or generator processes to run), `go` (the start
barrier: the controller sends it to every agent once all of them reported `ready`),
`step` (a chat or group step for one of its processes), and `stop`. Times cross between
machines as wall-clock nanoseconds (`to_wall`, `to_monotonic`): the machines' clocks must
agree (NTP); latencies are measured on one machine's monotonic clock and do not depend
on it.
"""

from __future__ import annotations

import json
import time
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

AGENT_LEASE_MS: Final = 5_000
RUN_LEASE_MS: Final = 5_000
REPORT_TTL_MS: Final = 60_000
ABORT_TTL_MS: Final = 600_000
DEFAULT_PREFIX: Final = "imgwbench:"


class Coordinator:
    """A bench controller's or agent's handle on the coordinating Redis."""

    def __init__(self, url: str) -> None:
        import redis

        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"--coordinator {url!r}: use redis://host:port/db[?prefix=...]")
        query = parse_qsl(parts.query, keep_blank_values=True)
        self.prefix = next((v for k, v in query if k == "prefix"), DEFAULT_PREFIX)
        rest = urlencode([(k, v) for k, v in query if k != "prefix"])
        url = urlunsplit(parts._replace(query=rest))
        self._redis = redis.Redis.from_url(
            url, socket_timeout=5.0, socket_connect_timeout=5.0, decode_responses=True
        )
        self._raw = redis.Redis.from_url(url, socket_timeout=10.0, socket_connect_timeout=5.0)

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def ping(self) -> None:
        self._redis.ping()

    def close(self) -> None:
        self._redis.close()
        self._raw.close()

    # -- agents ----------------------------------------------------------------------

    def register(self, name: str, info: dict[str, Any]) -> None:
        """Renew the agent's registration (its lease)."""
        self._redis.set(self.key("agent", name), json.dumps(info), px=AGENT_LEASE_MS)

    def unregister(self, name: str) -> None:
        self._redis.delete(self.key("agent", name), self.key("inbox", name))

    def agents(self) -> dict[str, dict[str, Any]]:
        """The registered agents (their leases alive), by name."""
        keys = sorted(self._redis.scan_iter(match=self.key("agent", "*"), count=1000))
        if not keys:
            return {}
        found: dict[str, dict[str, Any]] = {}
        for key, raw in zip(keys, self._redis.mget(keys), strict=True):
            if raw is not None:
                found[key[len(self.key("agent", "")) :]] = json.loads(raw)
        return found

    def alive(self, names: list[str]) -> dict[str, bool]:
        keys = [self.key("agent", n) for n in names]
        raws = self._redis.mget(keys) if keys else []
        return {n: raw is not None for n, raw in zip(names, raws, strict=True)}

    # -- messages ----------------------------------------------------------------------

    def send(self, name: str, message: dict[str, Any]) -> None:
        self._redis.rpush(self.key("inbox", name), json.dumps(message))

    def receive(self, name: str, timeout_s: float) -> dict[str, Any] | None:
        """The agent's next message, waiting up to `timeout_s` (0: do not wait)."""
        if timeout_s <= 0:
            raw = self._redis.lpop(self.key("inbox", name))
        else:
            got = self._redis.blpop([self.key("inbox", name)], timeout=timeout_s)
            raw = got[1] if got else None
        return json.loads(raw) if raw else None  # type: ignore[arg-type]

    # -- runs ----------------------------------------------------------------------

    def hold_run(self, run: str) -> None:
        """Renew the controller's lease on `run`."""
        self._redis.set(self.key("ctl", run), str(time.time()), px=RUN_LEASE_MS)

    def run_held(self, run: str) -> bool:
        return bool(self._redis.exists(self.key("ctl", run)))

    def end_run(self, run: str) -> None:
        self._redis.delete(self.key("ctl", run))

    def abort(self, run: str, why: str) -> None:
        self._redis.set(self.key("abort", run), why, px=ABORT_TTL_MS)

    def aborted(self, run: str) -> str | None:
        why = self._redis.get(self.key("abort", run))
        return str(why) if why is not None else None

    def report(self, run: str, name: str, data: dict[str, Any]) -> None:
        self._redis.set(self.key("report", run, name), json.dumps(data), px=REPORT_TTL_MS)

    def reports(self, run: str, names: list[str]) -> dict[str, dict[str, Any] | None]:
        keys = [self.key("report", run, n) for n in names]
        raws = self._redis.mget(keys) if keys else []
        return {
            n: (json.loads(raw) if raw is not None else None)
            for n, raw in zip(names, raws, strict=True)
        }

    # -- generator output ----------------------------------------------------------------

    def emit(self, run: str, payloads: list[bytes]) -> None:
        if payloads:
            key = self.key("out", run)
            self._raw.rpush(key, *payloads)
            self._raw.pexpire(key, ABORT_TTL_MS)  # gone if no controller reads it

    def collect(self, run: str, timeout_s: float) -> bytes | None:
        """The next output of the run's generator processes, waiting up to `timeout_s`."""
        got = self._raw.blpop([self.key("out", run)], timeout=max(0.01, timeout_s))
        if not got:
            return None
        raw = got[1]
        return raw if isinstance(raw, bytes) else raw.encode()

    def drop_output(self, run: str) -> None:
        self._raw.delete(self.key("out", run))


def to_wall(monotonic_ns: int) -> int:
    """A time of this machine's monotonic clock as wall-clock ns, to send to another."""
    return monotonic_ns + time.time_ns() - time.monotonic_ns()


def to_monotonic(wall_ns: int) -> int:
    """A wall-clock time from another machine on this machine's monotonic clock."""
    return wall_ns - time.time_ns() + time.monotonic_ns()
