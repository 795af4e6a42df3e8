"""`imgw archive`: move old messages to Parquet files (`run`) and show the tiers (`status`).

The store options are `imgw serve`'s (`--data-dir`, `--store`, `--config`), read the
same way.

    imgw archive run --older-than 180d [--retention 365d] [--to URL] [--rate ROWS_PER_S]
    imgw archive status

`--retention` deletes messages older than it from every tier first
(storage/archive/retain.py); with it, `--older-than` may be left out (retention only).

`--to` is `file:///path` or `s3://bucket/prefix?endpoint=http://host:port`; the default,
for the embedded store only, is `file://<data-dir>/archive`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from gateway.config import REDIS_URLS, ConfigError, load

if TYPE_CHECKING:
    from storage.archive.index_sqlite import ArchiveIndex
    from storage.redis.recent import RecentCache

NAME: Final = "archive"
HELP: Final = "move old messages to Parquet files (run), rows per tier (status)"
_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_age(text: str) -> int:
    """`180d`, `12h`, `30m`, `90s`, `500ms`, `0s` -> milliseconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"bad age {text!r}: use e.g. 180d, 12h, 30m, 0s")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="TOML file with settings (keys as the long flags)")
    p.add_argument("--data-dir", help="embedded store directory (as imgw serve)")
    p.add_argument("--store", help="authoritative store URL (default sqlite:///<data-dir>/imgw.db)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        NAME,
        help=HELP,
        description="Move messages older than an age out of the hot store into Parquet "
        "files on object storage; HISTORY and PULL keep answering them.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = actions.add_parser("run", help="archive messages older than --older-than")
    _store_args(run)
    run.add_argument(
        "--older-than", type=parse_age, metavar="AGE",
        help="archive messages sent longer ago than this (180d; 0s: everything)",
    )  # fmt: skip
    run.add_argument(
        "--retention", type=parse_age, metavar="AGE",
        help="first delete messages sent longer ago than this (365d; at least 48h) from "
        "the hot store and the archive, for good",
    )  # fmt: skip
    run.add_argument(
        "--cache", metavar="URL",
        help="with --retention: the gateways' Redis (redis://...; default: the config's "
        "cache), whose recent-message cache is told to forget what is deleted",
    )  # fmt: skip
    run.add_argument(
        "--to", metavar="URL",
        help="file:///path or s3://bucket/prefix?endpoint=http://host:port "
        "(default for the embedded store: file://<data-dir>/archive)",
    )  # fmt: skip
    run.add_argument(
        "--rate", type=float,
        help="rows a second at most (default: no limit; beside live traffic give one: "
        "unlimited, it raised send p99 from 24 ms to seconds on the bench machine)",
    )  # fmt: skip
    run.set_defaults(command_parser=run, func=main)
    status = actions.add_parser(
        "status", help="rows and bytes per tier, oldest hot message, last run"
    )
    _store_args(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(command_parser=status, func=main)


def _open_index(store_url: str) -> ArchiveIndex:
    from storage.archive.index_sqlite import SqliteIndex
    from storage.factory import sqlite_path

    now_ms = lambda: int(time.time() * 1000)  # noqa: E731
    if store_url.startswith("sqlite://"):
        path, opts = sqlite_path(store_url)
        busy = int(opts.get("busy_timeout_ms", "5000"))
        return SqliteIndex(path, clock=now_ms, busy_timeout_ms=busy)
    if store_url.startswith("mysql://"):
        from storage.archive.index_mysql import MySQLIndex
        from storage.mysql import MySQLSettings

        return MySQLIndex(MySQLSettings.from_url(store_url), clock=now_ms)
    raise ValueError(f"unsupported store {store_url!r}: use sqlite:///path or mysql://...")


def _recent(cache_url: str) -> tuple[RecentCache | None, Any]:
    """The Redis recent cache of `cache_url` and its client, or None (memory://: each
    gateway's own, which holds nothing another process deletes)."""
    if not cache_url.startswith(REDIS_URLS):
        return None, None
    from storage.redis import redis_from_url
    from storage.redis.recent import RecentCache

    client, prefix = redis_from_url(cache_url)
    return RecentCache(client, prefix=prefix), client


async def _run(args: argparse.Namespace, store_url: str, to: str, cache_url: str) -> int:
    from storage.archive.run import archive_run

    index = _open_index(store_url)
    await index.open()
    started = index.now_ms()
    fields = {"started_ms": str(started), "to": to, "older_than_ms": str(args.older_than)}
    if args.retention is not None:
        fields["retention_ms"] = str(args.retention)
    recent, client = _recent(cache_url) if args.retention is not None else (None, None)
    try:
        report = await archive_run(
            index, to, older_than_ms=args.older_than, rate=args.rate,
            retention_ms=args.retention, recent=recent,
        )  # fmt: skip
    except BaseException as e:
        fields.update(finished_ms=str(index.now_ms()), error=repr(e))
        try:
            await index.set_last_run(fields)
        finally:
            await index.close()
        raise
    finally:
        if client is not None:
            await client.aclose()
    try:
        fields.update(
            finished_ms=str(index.now_ms()), rows=str(report.rows), files=str(report.files),
            bytes=str(report.bytes), failures=str(len(report.failures)),
            error="; ".join(report.failures)[:255], expired_rows=str(report.expired.rows),
        )  # fmt: skip
        await index.set_last_run(fields)
    finally:
        await index.close()
    if args.retention is not None:
        x = report.expired
        print(
            f"deleted {x.rows} rows past retention ({x.hot_rows} hot) of {x.conversations} "
            f"conversations; archive files deleted {x.files_deleted}, rewritten "
            f"{x.files_rewritten}"
        )
    if args.older_than is not None:
        print(
            f"archived {report.rows} rows of {report.conversations} conversations in "
            f"{report.files} files ({report.bytes} bytes) to {to}"
        )
    for f in report.failures:
        print(f"imgw archive run: failed, hot rows kept: {f}", file=sys.stderr)
    return 1 if report.failures else 0


async def _status(args: argparse.Namespace, store_url: str) -> int:
    index = _open_index(store_url)
    await index.open()
    try:
        st = await index.status()
    finally:
        await index.close()
    doc = {
        "hot": {"rows": st.hot_rows, "bytes": st.hot_bytes, "oldest_ms": st.oldest_hot_ms},
        "archive": {
            "rows": st.archived_rows, "bytes": st.archived_bytes, "files": st.archived_files,
            "conversations": st.archived_conversations,
        },
        "last_run": st.last_run or None,
    }  # fmt: skip
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    oldest = "none" if st.oldest_hot_ms is None else utc_text(st.oldest_hot_ms)
    print(f"hot:     {st.hot_rows} rows, {st.hot_bytes} bytes, oldest message {oldest}")
    print(
        f"archive: {st.archived_rows} rows, {st.archived_bytes} bytes in "
        f"{st.archived_files} files of {st.archived_conversations} conversations"
    )
    print("last run: " + (last_run_text(st.last_run) if st.last_run else "never"))
    return 0


def utc_text(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def age_text(ms: int) -> str:
    """Milliseconds as `parse_age` reads them, in the largest unit that divides them."""
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms}ms" if ms else "0s"


def last_run_text(fields: Mapping[str, str]) -> str:
    """The last run's record for people: its start and end as times and how long it took,
    ages as `parse_age` reads them (`--older-than 30d`), then the rest as key=value."""
    rest = dict(fields)
    started, finished = rest.pop("started_ms", ""), rest.pop("finished_ms", "")
    head = []
    if started.isdigit():
        head.append(f"started {utc_text(int(started))}")
    if finished.isdigit():
        took = f" (took {(int(finished) - int(started)) / 1000:.1f} s)" if started.isdigit() else ""
        head.append(f"finished {utc_text(int(finished))}{took}")
    parts = []
    for key, value in sorted(rest.items()):
        if key.endswith("_ms") and value.isdigit():
            key, value = key.removesuffix("_ms"), age_text(int(value))
        parts.append(f"{key}={value}")
    return ", ".join(head + parts)


def main(args: argparse.Namespace) -> int:
    from storage.archive.objects import ArchiveUrlError
    from storage.errors import StoreUnavailable

    try:
        overrides = {"data_dir": args.data_dir, "store": args.store}
        if args.action == "run":
            overrides["cache"] = args.cache
        cfg = load(overrides, config_file=args.config)
        store_url = cfg.store_url()
        if args.action == "run":
            from storage.archive.retain import MIN_RETENTION_MS

            if args.older_than is None and args.retention is None:
                raise ConfigError("give --older-than, --retention or both")
            if args.retention is not None and args.retention < MIN_RETENTION_MS:
                raise ConfigError("--retention must be at least 48h (the idempotency window)")
            to = args.to
            if to is None:
                if store_url.startswith("sqlite://"):
                    to = (Path(cfg.data_dir).resolve() / "archive").as_uri()
                elif args.older_than is not None:
                    raise ConfigError("--to is required with a MySQL store")
                else:
                    to = ""  # retention only: files are rewritten where they are
            from storage.archive.objects import open_location

            if to:
                open_location(to)  # a bad URL is refused before anything opens
            return asyncio.run(_run(args, store_url, to, cfg.cache))
        return asyncio.run(_status(args, store_url))
    except (ConfigError, ArchiveUrlError, ValueError) as e:
        print(f"imgw archive: {e}", file=sys.stderr)
        return 2
    except StoreUnavailable as e:
        print(f"imgw archive: {e}", file=sys.stderr)
        return 1
