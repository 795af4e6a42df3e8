"""`imgw db`: the MySQL schema (`migrate`, `status`), moving message shards to another
server (`add-server`), and pruning the idempotency records (`prune`).

`imgw db prune` deletes the idempotency records past their 48 h, now, in batches. The
gateways do the same about once a minute (on MySQL only the holder of the prune lease,
storage/mysql/lease.py); this command is for a store no gateway runs on, a backlog to
clear at once, or cron. It takes no lease: pruning is idempotent, so running beside a
gateway's prune only shares the work. Its store options are `imgw serve`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import sqlite3
import sys
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

from gateway.cli.common import usage_error
from gateway.config import ConfigError, load
from gateway.redact import redact_text, remember, url_secrets

if TYPE_CHECKING:
    from storage.mysql import MySQLSettings

NAME: Final = "db"
HELP: Final = "manage the MySQL schema; prune idempotency records"
SQLITE_BATCH: Final = 2_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = sub.add_parser(NAME, help=HELP)
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    mig = db_sub.add_parser(
        "migrate", help="create or upgrade the schema (idempotent)",
        description="Create the database and tables if missing. Safe to run again.",
    )  # fmt: skip
    mig.add_argument("--store", help="mysql://user:password@host:port/database (or IMGW_STORE)")
    mig.add_argument("--shards", type=int, help="message table shards, fixed at first migrate (16)")
    mig.add_argument(
        "--servers", metavar="URL,URL,...",
        help="spread the message shards over these MySQL servers (mysql://host:port/db; "
        "user and password default to --store's), in contiguous ranges; fixed at the "
        "first migrate (default: every shard in the --store database)",
    )  # fmt: skip
    mig.add_argument("--config", help="TOML config file to read the store URL from")
    mig.set_defaults(command_parser=mig, func=migrate)
    st = db_sub.add_parser(
        "status", help="print the schema version and the shard map",
        description="Print the metadata database's schema version and shard count, and "
        "which server holds which message shards (each checked: it answers, its shard "
        "tables exist). Exit 1 when something is missing.",
    )  # fmt: skip
    st.add_argument("--store", help="the metadata database: mysql://user:password@host:port/db")
    st.add_argument("--config", help="TOML config file to read the store URL from")
    st.set_defaults(command_parser=st, func=status)
    _prune_parser(db_sub)
    add = db_sub.add_parser(
        "add-server", help="move message shards to a new MySQL server, gateways running",
        description="Create the tables on URL, then for the shards it takes: log their "
        "changes on their server (triggers), copy their messages and their conversations' "
        "rows in batches of --batch rows while sends go on, apply the logged changes until "
        "few are left, freeze the shards (their writes answer unavailable; the client "
        "retries), apply the rest, switch the shard map (gateways follow within a "
        "second), verify row counts, wait --grace seconds and drop the old copy. A "
        "failure before the switch undoes the freeze and leaves the map as it was.",
    )  # fmt: skip
    add.add_argument("url", help="the new server: mysql://[user:password@]host:port/database")
    add.add_argument("--store", help="the metadata database: mysql://user:password@host:port/db")
    add.add_argument(
        "--take", type=int,
        help="shards to move to it (default: an even share, taken from the fullest servers)",
    )  # fmt: skip
    add.add_argument(
        "--grace", type=float, default=3.0,
        help="seconds between the map switch and dropping the old copy (3)",
    )  # fmt: skip
    add.add_argument(
        "--batch", type=int, default=2000,
        help="rows read or written a query: the command's memory is a batch (2000)",
    )  # fmt: skip
    add.add_argument("--config", help="TOML config file to read the store URL from")
    add.set_defaults(command_parser=add, func=add_server)
    pro = db_sub.add_parser(
        "promote", help="a dead shard server's replica takes over its shards",
        description="On the replica at --to: stop its I/O thread, wait until it applied "
        "everything it received (with semi-synchronous replication, every commit the dead "
        "server acknowledged), reset replication and make it writable; then point the "
        "shard map's ranges of server N at it (gateways follow within a second). "
        "docs/deployment.md has the failover procedure.",
    )  # fmt: skip
    pro.add_argument(
        "--server", type=int, required=True, metavar="N",
        help="the dead server: its number in the shard map (imgw db status)",
    )  # fmt: skip
    pro.add_argument(
        "--to", required=True, metavar="URL",
        help="its replica: mysql://[user:password@]host:port/database",
    )  # fmt: skip
    pro.add_argument("--store", help="the metadata database: mysql://user:password@host:port/db")
    pro.add_argument(
        "--wait", type=float, default=60.0,
        help="seconds to wait for the replica to apply what it received (60)",
    )  # fmt: skip
    pro.add_argument("--config", help="TOML config file to read the store URL from")
    pro.set_defaults(command_parser=pro, func=promote)


def _prune_parser(db_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.set_defaults(command_parser=p, func=prune)


def migrate(args: argparse.Namespace) -> int:
    from storage.errors import StoreUnavailable
    from storage.mysql import MySQLSettings
    from storage.mysql import migrate as migrate_schema
    from storage.mysql.shardmap import server_settings

    try:
        url = args.store or load(config_file=args.config).store_url()
        remember(url_secrets(url))  # masked in what the command prints
    except ConfigError as e:
        print(f"imgw db migrate: {redact_text(str(e))}", file=sys.stderr)
        return 2
    if not url.startswith("mysql://"):
        print(
            "imgw db migrate: the embedded store migrates itself at startup; "
            "pass --store mysql://user:password@host:3306/database",
            file=sys.stderr,
        )
        return 2
    try:
        settings = MySQLSettings.from_url(url)
        if args.shards is not None and not 1 <= args.shards <= 1024:
            raise ValueError("--shards must be 1..1024")
        servers = [u.strip() for u in (args.servers or "").split(",") if u.strip()]
        for server in servers:
            server_settings(settings, server)
    except ValueError as e:
        print(f"imgw db migrate: {redact_text(str(e))}", file=sys.stderr)
        return 2
    if args.shards is not None:
        settings = dataclasses.replace(settings, shards=args.shards)
    try:
        done = asyncio.run(migrate_schema(settings, servers or None))
    except (ValueError, StoreUnavailable) as e:
        print(f"imgw db migrate: {redact_text(str(e))}", file=sys.stderr)
        return 1
    for line in done:
        print(f"{settings.database}: {line}")
    return 0


def _mysql_settings(args: argparse.Namespace, action: str) -> MySQLSettings | None:
    """The metadata database of `imgw db ACTION` (--store, else the config's store);
    None after saying what is wrong."""
    from storage.mysql import MySQLSettings

    try:
        url = args.store or load(config_file=args.config).store_url()
        remember(url_secrets(url))  # masked in what the command prints
        if not url.startswith("mysql://"):
            raise ValueError("pass --store mysql://user:password@host:3306/database")
        return MySQLSettings.from_url(url)
    except ValueError as e:  # ConfigError included
        print(f"imgw db {action}: {redact_text(str(e))}", file=sys.stderr)
        return None


def status(args: argparse.Namespace) -> int:
    from storage.errors import StoreUnavailable
    from storage.mysql.schema import status as schema_status

    settings = _mysql_settings(args, "status")
    if settings is None:
        return 2
    try:
        lines, ok = asyncio.run(schema_status(settings))
    except (ValueError, StoreUnavailable) as e:
        print(f"imgw db status: {redact_text(str(e))}", file=sys.stderr)
        return 1
    print("\n".join(map(redact_text, lines)))
    return 0 if ok else 1


def add_server(args: argparse.Namespace) -> int:
    from storage.mysql.move import add_server as move_shards
    from storage.mysql.shardmap import server_settings

    settings = _mysql_settings(args, "add-server")
    if settings is None:
        return 2
    try:
        server_settings(settings, args.url)
    except ValueError as e:
        return usage_error("db add-server", f"URL: {e}")
    if args.take is not None and args.take < 1:
        return usage_error("db add-server", "--take must be a positive number of shards")
    if not (math.isfinite(args.grace) and args.grace >= 0):
        return usage_error("db add-server", "--grace must be a number of seconds >= 0")
    if not 1 <= args.batch <= 100_000:
        return usage_error("db add-server", "--batch must be 1..100000 rows")

    remember(url_secrets(args.url))
    return _change(
        "add-server",
        lambda log: move_shards(
            settings, args.url, take=args.take, grace_s=args.grace, batch=args.batch, log=log
        ),
    )


def promote(args: argparse.Namespace) -> int:
    from storage.mysql.promote import promote as promote_replica

    settings = _mysql_settings(args, "promote")
    if settings is None:
        return 2
    if not (math.isfinite(args.wait) and args.wait > 0):
        return usage_error("db promote", "--wait must be a number of seconds > 0")
    remember(url_secrets(args.to))
    return _change(
        "promote",
        lambda log: promote_replica(settings, args.server, args.to, wait_s=args.wait, log=log),
    )


def _change(
    action: str, work: Callable[[Callable[[str], None]], Coroutine[Any, Any, list[str]]]
) -> int:
    """Run a change of the shard map (`work`, given a logger of progress lines), then
    print its result lines; secrets redacted throughout. 1 when it failed."""
    from storage.errors import StoreUnavailable

    def log(line: str) -> None:
        print(redact_text(line), flush=True)

    try:
        lines = asyncio.run(work(log))
    except (ValueError, RuntimeError, StoreUnavailable) as e:
        print(f"imgw db {action}: {redact_text(str(e))}", file=sys.stderr)
        return 1
    print("\n".join(map(redact_text, lines)))
    return 0


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


def prune(args: argparse.Namespace) -> int:
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
