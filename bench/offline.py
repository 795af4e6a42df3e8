"""`imgw bench offline`: users receive while offline, then log in and catch up.

`--receivers` users each have a peer who, while they are offline, sends them
`--messages` messages (acked, so durable). Then every receiver logs in at once and
catches up as docs/protocol.md says a client must: SYNC (every page), then PULL each
conversation whose max_seq is above what it holds, page by page. Measured per receiver:
login to fully caught up. Checked: every message arrives exactly once.

A run is three phases (`PHASES`): the sends, the catch-up, and SYNC rounds of the
caught-up receivers. An `OfflineShare` is one machine's part of them: here every
receiver, or with `--agents N` a disjoint uid range on each agent (bench.agent), which
runs each phase when the controller starts it on all of them at once (bench.remote).
The parts' figures merge into one result (`merge`), their latency histograms exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from bench.common import BenchError, hist_of, log, ms, new_hist, record_us
from bench.loadclient import LoadConnection, connect
from bench.run import Run
from protocol.frames import OpenP2P, Pull, PullResult, Push, Sync, SyncResult
from protocol.token import sign_token

PAGE = 200
RETRIES = 10
SYNC_ROUNDS = 5
DEVICE = "b"
PHASES: Final = ("send", "catch_up", "sync")
T = TypeVar("T")


class _Quiet:
    """A LoadSink that counts the replies of one round of sends and keeps the sends
    refused with `unavailable` (their intended_ns is their index), to send again."""

    def __init__(self) -> None:
        self.acked = 0
        self.errors: dict[str, int] = {}
        self.retry: list[int] = []
        self.done = asyncio.Event()
        self.expected = 0
        self.replies = 0

    def start_round(self, expected: int) -> None:
        self.expected, self.replies, self.retry = expected, 0, []
        self.done.clear()

    def _reply(self) -> None:
        self.replies += 1
        if self.replies >= self.expected:
            self.done.set()

    def on_ack(self, intended_ns: int, now_ns: int) -> None:
        self.acked += 1
        self._reply()

    def on_error(self, intended_ns: int, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1
        if reason == "unavailable":  # the protocol's "retry later with the same id"
            self.retry.append(intended_ns)
        self._reply()

    def on_push(self, push: Push, now_ns: int) -> None:
        pass

    def on_kick(self, reason: str) -> None:
        pass


@dataclass(frozen=True)
class OfflineShare:
    """One machine's part of a run: `receivers` receivers (uids uid0 + 2i + 1) and their
    senders (uid0 + 2i), `messages` each, on the gateway at host:port."""

    host: str
    port: int
    kid: str
    secret: str
    uid0: int
    receivers: int
    messages: int


class OfflinePart:
    """The phases of one `OfflineShare`, run in order on one event loop; each returns
    what `merge` takes (JSON-safe: an agent reports it as it is)."""

    def __init__(self, share: OfflineShare) -> None:
        self.share = share
        self.exp = int(time.time()) + 86_400
        self.online: list[LoadConnection] = []

    async def run_phase(self, phase: str) -> dict[str, Any]:
        if phase == "send":
            return await self.send()
        if phase == "catch_up":
            return await self.catch_up()
        if phase == "sync":
            return await self.sync_rounds()
        raise BenchError(f"no phase {phase!r} in an offline run")

    async def login(self, uid: int, sink: _Quiet, sem: asyncio.Semaphore) -> LoadConnection:
        s = self.share
        token = sign_token(s.kid, s.secret, uid, DEVICE, self.exp)
        async with sem:
            return await connect(s.host, s.port, uid, sink, token=token, device=DEVICE,
                                 timeout=30)  # fmt: skip

    async def send(self) -> dict[str, Any]:
        s = self.share
        n, m = s.receivers, s.messages
        sink, sem = _Quiet(), asyncio.Semaphore(200)
        senders = await asyncio.gather(*(self.login(s.uid0 + 2 * i, sink, sem) for i in range(n)))
        convs: list[int] = []
        for i, conn in enumerate(senders):
            reply = await conn.request(OpenP2P, s.uid0 + 2 * i + 1, timeout=30)
            convs.append(reply.conv_id)  # type: ignore[attr-defined]
        t = time.monotonic()
        # Message j = k * n + i: sender i's k-th. Sent all at once, as fast as they go;
        # the ones refused `unavailable` (the gateway sheds a burst past
        # max_pending_sends) are sent again with the same client_msg_id after a
        # backoff, as a client must.
        todo = list(range(n * m))
        for attempt in range(RETRIES + 1):
            sink.start_round(len(todo))
            for j in todo:
                k, i = divmod(j, n)
                senders[i].send(convs[i], f"off.{i}.{k}", f"m{k}".encode(), j)
                if i == n - 1:
                    await asyncio.sleep(0)
            await asyncio.wait_for(sink.done.wait(), timeout=max(60.0, n * m / 500))
            todo = sorted(sink.retry)
            if not todo or attempt == RETRIES:
                break
            log(f"{len(todo)} sends refused `unavailable`; sending them again")
            await asyncio.sleep(0.2 * (attempt + 1))
        send_s = time.monotonic() - t
        for conn in senders:
            conn.close()
        return {"acked": sink.acked, "refused": sink.errors, "send_s": send_s}

    async def catch_up(self) -> dict[str, Any]:
        s = self.share
        sink, sem = _Quiet(), asyncio.Semaphore(200)
        hist = new_hist()
        got: list[tuple[int, int]] = []  # per receiver: (messages, distinct seqs)

        async def one(i: int) -> None:
            start = time.monotonic_ns()
            conn = await self.login(s.uid0 + 2 * i + 1, sink, sem)
            since: Any = 0
            cursor: Any = 0
            wanted: list[tuple[int, int]] = []
            while True:
                page = await conn.request(Sync, since, cursor, PAGE, timeout=60)
                assert isinstance(page, SyncResult)
                wanted += [(c.conv_id, c.max_seq) for c in page.convs if c.max_seq > 0]
                if not page.has_more:
                    break
                since, cursor = page.next_since, page.next_cursor
            seqs: list[int] = []
            for conv, _ in wanted:
                after = 0
                while True:
                    res = await conn.request(Pull, conv, after, PAGE, timeout=60)
                    assert isinstance(res, PullResult)
                    seqs += [r.seq for r in res.msgs]
                    if res.msgs:
                        after = res.msgs[-1].seq
                    if not res.has_more:
                        break
            record_us(hist, time.monotonic_ns() - start)
            got.append((len(seqs), len(set(seqs))))
            self.online.append(conn)

        started = time.time()
        await asyncio.gather(*(one(i) for i in range(s.receivers)))
        return {
            "started": started,
            "ended": time.time(),
            "hist": hist.encode().decode("ascii"),
            "pulled": sum(g[0] for g in got),
            "missing": sum(max(0, s.messages - g[1]) for g in got),
            "duplicates": sum(g[0] - g[1] for g in got),
        }

    async def sync_rounds(self) -> dict[str, Any]:
        """Every caught-up receiver asks SYNC_ROUNDS first pages (its conversations with
        unread counts), all at once, round after round."""
        for _ in range(SYNC_ROUNDS):
            await asyncio.gather(*(c.request(Sync, 0, 0, PAGE, timeout=60) for c in self.online))
        return {"syncs": SYNC_ROUNDS * len(self.online)}

    def close(self) -> None:
        for conn in self.online:
            conn.close()
        self.online = []


def uid0_of_run() -> int:
    return 3_000_000_000 + int(time.time()) % 1_000_000 * 1000


def merge(
    n: int,
    m: int,
    sends: list[dict[str, Any]],
    catch_ups: list[dict[str, Any]],
    catch_up_cpu: float | None,
    sync_cpu: float | None,
    syncs: int,
) -> dict[str, Any]:
    """The result of a run from its parts' phases (one part here, one per agent)."""
    acked = sum(int(p["acked"]) for p in sends)
    refused = _refusals(sends)
    wall = max(float(p["ended"]) for p in catch_ups) - min(float(p["started"]) for p in catch_ups)
    pulled = sum(int(p["pulled"]) for p in catch_ups)
    h = hist_of([str(p["hist"]).encode("ascii") for p in catch_ups])
    return {
        "receivers": n,
        "messages_per_receiver": m,
        "acked": acked,
        "errors": n * m - acked,  # sends never acked, even after the retries
        "refused_then_retried": refused,  # refusals on the way, by kind
        "send_s": round(max(float(p["send_s"]) for p in sends), 2),
        "catch_up_wall_s": round(wall, 2),
        "catch_up_p50_ms": ms(h, 50),
        "catch_up_p99_ms": ms(h, 99),
        "catch_up_max_ms": ms(h),
        "messages_pulled": pulled,
        "gateway_cpu_us_per_catch_up": round(1e6 * catch_up_cpu / n, 1)
        if catch_up_cpu is not None and n
        else None,
        "gateway_cpu_us_per_sync": round(1e6 * sync_cpu / syncs, 1)
        if sync_cpu is not None and syncs
        else None,
        "pulled_per_s": round(pulled / wall, 1) if wall > 0 else None,
        "missing": sum(int(p["missing"]) for p in catch_ups),
        "duplicates": sum(int(p["duplicates"]) for p in catch_ups),
        "connections_target": 2 * n,
        "connections_held": 2 * n,
        "drops": 0,
    }


