"""Data lifecycle figures: pruning and the archive against the send path.

    python -m bench.probes.lifecycle prune-ab --rows 400000 --rate 2000 --duration 20
    python -m bench.probes.lifecycle archive --rates 2000,5000,none --rows 60000
    python -m bench.probes.lifecycle history --pages 200

`prune-ab`: one gateway on MariaDB + Redis (a fresh database, dropped afterwards);
rounds of two sides, alternating: `off` loads `--rows` idempotency records 49 h old into
`im_send_dedup` and runs `imgw bench chat --addr` on the gateway; `on` loads the same
rows and runs the same bench with `imgw db prune` deleting them meanwhile (the very
batches the gateway's lease holder runs: `MySQLStore.prune`, 500 rows, 5 % duty).

`archive`: fills a fresh database with `--rows` messages, then for each `--rates` value
runs `imgw archive run --older-than 30m --rate R` (to a file:// directory; the
preloaded messages are up to 20 h old, the bench's own are left hot) while
`imgw bench chat --addr` sends on the gateway: archive rows/s against the rate limit,
and the send p99 beside it (and once with no archive run, the baseline).

`history`: a HISTORY page of 50 messages, `--pages` times, from the hot store and then
from the archive (the same conversation's pages after `imgw archive run --older-than
0s`), straight through the store (no gateway): p50/p99 of each.

Results go to `--json` (one file per subcommand), with what loaded the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench.common import Gateway, GatewaySpec, log

MYSQL: Final = "mysql://root:@127.0.0.1:3306/"
REDIS: Final = "redis://127.0.0.1:6379/0"
HOUR_MS: Final = 3_600_000


def _imgw(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", *args]


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _top_cpu() -> list[str]:
    """The busiest processes now (what else loads the shared machine)."""
    out = subprocess.run(
        ["ps", "-eo", "pcpu,comm", "--sort=-pcpu"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    return [line.strip() for line in out[1:9]]


def _gateway(extra: list[str] | None = None) -> tuple[Gateway, Path]:
    """A gateway on a fresh MariaDB database and Redis prefix (not started yet). The
    bench holds the prune lease, so the gateway itself never prunes: the A/B decides
    when pruning runs."""
    workdir = Path(tempfile.mkdtemp(prefix="imgw-lifecycle-"))
    spec = GatewaySpec(store=MYSQL, cache=REDIS, workers=1, shards=16, extra=extra or [])
    gw = Gateway(spec, workdir, "bench", os.urandom(8).hex())
    gw.check_services()
    gw.migrate(120)
    asyncio.run(_sql(gw.store, "INSERT INTO im_lease (name, owner, expires_ms) VALUES "
                     "('prune', 'bench', 9000000000000)"))  # fmt: skip
    return gw, workdir


async def _sql(url: str, *statements: str) -> None:
    import aiomysql

    from storage.mysql import MySQLSettings

    s = MySQLSettings.from_url(url)
    conn = await aiomysql.connect(
        host=s.host, port=s.port, user=s.user, password=s.password, db=s.database,
        autocommit=True,
    )  # fmt: skip
    try:
        async with conn.cursor() as cur:
            for stmt in statements:
                await cur.execute(stmt)
    finally:
        conn.close()


def _chat(gw: Gateway, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """`imgw bench chat --addr` on `gw`; its result's figures."""
    cmd = _imgw(
        "bench", "chat", "--addr", f"{gw.host}:{gw.port}", "--token-key",
        f"{gw.kid}:{gw.secret}", "--rate", str(args.rate), "--duration", str(args.duration),
        "--warmup", str(args.warmup), "--json", str(out), "--no-charts",
        *[x for p in gw.pids() for x in ("--gateway-pid", str(p))],
    )  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    if not out.exists():
        raise RuntimeError(f"imgw bench chat failed: {done.stderr[-2000:]}")
    r = json.loads(out.read_text())
    keys = ("acked_per_s", "ack_p50_ms", "ack_p99_ms", "ack_max_ms", "errors",
            "gateway_cpu_percent", "mariadb_cpu_percent", "host_cpu_busy_percent")  # fmt: skip
    return {k: r.get(k) for k in keys}


async def _load_dedup(url: str, rows: int) -> float:
    """Empty im_send_dedup and load `rows` records 49 h old; seconds it took."""
    import aiomysql

    from storage.mysql import MySQLSettings

    s = MySQLSettings.from_url(url)
    t0 = time.monotonic()
    conn = await aiomysql.connect(
        host=s.host, port=s.port, user=s.user, password=s.password, db=s.database,
        autocommit=True,
    )  # fmt: skip
    try:
        old = int(time.time() * 1000) - 49 * HOUR_MS
        async with conn.cursor() as cur:
            await cur.execute("TRUNCATE im_send_dedup")
            step = 5_000
            for lo in range(0, rows, step):
                values = ",".join(
                    f"({900_000_000 + i % 1000},'old-{i}',{1 + i % 5000},{i + 1},{old + i % 1000})"
                    for i in range(lo, min(rows, lo + step))
                )
                await cur.execute(
                    "INSERT INTO im_send_dedup (sender_uid, client_msg_id, conv_id, seq, "
                    "created_ms) VALUES " + values
                )
    finally:
        conn.close()
    return time.monotonic() - t0


