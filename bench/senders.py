"""Generator processes of `imgw bench chat|group` (the driver side is bench.send).

Each process logs in its share of the users (one lean `LoadConnection` each), opens
one conversation per unit (a p2p pair or a group) and, per step, runs ONE pacing timer
(every ~1 ms) that writes every send whose intended time has come: the schedule never
waits for replies, so a slow gateway shows up as latency, not as a lower offered rate.
Latency is measured from the intended send time (coordinated-omission safe) to the
SEND_ACK and to the PUSH at each other member, into HdrHistograms that are reset when
the warmup ends and sent to the driver, which merges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any, Final

from bench.common import new_hist, proc_rss, record_us, run_generator
from bench.loadclient import LoadConnection, connect, stamp_of, stamped_content
from protocol.frames import Push, PushRegister
from protocol.token import sign_token

DEVICE: Final = "bench"
PING_EVERY_S: Final = 20.0  # keeps quiet connections under the gateway's idle timeout
PROGRESS_EVERY_S: Final = 1.0
TICK_S: Final = 0.001
PUSH_GRACE_S: Final = 2.0  # after the last ACK, how long to wait for missing PUSHes


@dataclass(frozen=True)
class WorkerSpec:
    """What one generator process needs; picklable (spawn)."""

    idx: int
    host: str
    port: int
    kid: str
    secret: str
    uid0: int  # unit u of this process is users uid0 + g*u + 1 .. uid0 + g*u + g
    pairs: int  # units: p2p pairs (group_size 2) or groups
    group_size: int
    run_id: str
    content_size: int
    connect_concurrency: int
    deadline_ns: int  # monotonic: give up after this
    ws_path: str | None = None  # WebSocket on this path, else the plain protocol
    # Before logging in, each uid registers this device for push and leaves it offline.
    push_device: str | None = None


@dataclass(frozen=True)
class StepSpec:
    """One measured step, as a generator process runs it; times are monotonic ns."""

    index: int
    rate: float  # this process's share
    start_ns: int
    win_start_ns: int
    win_end_ns: int
    drain_s: float


class StepRecorder:
    """Counts and histograms of one step in one process; the `LoadSink` of every
    connection. Before the window opens it records the warmup (for the live progress
    line); when the window opens, everything is reset and only sends intended inside
    the window count."""

    def __init__(self, step: StepSpec, run_prefix: str) -> None:
        self.step = step
        self.run_prefix = run_prefix
        self.since_ns = step.start_ns  # sends intended before this are ignored
        self.in_window = False
        self.ack_hist = new_hist()
        self.push_hist = new_hist()
        self.lag_hist = new_hist()  # pacing lag of the oldest due send per tick
        self.sent = 0
        self.acked = 0
        self.pushes = 0
        self.errors: dict[str, int] = {}
        self.kicks: dict[str, int] = {}
        self.acks_in_window_time = 0
        # Totals since the step began (warmup too), for the progress line.
        self.total_sent = 0
        self.total_acked = 0
        self.total_errors = 0

    def open_window(self) -> None:
        self.in_window = True
        self.since_ns = self.step.win_start_ns
        self.ack_hist.reset()
        self.push_hist.reset()
        self.lag_hist.reset()
        self.sent = self.acked = self.pushes = 0
        self.errors = {}

    @property
    def window_pending(self) -> int:
        return self.sent - self.acked - sum(self.errors.values())

    # LoadSink -----------------------------------------------------------------------

    def on_ack(self, intended_ns: int, now_ns: int) -> None:
        self.total_acked += 1
        step = self.step
        if step.win_start_ns <= now_ns < step.win_end_ns:
            self.acks_in_window_time += 1
        if intended_ns >= self.since_ns:
            self.acked += 1
            record_us(self.ack_hist, now_ns - intended_ns)

    def on_error(self, intended_ns: int, reason: str) -> None:
        self.total_errors += 1
        if intended_ns >= self.since_ns:
            self.errors[reason] = self.errors.get(reason, 0) + 1

    def on_push(self, push: Push, now_ns: int) -> None:
        if not push.client_msg_id.startswith(self.run_prefix):
            return  # not one of this step's messages
        intended = stamp_of(push.content)
        if intended is not None and intended >= self.since_ns:
            self.pushes += 1
            record_us(self.push_hist, now_ns - intended)

    def on_kick(self, reason: str) -> None:
        self.kicks[reason] = self.kicks.get(reason, 0) + 1


class Generator:
    """The connections of one process and the pacing timer that drives them."""

    def __init__(self, spec: WorkerSpec, out: Any) -> None:
        self.spec = spec
        self.out = out  # multiprocessing queue to the driver
        self.loop = asyncio.get_running_loop()
        self.conns: list[LoadConnection] = []  # 2 per pair: [a0, b0, a1, b1, ...]
        self.convs: list[int] = []
        self.padding = b"x" * max(0, spec.content_size - 8)
        self.recorder: StepRecorder | None = None
        self._last_ping = time.monotonic()

    def remaining_s(self) -> float:
        return max(0.1, (self.spec.deadline_ns - time.monotonic_ns()) / 1e9)

    async def setup(self) -> None:
        spec = self.spec
        exp = int(time.time()) + 7 * 86_400
        sem = asyncio.Semaphore(spec.connect_concurrency)
        placeholder = StepRecorder(StepSpec(-1, 0, 0, 0, 0, 0), "")
        g = spec.group_size
        uids = [spec.uid0 + i + 1 for i in range(g * spec.pairs)]

        async def one(uid: int) -> LoadConnection:
            token = sign_token(spec.kid, spec.secret, uid, DEVICE, exp)
            async with sem:
                for attempt in range(5):
                    try:
                        return await connect(
                            spec.host, spec.port, uid, placeholder,
                            token=token, device=DEVICE, timeout=min(30.0, self.remaining_s()),
                            ws_path=spec.ws_path,
                        )  # fmt: skip
                    except OSError:
                        if attempt == 4:
                            raise
                        await asyncio.sleep(0.2 * (attempt + 1))
            raise AssertionError("unreachable")

        if spec.push_device is not None:
            await asyncio.gather(*(self.register(u, spec.push_device, sem, exp) for u in uids))
        self.conns = list(await asyncio.gather(*(one(u) for u in uids)))

        async def open_pair(p: int) -> int:
            async with sem:
                members = self.conns[g * p : g * p + g]
                timeout = min(30.0, self.remaining_s())
                if g == 2:
                    return await members[0].open_p2p(members[1].uid, timeout=timeout)
                uids = [c.uid for c in members]
                return await members[0].group_create("bench", uids, timeout=timeout)

        self.convs = list(await asyncio.gather(*(open_pair(p) for p in range(spec.pairs))))

    async def register(self, uid: int, device: str, sem: asyncio.Semaphore, exp: int) -> None:
        """Register (`uid`, `device`) for push over a connection of its own, then close
        it: the device stays registered and offline, so every message to `uid` owes it
        a push event."""
        spec = self.spec
        token = sign_token(spec.kid, spec.secret, uid, device, exp)
        placeholder = StepRecorder(StepSpec(-1, 0, 0, 0, 0, 0), "")
        async with sem:
            conn = await connect(
                spec.host, spec.port, uid, placeholder, token=token, device=device,
                timeout=min(30.0, self.remaining_s()), ws_path=spec.ws_path,
            )  # fmt: skip
            try:
                push_token = f"{spec.run_id}-{uid}"
                await conn.request(PushRegister, "bench", push_token, timeout=30.0)
            finally:
                conn.close()

    async def run_step(self, step: StepSpec) -> dict[str, Any]:
        spec = self.spec
        prefix = f"{spec.run_id}.{step.index}.{spec.idx}."
        rec = self.recorder = StepRecorder(step, prefix)
        for c in self.conns:
            c.sink = rec
        interval = 1e9 / step.rate
        # Send k is intended at start + k * interval; the last is before the window ends.
        k_end = math.ceil((step.win_end_ns - step.start_ns) / interval)
        n, g = spec.pairs, spec.group_size
        conns, convs, padding = self.conns, self.convs, self.padding
        done = self.loop.create_future()
        state = {"k": 0}
        cpu_at_window: list[float] = []

        def tick() -> None:
            now = time.monotonic_ns()
            if not rec.in_window and now >= step.win_start_ns:
                rec.open_window()
                cpu_at_window.append(time.process_time())
            k = state["k"]
            due = min(k_end, int((now - step.start_ns) / interval) + 1)
            if k < due:
                record_us(rec.lag_hist, now - (step.start_ns + int(k * interval)))
            while k < due:
                intended = step.start_ns + int(k * interval)
                pair = k % n
                sender = conns[g * pair + (k // n) % g]
                sender.send(
                    convs[pair], f"{prefix}{k}", stamped_content(intended, padding), intended
                )
                if intended >= rec.since_ns:  # not a warmup send of the tick that opened it
                    rec.sent += 1
                rec.total_sent += 1
                k += 1
            state["k"] = k
            if k >= k_end and now >= step.win_end_ns:
                if not done.done():
                    done.set_result(None)
                return
            self.loop.call_later(TICK_S, tick)

        async def progress() -> None:
            last = (0, 0, time.monotonic())
            while True:
                await asyncio.sleep(PROGRESS_EVERY_S)
                mono = time.monotonic()
                dt = max(1e-3, mono - last[2])
                phase = "drain" if done.done() else "measure" if rec.in_window else "warmup"
                self.out.put(
                    ("progress", spec.idx, step.index, phase,
                     (rec.total_sent - last[0]) / dt, (rec.total_acked - last[1]) / dt,
                     rec.total_errors, rec.total_sent - rec.total_acked - rec.total_errors,
                     rec.ack_hist.encode())
                )  # fmt: skip
                last = (rec.total_sent, rec.total_acked, mono)
                if mono - self._last_ping >= PING_EVERY_S:
                    self._last_ping = mono
                    for c in conns:
                        c.ping()

        reporter = self.loop.create_task(progress())
        try:
            await asyncio.sleep(max(0.0, (step.start_ns - time.monotonic_ns()) / 1e9))
            tick()
            await asyncio.wait_for(done, self.remaining_s())
            cpu_end = time.process_time()
            # Drain: in-window sends get --drain seconds for their ACK; PUSHes a little more.
            # A bounded poll: an Event would cost a wakeup check on every ACK.
            drain_until = time.monotonic() + min(step.drain_s, self.remaining_s())
            while rec.window_pending > 0 and time.monotonic() < drain_until:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            push_until = min(drain_until, time.monotonic() + PUSH_GRACE_S)
            while rec.pushes < rec.acked * (g - 1) and time.monotonic() < push_until:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        undrained = rec.window_pending
        if undrained > 0:
            rec.errors["timeout"] = rec.errors.get("timeout", 0) + undrained
        # Late replies to timed-out sends must not count in the next step.
        for c in conns:
            c.pending.clear()
        window_s = (step.win_end_ns - step.win_start_ns) / 1e9
        cpu_s = cpu_end - cpu_at_window[0] if cpu_at_window else 0.0
        return {
            "sent": rec.sent,
            "acked": rec.acked,
            "total_acked": rec.total_acked,  # warmup too
            "pushes": rec.pushes,
            "errors": rec.errors,
            "kicks": rec.kicks,
            "acks_in_window_time": rec.acks_in_window_time,
            "ack_hist": rec.ack_hist.encode(),
            "push_hist": rec.push_hist.encode(),
            "lag_hist": rec.lag_hist.encode(),
            "cpu_percent": 100.0 * cpu_s / window_s if window_s > 0 else 0.0,
            "closed_conns": sum(1 for c in conns if c.closed),
            "rss": proc_rss() or 0,
        }

    def close(self) -> None:
        for c in self.conns:
            c.close()


async def _worker(spec: WorkerSpec, ctrl: Any, out: Any) -> None:
    gen = Generator(spec, out)
    try:
        await gen.setup()
        out.put(("ready", spec.idx))
        while True:
            timeout = gen.remaining_s()
            ready = await gen.loop.run_in_executor(None, ctrl.poll, timeout)
            if not ready:
                raise TimeoutError("no command from the driver before the deadline")
            cmd = ctrl.recv()
            if cmd[0] == "stop":
                break
            result = await gen.run_step(cmd[1])
            out.put(("result", spec.idx, cmd[1].index, result))
    finally:
        gen.close()
        await asyncio.sleep(0.2)  # let the FINs go out


def worker_main(spec: WorkerSpec, ctrl: Any, out: Any) -> None:
    run_generator(spec.idx, _worker(spec, ctrl, out), out)
