"""What building a batch of push events costs, part by part, on the embedded store.

    python -m bench.probes.push_build [--backlog 0,200,500] [--convs 100]

`--convs` p2p conversations, each with one recipient whose only registered device is
offline (as in `imgw bench chat --push-sink`), and before each measurement `--backlog`
messages per conversation that neither member has read, the two taking turns (as in the
bench): the recipient's unread is half of them. Then
`PushStage.build` of a batch of one message per conversation (the hook queue's batch at
2,000 msg/s), and each of its store calls alone, ten times each; the CPU of this process
(event loop and SQLite threads) per event, medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import structlog
import uvloop

from gateway.hooks.push import PushStage
from gateway.hooks.queue import Owed
from storage.embedded import EmbeddedStore
from storage.models import NewMessage, Route

if TYPE_CHECKING:
    from storage.ports import RouteStore

DEVICE = "bench-push"
CONTENT = b"\0" * 8 + b"x" * 56  # the bench's 64 B: a send time, then padding


class NoRoutes:
    """The route store of a batch whose fan-out saw its devices: never asked."""

    async def online(self, uids: Any) -> dict[int, list[Route]]:
        return {}


async def measure(backlog: int, convs: int) -> dict[str, float]:
    store = EmbeddedStore(str(Path(tempfile.mkdtemp(prefix="imgw-push-build-")) / "imgw.db"))
    await store.start()
    try:
        pairs = []
        for i in range(convs):
            sender, recipient = 1000 + 2 * i, 1001 + 2 * i
            pairs.append((await store.open_p2p(sender, recipient), sender, recipient))
            await store.push_register(
                recipient, DEVICE, "bench", f"t{recipient}", preview=False, locale="",
                max_devices=10,
            )  # fmt: skip
        for k in range(backlog):
            await store.append(
                [NewMessage(c, (s, r)[k % 2], f"u{k}", 1, CONTENT) for c, s, r in pairs]
            )  # fmt: skip
        results = await store.append([NewMessage(c, s, "last", 1, CONTENT) for c, s, _ in pairs])
        batch = []
        for res, (_, _, recipient) in zip(results, pairs, strict=True):
            assert res.message is not None
            batch.append(Owed(res.message, list(res.members), frozenset({(recipient, "bench")})))
        routes = cast("RouteStore", NoRoutes())
        stage = PushStage([], store=store, routes=routes, log=structlog.get_logger())
        recipients = [r for _, _, r in pairs]
        devices = await store.push_devices(recipients)
        now = store.now_ms()

        async def events() -> None:
            for o in batch:
                stage._event(o, devices[o.msg.sender_uid + 1], {})

        parts: dict[str, Callable[[], Awaitable[object]]] = {
            "build (all)": lambda: stage.build(batch),
            "push_devices": lambda: store.push_devices(recipients),
            "muted": lambda: store.muted([(c, r) for c, _, r in pairs], now),
            "unread_badges": lambda: store.unread_badges(recipients),
            "event dicts": events,
        }
        cpu: dict[str, list[float]] = {name: [] for name in parts}
        for _ in range(10):
            for name, part in parts.items():
                t = time.process_time()
                await part()
                cpu[name].append(time.process_time() - t)
        return {name: round(1e6 * statistics.median(v) / convs, 1) for name, v in cpu.items()}
    finally:
        await store.close()


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.probes.push_build",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--backlog", default="0,200,500",
        help="messages per conversation that neither member has read (0,200,500)",
    )  # fmt: skip
    p.add_argument("--convs", type=int, default=100, help="conversations, one event each")
    args = p.parse_args()
    for backlog in (int(n) for n in args.backlog.split(",")):
        got = uvloop.run(measure(backlog, args.convs))
        print(
            f"{backlog} messages per conversation unread ({backlog // 2} of them to the "
            "recipient); CPU µs per event: "
            + ", ".join(f"{name} {us:g}" for name, us in got.items())
        )


if __name__ == "__main__":
    main()