def prune_ab(args: argparse.Namespace) -> dict[str, Any]:
    gw, workdir = _gateway()
    sides: list[dict[str, Any]] = []
    try:
        gw.start(60)
        for rnd in range(args.rounds):
            for side in ("off", "on"):
                load_s = asyncio.run(_load_dedup(gw.store, args.rows))
                log(f"round {rnd + 1} {side}: {args.rows:,} old rows loaded in {load_s:.1f} s")
                prune = None
                if side == "on":
                    prune = subprocess.Popen(
                        _imgw("db", "prune", "--store", gw.store, "--batch", str(args.batch),
                              "--duty", str(args.duty)),
                        stdout=subprocess.PIPE, text=True,
                    )  # fmt: skip
                t0 = time.monotonic()
                fig = _chat(gw, args, workdir / f"chat-{rnd}-{side}.json")
                fig.update(side=side, round=rnd + 1, loadavg=_loadavg())
                if prune is not None:
                    out, _ = prune.communicate(timeout=900)
                    fig["prune_s"] = round(time.monotonic() - t0, 1)
                    fig["prune_output"] = out.strip()
                log(f"  {fig}")
                sides.append(fig)
    finally:
        gw.stop(60)
        gw.cleanup()

    def med(side: str, key: str) -> float:
        return statistics.median(float(s[key]) for s in sides if s["side"] == side)

    p99 = {side: med(side, "ack_p99_ms") for side in ("off", "on")}
    return {
        "scenario": "prune-ab", "rows": args.rows, "rate": args.rate,
        "prune_batch": args.batch, "prune_duty": args.duty,
        "duration_s": args.duration, "runs": sides,
        "median_p99_ms": p99, "p99_ratio_on_off": round(p99["on"] / p99["off"], 3),
        "median_p50_ms": {side: med(side, "ack_p50_ms") for side in ("off", "on")},
    }  # fmt: skip


