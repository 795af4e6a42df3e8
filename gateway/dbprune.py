"""`imgw db prune`: delete the idempotency records past their 48 h, now, in batches.

The gateways do the same about once a minute (on MySQL only the holder of the prune
lease, storage/mysql/lease.py); this command is for a store no gateway runs on, a
backlog to clear at once, or cron. It takes no lease: pruning is idempotent, so running
beside a gateway's prune only shares the work. The store options are `imgw serve`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import time
from typing import Final

from gateway.config import ConfigError, load

SQLITE_BATCH: Final = 2_000


def add_parser(db_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = db_sub.add_parser(
        "prune", help="delete idempotency records older than 48 h now, in batches",
        description="Delete the send idempotency records (im_send_dedup) and the records "
        "of archived sends (im_archive_sent) older than 48 h, in batches of --batch rows "
        "with a pause between them, and print how many went. Gateways do this themselves "
        "about once a minute (on MySQL one node at a time, by lease); this command needs "
        "no lease and can run beside them. The embedded store keeps its idempotency "
        "records in the message rows: only archived sends are pruned there.",
    )  # fmt: skip
    p.add_argument("--config", help="TOML file with settings (keys as the long flags)")
    p.add_argument("--data-dir", help="embedded store directory (as imgw serve)")
    p.add_argument("--store", help="authoritative store URL (default sqlite:///<data-dir>/imgw.db)")
    p.add_argument("--batch", type=int, default=500, help="rows a batch (500)")
    p.add_argument(
        "--pause", type=float, default=0.05, help="seconds between batches, at least (0.05)"
    )
    p.add_argument(
        "--duty", type=float, default=0.05,
        help="the share of the time spent deleting: the pause after a batch is long enough "
        "(0.05, the gateways' setting; 1: only --pause, as fast as the database deletes)",
    )  # fmt: skip
    p.set_defaults(command_parser=p, func=main)


async def _prune_mysql(url: str, batch: int, pause: float, duty: float) -> tuple[int, int, int]:
    from storage.mysql import MySQLSettings, MySQLStore

    store = MySQLStore(MySQLSettings.from_url(url))
    await store.start()
    try:
        report = await store.prune(batch=batch, pause_s=pause, duty=duty, budget_s=None)
    finally:
        await store.close()
    return report.dedup, report.sent, report.batches


def _prune_sqlite(path: str, batch: int, pause: float) -> tuple[int, int, int]:
    from storage.archive.index_sqlite import SENT_KEEP_MS

    conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=5.0)
    try:
        cutoff = int(time.time() * 1000) - SENT_KEEP_MS
        gone = batches = 0
        while True:
            with conn:
                cur = conn.execute(
                    "DELETE FROM im_archive_sent WHERE (sender_uid, client_msg_id) IN "
                    "(SELECT sender_uid, client_msg_id FROM im_archive_sent "
                    "WHERE send_ms < ? LIMIT ?)",
                    (cutoff, batch),
                )
            batches += 1
            gone += cur.rowcount
            if cur.rowcount < batch:
                return 0, gone, batches
            time.sleep(pause)
    finally:
        conn.close()


def main(args: argparse.Namespace) -> int:
    from storage.errors import StoreUnavailable
    from storage.factory import sqlite_path

    if args.batch < 1 or not args.pause >= 0 or not 0 < args.duty <= 1:
        print(
            "imgw db prune: --batch must be >= 1, --pause >= 0, --duty in (0, 1]",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    try:
        url = load(
            {"data_dir": args.data_dir, "store": args.store}, config_file=args.config
        ).store_url()
        if url.startswith("mysql://"):
            dedup, sent, batches = asyncio.run(_prune_mysql(url, args.batch, args.pause, args.duty))
        elif url.startswith("sqlite://"):
            path, _ = sqlite_path(url)
            dedup, sent, batches = _prune_sqlite(path, args.batch, args.pause)
        else:
            raise ConfigError(f"unsupported store {url!r}: use sqlite:///path or mysql://...")
    except (ConfigError, ValueError) as e:
        print(f"imgw db prune: {e}", file=sys.stderr)
        return 2
    except (StoreUnavailable, sqlite3.Error) as e:
        print(f"imgw db prune: {e}", file=sys.stderr)
        return 1
    print(
        f"pruned {dedup} idempotency records (im_send_dedup) and {sent} archived sends "
        f"(im_archive_sent) older than 48 h, in {batches} batches, "
        f"{time.monotonic() - started:.1f} s"
    )
    return 0