def _refusals(sends: list[dict[str, Any]]) -> dict[str, int]:
    """The sends refused on the way (then sent again), by kind, over every part."""
    refused: dict[str, int] = {}
    for p in sends:
        for k, v in p["refused"].items():
            refused[k] = refused.get(k, 0) + int(v)
    return refused


def _sent_line(n: int, m: int, sends: list[dict[str, Any]]) -> str:
    acked = sum(int(p["acked"]) for p in sends)
    refused = _refusals(sends)
    took = max(float(p["send_s"]) for p in sends)
    return f"{acked} of {n * m} acked in {took:.1f} s (refused on the way: {refused or 'none'})"


def _with_cpu(run: Run, go: Callable[[], T]) -> tuple[T, float | None]:
    """What `go()` returns, and the gateway's CPU seconds while it ran (None: not
    sampled)."""
    t = time.monotonic()
    run.sample(force=True)
    out = go()
    run.sample(force=True)
    return out, run.sampler.cpu_seconds("gateway", t, time.monotonic())


async def _here(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    n, m = args.receivers, args.messages
    part = OfflinePart(OfflineShare(run.host, run.port, run.kid, run.secret, uid0_of_run(), n, m))
    log(f"{n} senders send {m} messages each to {n} offline receivers")
    sent = await part.send()
    log(_sent_line(n, m, [sent]))
    log(f"{n} receivers log in and catch up")
    t = time.monotonic()
    run.sample(force=True)
    caught = await part.catch_up()
    run.sample(force=True)
    catch_up_cpu = run.sampler.cpu_seconds("gateway", t, time.monotonic())
    t = time.monotonic()
    run.sample(force=True)
    synced = await part.sync_rounds()
    run.sample(force=True)
    sync_cpu = run.sampler.cpu_seconds("gateway", t, time.monotonic())
    part.close()
    return merge(n, m, [sent], [caught], catch_up_cpu, sync_cpu, int(synced["syncs"]))


def _on_agents(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    from bench.remote import RemoteOffline

    n, m = args.receivers, args.messages
    ctl = RemoteOffline(args.coordinator, args.agents, args.agents_wait)
    try:
        ctl.start(run.host, run.port, run.kid, run.secret, uid0_of_run(), n, m, args.timeout)
        log(f"{n} senders on {args.agents} agents send {m} messages each to {n} offline "
            "receivers")  # fmt: skip
        sends = ctl.phase("send")
        log(_sent_line(n, m, sends))
        log(f"{n} receivers on {args.agents} agents log in and catch up")
        caught, catch_up_cpu = _with_cpu(run, lambda: ctl.phase("catch_up"))
        synced, sync_cpu = _with_cpu(run, lambda: ctl.phase("sync"))
    finally:
        ctl.stop()
    result = merge(n, m, sends, caught, catch_up_cpu, sync_cpu,
                   sum(int(p["syncs"]) for p in synced))  # fmt: skip
    result["agents"] = ctl.results()
    return result


def run_offline(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    if getattr(args, "agents", 0):
        result = _on_agents(args, run)
    else:
        import uvloop

        result = uvloop.run(_here(args, run))
    run.sample(force=True)
    result["gateway_rss_bytes"] = run.sampler.latest_rss("gateway")
    return result