def _archived_rows(url: str) -> int:
    done = subprocess.run(
        _imgw("archive", "status", "--json", "--store", url),
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return int(json.loads(done.stdout)["archive"]["rows"])


def archive(args: argparse.Namespace) -> dict[str, Any]:
    """Send p99 with `imgw archive run` moving messages meanwhile, at each --rates."""
    from bench.preload import Volume, preload

    gw, workdir = _gateway()
    steps: list[dict[str, Any]] = []
    try:
        vol = Volume.of(args.rows, max(1, args.rows // args.per_conv))
        t0 = time.monotonic()
        preload(gw.store, vol, log=log)
        log(f"preloaded {args.rows:,} messages in {time.monotonic() - t0:.0f} s")
        gw.start(60)
        to = (workdir / "arch").as_uri()
        for rnd in range(args.rounds):
            for rate in ["off", *args.rates.split(",")]:
                proc = None
                before = _archived_rows(gw.store)
                if rate != "off":
                    cmd = _imgw("archive", "run", "--store", gw.store, "--older-than", "30m",
                                "--to", to)  # fmt: skip
                    if rate != "none":
                        cmd += ["--rate", rate]
                    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
                t0 = time.monotonic()
                fig = _chat(gw, args, workdir / f"chat-{rnd}-{rate}.json")
                elapsed = time.monotonic() - t0
                if proc is not None:
                    still = proc.poll() is None
                    proc.kill()  # kill -9 safe: what it committed stays archived
                    proc.wait()
                    rows = _archived_rows(gw.store) - before
                    fig.update(archived_rows=rows, archive_s=round(elapsed, 1),
                               archive_rows_per_s=round(rows / elapsed),
                               archive_ran_whole_window=still)  # fmt: skip
                fig.update(archive_rate=rate, round=rnd + 1, loadavg=_loadavg())
                log(f"  {fig}")
                steps.append(fig)
    finally:
        gw.stop(60)
        gw.cleanup()

    def med(rate: str, key: str) -> float | None:
        vals = [float(s[key]) for s in steps if s["archive_rate"] == rate and key in s]
        return statistics.median(vals) if vals else None

    rates = ["off", *args.rates.split(",")]
    base = med("off", "ack_p99_ms") or 1.0
    return {
        "scenario": "archive", "rows": args.rows, "per_conv": args.per_conv,
        "chat_rate": args.rate, "duration_s": args.duration, "runs": steps,
        "median": {
            r: {"archive_rows_per_s": med(r, "archive_rows_per_s"),
                "ack_p99_ms": med(r, "ack_p99_ms"), "ack_p50_ms": med(r, "ack_p50_ms"),
                "p99_ratio_to_off": round((med(r, "ack_p99_ms") or 0) / base, 3)}
            for r in rates
        },
    }  # fmt: skip


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


async def _history(args: argparse.Namespace, url: str, workdir: Path) -> dict[str, Any]:
    import random

    from bench.preload import Volume
    from storage.archive.index_mysql import MySQLIndex
    from storage.archive.run import archive_run
    from storage.mysql import MySQLSettings, MySQLStore

    vol = Volume.of(args.rows, max(1, args.rows // args.per_conv))
    settings = MySQLSettings.from_url(url)
    rng = random.Random(1)
    queries = []
    for _ in range(args.pages):
        conv = rng.randrange(1, vol.conversations + 1)
        queries.append((conv, rng.randrange(51, vol.max_seq(conv) + 2)))

    async def pages(store: MySQLStore) -> list[float]:
        out = []
        for conv, before in queries:
            t0 = time.perf_counter()
            msgs, _ = await store.read_before(conv, before, 50, min_seq=0, max_seq=None)
            out.append((time.perf_counter() - t0) * 1000)
            assert len(msgs) == 50, (conv, before, len(msgs))
        return out

    result: dict[str, Any] = {}
    store = MySQLStore(settings)
    await store.start()
    try:
        await pages(store)  # warm the pool and the buffer pool
        hot = await pages(store)
        index = MySQLIndex(settings, clock=store.now_ms)
        await index.open()
        try:
            t0 = time.monotonic()
            report = await archive_run(index, (workdir / "arch").as_uri(), older_than_ms=0)
            result["archive_unlimited_rows_per_s"] = round(report.rows / (time.monotonic() - t0))
            result["archived_rows"] = report.rows
            result["archive_files"] = report.files
        finally:
            await index.close()
        cold_first = await pages(store)  # files not yet in the page cache
        cold = await pages(store)
    finally:
        await store.close()
    for name, xs in (("hot", hot), ("archive_first_read", cold_first), ("archive", cold)):
        result[name] = {"p50_ms": _pct(xs, 0.5), "p99_ms": _pct(xs, 0.99), "pages": len(xs)}
    result["p50_ratio_archive_hot"] = round(
        result["archive"]["p50_ms"] / result["hot"]["p50_ms"], 1
    )
    result["p99_ratio_archive_hot"] = round(
        result["archive"]["p99_ms"] / result["hot"]["p99_ms"], 1
    )
    return result


def history(args: argparse.Namespace) -> dict[str, Any]:
    """HISTORY pages (read_before, 50 messages) from the hot store, then the archive."""
    from bench.preload import Volume, preload

    gw, workdir = _gateway()
    try:
        preload(gw.store, Volume.of(args.rows, max(1, args.rows // args.per_conv)), log=log)
        result = asyncio.run(_history(args, gw.store, workdir))
    finally:
        gw.cleanup()
    return {"scenario": "history", "rows": args.rows, "per_conv": args.per_conv,
            "page": 50, **result}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.lifecycle", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    sub = parser.add_subparsers(dest="what", metavar="FIGURE", required=True)
    ab = sub.add_parser("prune-ab", help="send p99 with im_send_dedup pruned meanwhile, or not")
    ab.add_argument("--rows", type=int, default=400_000, help="old dedup rows each side (400000)")
    ab.add_argument("--rounds", type=int, default=2, help="off/on pairs (2)")
    ab.add_argument("--batch", type=int, default=500, help="imgw db prune --batch (500)")
    ab.add_argument("--duty", type=float, default=0.05, help="imgw db prune --duty (0.05)")
    ar = sub.add_parser("archive", help="archive rows/s against --rate, send p99 meanwhile")
    ar.add_argument("--rows", type=int, default=300_000, help="messages preloaded (300000)")
    ar.add_argument("--per-conv", type=int, default=1000, help="messages a conversation (1000)")
    ar.add_argument(
        "--rates", default="1000,5000,none", help="archive --rate values, none: no limit"
    )
    ar.add_argument("--rounds", type=int, default=1, help="rounds over the rates (1)")
    hi = sub.add_parser("history", help="HISTORY page p50/p99: hot store against archive")
    hi.add_argument("--rows", type=int, default=50_000, help="messages preloaded (50000)")
    hi.add_argument("--per-conv", type=int, default=1000, help="messages a conversation (1000)")
    hi.add_argument("--pages", type=int, default=300, help="pages read each way (300)")
    hi.add_argument("--json", type=Path, required=True, help="result file")
    for p in (ab, ar):
        p.add_argument("--rate", type=float, default=2000, help="chat msg/s (2000)")
        p.add_argument("--duration", type=float, default=20, help="measured s per run (20)")
        p.add_argument("--warmup", type=float, default=3, help="unmeasured s first (3)")
        p.add_argument("--json", type=Path, required=True, help="result file")
    args = parser.parse_args(argv)
    started = time.time()
    before = {"loadavg": _loadavg(), "top": _top_cpu()}
    result = {"prune-ab": prune_ab, "archive": archive, "history": history}[args.what](args)
    result["machine"] = {
        "before": before, "after": {"loadavg": _loadavg(), "top": _top_cpu()},
        "cores": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                          time.gmtime(started)),
    }  # fmt: skip
    result["command"] = ["python", "-m", "bench.probes.lifecycle", *(argv or sys.argv[1:])]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "machine")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
