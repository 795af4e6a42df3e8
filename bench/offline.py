"""`imgw bench offline`: users receive while offline, then log in and catch up.

`--receivers` users each have a peer who, while they are offline, sends them
`--messages` messages (acked, so durable). Then every receiver logs in at once and
catches up as docs/protocol.md says a client must: SYNC (every page), then PULL each
conversation whose max_seq is above what it holds, page by page. Measured per receiver:
login to fully caught up. Checked: every message arrives exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench.common import hist_of, log, ms, new_hist, record_us
from bench.loadclient import LoadConnection, connect
from bench.run import Run
from protocol.frames import OpenP2P, Pull, PullResult, Push, Sync, SyncResult
from protocol.token import sign_token

PAGE = 200
RETRIES = 10
SYNC_ROUNDS = 5
DEVICE = "b"


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


async def _offline(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    n, m = args.receivers, args.messages
    uid0 = 3_000_000_000 + int(time.time()) % 1_000_000 * 1000
    exp = int(time.time()) + 86_400
    sink = _Quiet()
    sem = asyncio.Semaphore(200)

    async def login(uid: int) -> LoadConnection:
        token = sign_token(run.kid, run.secret, uid, DEVICE, exp)
        async with sem:
            return await connect(run.host, run.port, uid, sink, token=token, device=DEVICE,
                                 timeout=30)  # fmt: skip

    senders = await asyncio.gather(*(login(uid0 + 2 * i) for i in range(n)))
    convs: list[int] = []
    for i, s in enumerate(senders):
        reply = await s.request(OpenP2P, uid0 + 2 * i + 1, timeout=30)
        convs.append(reply.conv_id)  # type: ignore[attr-defined]
    log(f"{n} senders send {m} messages each to {n} offline receivers")
    t = time.monotonic()
    # Message j = k * n + i: sender i's k-th. Sent all at once, as fast as they go; the
    # ones refused `unavailable` (the gateway sheds a burst past max_pending_sends) are
    # sent again with the same client_msg_id after a backoff, as a client must.
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
    log(f"{sink.acked} acked in {send_s:.1f} s (refused on the way: {sink.errors or 'none'})")
    for s in senders:
        s.close()

    hist = new_hist()
    got: list[tuple[int, int]] = []  # per receiver: (messages, distinct seqs)
    online: list[LoadConnection] = []

    async def catch_up(i: int) -> None:
        start = time.monotonic_ns()
        conn = await login(uid0 + 2 * i + 1)
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
        online.append(conn)

    log(f"{n} receivers log in and catch up")
    t = time.monotonic()
    run.sample(force=True)
    await asyncio.gather(*(catch_up(i) for i in range(n)))
    wall = time.monotonic() - t
    run.sample(force=True)
    catch_up_cpu = run.sampler.cpu_seconds("gateway", t, time.monotonic())
    sync_cpu_us = await _sync_rounds(run, online)
    for conn in online:
        conn.close()
    pulled = sum(g[0] for g in got)
    h = hist_of([hist.encode()])
    return {
        "receivers": n,
        "messages_per_receiver": m,
        "acked": sink.acked,
        "errors": n * m - sink.acked,  # sends never acked, even after the retries
        "refused_then_retried": sink.errors,  # refusals on the way, by kind
        "send_s": round(send_s, 2),
        "catch_up_wall_s": round(wall, 2),
        "catch_up_p50_ms": ms(h, 50),
        "catch_up_p99_ms": ms(h, 99),
        "catch_up_max_ms": ms(h),
        "messages_pulled": pulled,
        "gateway_cpu_us_per_catch_up": round(1e6 * catch_up_cpu / n, 1)
        if catch_up_cpu is not None and n
        else None,
        "gateway_cpu_us_per_sync": sync_cpu_us,
        "pulled_per_s": round(pulled / wall, 1) if wall > 0 else None,
        "missing": sum(max(0, m - g[1]) for g in got),
        "duplicates": sum(g[0] - g[1] for g in got),
        "connections_target": 2 * n,
        "connections_held": 2 * n,
        "drops": 0,
    }


async def _sync_rounds(run: Run, conns: list[LoadConnection]) -> float | None:
    """The gateway's CPU per SYNC: every caught-up receiver asks SYNC_ROUNDS first pages
    (its conversations with unread counts), all at once, round after round."""
    if not conns:
        return None
    t = time.monotonic()
    run.sample(force=True)
    for _ in range(SYNC_ROUNDS):
        await asyncio.gather(*(c.request(Sync, 0, 0, PAGE, timeout=60) for c in conns))
    run.sample(force=True)
    cpu = run.sampler.cpu_seconds("gateway", t, time.monotonic())
    return None if cpu is None else round(1e6 * cpu / (SYNC_ROUNDS * len(conns)), 1)


def run_offline(args: argparse.Namespace, run: Run) -> dict[str, Any]:
    import uvloop

    result: dict[str, Any] = uvloop.run(_offline(args, run))
    run.sample(force=True)
    result["gateway_rss_bytes"] = run.sampler.latest_rss("gateway")
    return result
