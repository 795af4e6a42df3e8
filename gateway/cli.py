"""The `imgw` command: serve, token, db, drain, revoke, chat; and the commands other
packages add (entry points of group `imgw.commands`, e.g. `imgw bench` from the
optional extra imgw[bench]), which this module never imports until they are run."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import importlib.metadata
import math
import os
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from gateway import dbprune
from gateway.config import DEFAULT_DATA_DIR, Config, ConfigError, is_loopback, load
from gateway.net.hostport import split_host_port
from gateway.net.listen import BACKLOG, bind_listener
from gateway.redact import config_secrets, redact_text, remember, url_secrets
from protocol.token import DEVICE_RE, KID_RE, sign_token

if TYPE_CHECKING:
    from storage.mysql import MySQLSettings

DEV_KEY: Final = "dev:imgw-dev-secret"
"""Used by `imgw serve` on a loopback address when no key is configured, and by `imgw
chat` and `imgw token` by default, so a first try needs no setup. Never for production:
the gateway refuses to use it on a non-loopback address."""

_DESCRIPTION = """\
imgw: an instant-messaging connection gateway.

Native chat apps keep a persistent TCP connection to imgw and speak a compact msgpack
protocol (docs/protocol.md). Start a gateway on the embedded store with `imgw serve`,
then try it from two terminals with `imgw chat --uid 1 --peer 2` and
`imgw chat --uid 2 --peer 1`.
"""


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        help="TOML file with settings, keys spelled as the long flags (token-key = "
        '"kid:secret"); imgw.example.toml in the source lists every one (env IMGW_CONFIG)',
    )
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default 7070)")
    p.add_argument(
        "--token-key",
        action="append",
        metavar="KID:SECRET",
        help="token signing key; repeat for rotation (env IMGW_TOKEN_KEYS=kid:s,kid2:s2)",
    )
    p.add_argument("--data-dir", help=f"embedded store directory (default {DEFAULT_DATA_DIR})")
    p.add_argument("--store", help="authoritative store URL (default sqlite:///<data-dir>/imgw.db)")
    p.add_argument("--cache", help="route/cache URL (default memory://)")
    p.add_argument("--bus", help="cross-node bus URL (default local://)")
    p.add_argument("--node-id", help="this node's id in routes (default <hostname>-<pid>)")
    p.add_argument(
        "--check-url",
        help="content check: POST each commit's messages here and store only those allowed",
    )
    p.add_argument(
        "--check-timeout-ms", type=float, help="content check deadline per commit, ms (200)"
    )
    p.add_argument(
        "--check-fail",
        choices=["open", "closed"],
        help="when the content check fails: open stores unchecked, closed answers unavailable "
        "(open)",
    )
    p.add_argument(
        "--notify-url",
        help="notify webhook: POST committed messages here in batches, at least once",
    )
    p.add_argument(
        "--notify-token", help="bearer token sent to --notify-url (env IMGW_NOTIFY_TOKEN)"
    )
    p.add_argument(
        "--push-url",
        help="POST push events (the registered devices that were offline) here in batches, "
        "at least once",
    )
    p.add_argument("--push-token", help="bearer token sent to --push-url (env IMGW_PUSH_TOKEN)")
    p.add_argument(
        "--push-amqp",
        metavar="URL",
        help="publish push events to the RabbitMQ exchange imgw.push at this amqp:// URL, "
        "persistent and confirmed",
    )
    p.add_argument("--tls-cert", help="PEM certificate chain: serve TLS on the client port")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument(
        "--ws-listen",
        metavar="HOST:PORT",
        help="also serve WebSocket clients at ws://HOST:PORT/ws (wss:// with --tls-cert), "
        "and the browser chat page at http://HOST:PORT/ (off)",
    )
    p.add_argument(
        "--ws-origins",
        metavar="ORIGINS",
        help="browser origins allowed to open a WebSocket, comma-separated, or * (default: "
        "any on a loopback --ws-listen, else none but its own page)",
    )
    p.add_argument(
        "--admin-port", type=int, help="HTTP port for /healthz /readyz /metrics, POST /drain"
    )
    p.add_argument(
        "--admin-host",
        help="admin address (127.0.0.1; another needs --admin-token)",
    )
    p.add_argument(
        "--admin-token",
        help="bearer token required by the admin port's POST /drain (env IMGW_ADMIN_TOKEN)",
    )
    p.add_argument(
        "--api-key",
        action="append",
        metavar="NAME:SECRET:SCOPES",
        help="a scoped server API key, repeatable; scopes: send,read,manage,moderate,push "
        "(env IMGW_API_KEYS)",
    )
    p.add_argument("--hb", type=int, help="heartbeat interval announced to clients, s (30)")
    p.add_argument("--idle", type=int, help="close connections silent this long, s (75)")
    p.add_argument("--login-timeout", type=float, help="seconds to send LOGIN (10)")
    p.add_argument("--max-frame", type=int, help="largest frame body accepted, bytes (65536)")
    p.add_argument("--max-content", type=int, help="largest message content, bytes (2048)")
    p.add_argument("--max-connections", type=int, help="connection cap of this node")
    p.add_argument(
        "--client-transport", choices=["fd", "uvloop"],
        help="plain-TCP connections as bare file descriptors (fd, the default: ~530 "
        "bytes fewer an idle connection) or on uvloop's transports (docs/decisions.md)",
    )  # fmt: skip
    p.add_argument("--recall-window", type=float, help="seconds a sender may recall (120)")
    p.add_argument("--rate-burst", type=int, help="sends per uid in a burst (200)")
    p.add_argument("--rate-per-s", type=float, help="sustained sends per uid per second (100)")
    p.add_argument("--batch-max", type=int, help="messages per group commit (512)")
    p.add_argument(
        "--batch-delay-ms", type=float,
        help="a batch's wait at low rates, ms (0: it goes at the end of the loop iteration "
        "that queued it)",
    )  # fmt: skip
    p.add_argument(
        "--batch-min", type=int,
        help="a batch starts once this many SENDs wait (32) ...",
    )  # fmt: skip
    p.add_argument(
        "--batch-wait-ms", type=float,
        help="... or once the oldest waited this long, at rates that fill it (10; "
        "set it to --batch-delay-ms for a fixed wait)",
    )  # fmt: skip
    p.add_argument(
        "--batch-inflight",
        type=int,
        help="group commits running at once (default: 4 on MySQL, 2 embedded)",
    )
    p.add_argument("--shutdown-timeout", type=float, help="seconds to finish in-flight sends")
    p.add_argument(
        "--workers", type=int,
        help="worker processes sharing the port (1); >1 needs --cache redis:// and --bus amqp://",
    )  # fmt: skip
    p.add_argument(
        "--drain-rate", type=float, help="KICK draining per second on SIGTERM/drain (2000; 0=all)"
    )
    p.add_argument("--reconnect-hint", help="HOST:PORT sent to clients with KICK draining")
    p.add_argument(
        "--sync-hint-spread", dest="sync_hint_spread_s", type=float,
        help="seconds to spread SYNC_HINT over after a bus or route-store outage (5)",
    )  # fmt: skip
    p.add_argument(
        "--node-lease", dest="node_lease_s", type=float,
        help="with a shared store and bus: seconds after which a silent node's owed fan-out "
        "is delivered by another node (5)",
    )  # fmt: skip
    p.add_argument(
        "--route-check", dest="route_check_s", type=float,
        help="seconds between checks that the route store (Redis) still holds this node's "
        "routes; on loss they are re-registered and sessions told to SYNC (1)",
    )  # fmt: skip
    p.add_argument(
        "--media",
        help="media by object key: file:///path (served by --media-listen) or "
        "s3://bucket/prefix?endpoint=... (default: none, media ops answer forbidden)",
    )
    p.add_argument(
        "--media-listen", metavar="HOST:PORT",
        help="HTTP listener serving the signed URLs of a file:// --media root",
    )  # fmt: skip
    p.add_argument(
        "--media-public-url",
        help="base of the signed URLs clients get (default http://<media-listen>)",
    )
    p.add_argument(
        "--media-secret",
        help="secret signing file:// media URLs (default: generated in the data dir; "
        "env IMGW_MEDIA_SECRET)",
    )
    p.add_argument("--media-max-size", type=int, help="largest upload, bytes (100 MiB)")
    p.add_argument(
        "--media-types",
        help="content types an upload may have, comma-separated, major/* allowed "
        "(image/*,audio/*,video/*,application/pdf,application/octet-stream,text/plain)",
    )
    p.add_argument("--media-url-ttl", type=int, help="seconds a signed media URL is valid (900)")
    p.add_argument(
        "--media-orphan", dest="media_orphan_s", type=int,
        help="seconds after which an upload no message references is deleted (86400)",
    )  # fmt: skip
    p.add_argument("--log-format", choices=["console", "json"], help="log format (console)")
    p.add_argument("--log-level", help="debug, info, warning, error (info)")


def config_from_args(args: argparse.Namespace) -> Config:
    names = [
        "host", "port", "data_dir", "store", "cache", "bus", "node_id", "tls_cert", "tls_key",
        "ws_listen", "ws_origins",
        "check_url", "check_timeout_ms", "check_fail", "notify_url", "notify_token",
        "push_url", "push_token", "push_amqp", "admin_port",
        "admin_host", "admin_token", "hb", "idle", "login_timeout", "max_frame", "max_content",
        "max_connections", "client_transport",
        "recall_window", "rate_burst", "rate_per_s", "batch_max", "batch_delay_ms",
        "batch_min", "batch_wait_ms", "batch_inflight", "shutdown_timeout", "log_format",
        "log_level", "workers",
        "drain_rate", "reconnect_hint", "sync_hint_spread_s", "route_check_s", "node_lease_s",
        "media", "media_listen", "media_public_url", "media_secret", "media_max_size",
        "media_types", "media_url_ttl", "media_orphan_s",
    ]  # fmt: skip
    overrides = {n: getattr(args, n, None) for n in names}
    overrides["token_keys"] = tuple(args.token_key or ())
    overrides["api_keys"] = tuple(getattr(args, "api_key", None) or ())
    return load(overrides, config_file=args.config)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        remember(config_secrets(cfg))  # masked in what it prints and logs from now on
        if not cfg.token_keys:
            if not is_loopback(cfg.host):
                raise ConfigError(
                    f"no token keys and host {cfg.host} is not loopback: pass --token-key "
                    "KID:SECRET or set IMGW_TOKEN_KEYS"
                )
            _warn_dev_key(cfg)
            cfg = dataclasses.replace(cfg, token_keys=(DEV_KEY,))
        cfg.validate()
    except ConfigError as e:
        print(f"imgw serve: {redact_text(str(e))}", file=sys.stderr)
        return 2
    if cfg.workers > 1:
        from gateway.supervisor import supervise

        return supervise(cfg)
    # The port first, before the server's modules are imported and its backends opened:
    # a client connecting meanwhile waits instead of being refused (gateway/net/listen.py).
    try:
        listener = bind_listener(cfg.host, cfg.port, reuse_port=False, backlog=BACKLOG)
    except OSError as e:
        print(f"imgw serve: cannot listen on {cfg.host}:{cfg.port}: {e}", file=sys.stderr)
        return 1
    from gateway.server import run

    return run(cfg, listener=listener)


def _warn_dev_key(cfg: Config) -> None:
    """Say that the development key is in use, as a log line in the configured format
    (a JSON line under log-format = "json")."""
    import structlog

    from gateway.logs import configure

    configure(cfg.log_format, cfg.log_level)
    structlog.get_logger("imgw").warning(
        "no --token-key given; using the development key (loopback only, never for production)",
        key=DEV_KEY,
    )


def _usage_error(command: str, problem: str | None) -> int:
    """Print `problem` (if any) as the command's usage error; 2 when there was one."""
    if problem is None:
        return 0
    print(f"imgw {command}: {problem}", file=sys.stderr)
    return 2


def _bad_address(option: str, spec: str | None) -> str | None:
    if spec is None:
        return None
    try:
        split_host_port(spec, default_host="127.0.0.1")
    except ValueError as e:
        return f"{option}: {e}"
    return None


def _revoke_problem(args: argparse.Namespace) -> str | None:
    if args.uid < 1:
        return "--uid must be a positive integer"
    if args.device is not None and DEVICE_RE.fullmatch(args.device) is None:
        return "--device must match [A-Za-z0-9_-]{1,32}"
    return _bad_address("--admin", args.admin)


def _drain_problem(args: argparse.Namespace) -> str | None:
    if args.pid is not None and args.pid < 1:
        return "--pid must be a positive process id"
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate >= 0):
        return "--rate must be a finite number >= 0 (0 = all at once)"
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        return "--timeout must be a number of seconds above 0"
    return _bad_address("--admin", args.admin) or _bad_address("--hint", args.hint)


def cmd_revoke(args: argparse.Namespace) -> int:
    from gateway.drain import DrainError, revoke_by_admin

    if rc := _usage_error("revoke", _revoke_problem(args)):
        return rc
    token = args.admin_token or os.environ.get("IMGW_ADMIN_TOKEN", "")
    try:
        print(revoke_by_admin(args.admin, args.uid, args.device, token=token))
    except DrainError as e:
        print(f"imgw revoke: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    from gateway.drain import DrainError, drain_by_admin, drain_by_pid

    if rc := _usage_error("drain", _drain_problem(args)):
        return rc
    try:
        if args.pid is not None:
            if args.rate is not None or args.hint is not None:
                raise DrainError(
                    "--rate and --hint need --admin; with --pid the node uses its own "
                    "--drain-rate and --reconnect-hint"
                )
            drain_by_pid(args.pid, wait=args.wait, timeout=args.timeout)
        elif args.admin is not None:
            drain_by_admin(
                args.admin,
                rate=args.rate,
                hint=args.hint,
                wait=args.wait,
                timeout=args.timeout,
                token=args.admin_token or os.environ.get("IMGW_ADMIN_TOKEN", ""),
            )
        else:
            raise DrainError("say which node: --admin HOST:PORT or --pid PID")
    except DrainError as e:
        print(f"imgw drain: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    if KID_RE.fullmatch(args.kid) is None:
        print("imgw token: --kid must match [A-Za-z0-9_-]{1,16}", file=sys.stderr)
        return 2
    if DEVICE_RE.fullmatch(args.device) is None:
        print("imgw token: --device must match [A-Za-z0-9_-]{1,32}", file=sys.stderr)
        return 2
    if args.uid < 1:
        print("imgw token: --uid must be a positive integer", file=sys.stderr)
        return 2
    if args.ttl < 1:
        print("imgw token: --ttl must be a positive number of seconds", file=sys.stderr)
        return 2
    now = int(time.time())
    print(sign_token(args.kid, args.secret, args.uid, args.device, now + args.ttl, iat=now))
    return 0


def cmd_db_migrate(args: argparse.Namespace) -> int:
    import asyncio

    from storage.errors import StoreUnavailable
    from storage.mysql import MySQLSettings, migrate
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
        done = asyncio.run(migrate(settings, servers or None))
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


def cmd_db_status(args: argparse.Namespace) -> int:
    import asyncio

    from storage.errors import StoreUnavailable
    from storage.mysql.schema import status

    settings = _mysql_settings(args, "status")
    if settings is None:
        return 2
    try:
        lines, ok = asyncio.run(status(settings))
    except (ValueError, StoreUnavailable) as e:
        print(f"imgw db status: {redact_text(str(e))}", file=sys.stderr)
        return 1
    print("\n".join(map(redact_text, lines)))
    return 0 if ok else 1


def cmd_db_add_server(args: argparse.Namespace) -> int:
    import asyncio

    from storage.errors import StoreUnavailable
    from storage.mysql.move import add_server
    from storage.mysql.shardmap import server_settings

    settings = _mysql_settings(args, "add-server")
    if settings is None:
        return 2
    try:
        server_settings(settings, args.url)
    except ValueError as e:
        return _usage_error("db add-server", f"URL: {e}")
    if args.take is not None and args.take < 1:
        return _usage_error("db add-server", "--take must be a positive number of shards")
    if not (math.isfinite(args.grace) and args.grace >= 0):
        return _usage_error("db add-server", "--grace must be a number of seconds >= 0")

    remember(url_secrets(args.url))

    def log(line: str) -> None:
        print(redact_text(line), flush=True)

    try:
        lines = asyncio.run(
            add_server(settings, args.url, take=args.take, grace_s=args.grace, log=log)
        )
    except (ValueError, RuntimeError, StoreUnavailable) as e:
        print(f"imgw db add-server: {redact_text(str(e))}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


# -- plugin commands --------------------------------------------------------------------

PLUGIN_GROUP: Final = "imgw.commands"
COMMAND_HELP: Final = {
    "serve": "run a gateway node",
    "chat": "chat from a terminal (try imgw from two of them)",
    "token": "mint a login token (for testing)",
    "db": "manage the MySQL schema; prune idempotency records",
    "drain": "drain a node: stop accepting, move its clients away at a set rate, exit",
    "revoke": "revoke a user's tokens (or one device's) and kick its sessions on every node",
}
BUILTIN_COMMANDS: Final = frozenset(COMMAND_HELP)
KNOWN_PLUGINS: Final = {
    # name: (its help in `imgw --help`, the extra of imgw that installs it)
    "bench": ("load the gateway: connect, chat, group, storm, offline", "bench"),
    "archive": ("move old messages to Parquet files (run), rows per tier (status)", ""),
}
"""Plugin commands listed by `imgw --help` even when not installed, so that running one
says what to install."""


def plugin_commands() -> dict[str, importlib.metadata.EntryPoint]:
    """The commands other packages add to `imgw`: entry points of group `imgw.commands`,
    each `name = "module:function [extra]"`; the function takes the arguments after
    the command's name and returns the exit status. In a source checkout, the table in
    its pyproject.toml counts too (and wins): an editable install's metadata is only as
    new as its last `pip install -e`."""
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP)}
    found.update(_checkout_plugins())
    return {name: ep for name, ep in found.items() if name not in BUILTIN_COMMANDS}


def _checkout_plugins() -> dict[str, importlib.metadata.EntryPoint]:
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        with pyproject.open("rb") as f:
            project = tomllib.load(f).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    if project.get("name") != "imgw":
        return {}
    table = project.get("entry-points", {}).get(PLUGIN_GROUP, {})
    return {
        name: importlib.metadata.EntryPoint(name, value, PLUGIN_GROUP)
        for name, value in table.items()
        if isinstance(value, str)
    }


def run_plugin(name: str, argv: Sequence[str]) -> int:
    """Run plugin command `name` with `argv` (its own parser, options and --help
    included); when it is not installed, say what to install."""
    ep = plugin_commands().get(name)
    extra = KNOWN_PLUGINS[name][1] if name in KNOWN_PLUGINS else ",".join(ep.extras if ep else ())
    hint = (
        f"; install it: pip install 'imgw[{extra}]' (in a checkout: pip install -e '.[{extra}]')"
        if extra
        else ""
    )
    if ep is None:
        print(f"imgw {name}: not installed{hint}", file=sys.stderr)
        return 2
    try:
        command = ep.load()
    except ImportError as e:
        print(f"imgw {name}: cannot load {ep.value} ({e}){hint}", file=sys.stderr)
        return 2
    rc: int = command(list(argv))
    return rc


def version() -> str:
    try:
        return importlib.metadata.version("imgw")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e . in the checkout)"


def command_list() -> str:
    """What bare `imgw` prints: every command (plugins too) with one line each."""
    plugins = {
        name: KNOWN_PLUGINS[name][0] if name in KNOWN_PLUGINS else "(plugin command)"
        for name in sorted(set(KNOWN_PLUGINS) | set(plugin_commands()))
    }
    about = {**COMMAND_HELP, **plugins}
    width = max(map(len, about))
    lines = [f"  {name:<{width}}  {text}" for name, text in about.items()]
    return "\n".join(
        [
            "usage: imgw COMMAND [OPTIONS]",
            "",
            "commands:",
            *lines,
            "",
            "Run `imgw COMMAND --help` for a command's options, `imgw --version` for the version.",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="imgw", description=_DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"imgw {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", help=COMMAND_HELP["serve"])
    _serve_args(serve)
    serve.set_defaults(command_parser=serve, func=cmd_serve)

    dev_kid, dev_secret = DEV_KEY.split(":", 1)
    token = sub.add_parser("token", help=COMMAND_HELP["token"])
    token.add_argument("--uid", type=int, required=True, help="user id the token is for")
    token.add_argument(
        "--device", required=True,
        help="device name, [A-Za-z0-9_-]{1,32}; a second login with the same uid and "
        "device logs the first one out",
    )  # fmt: skip
    token.add_argument("--kid", default=dev_kid, help=f"key id (default {dev_kid})")
    token.add_argument("--secret", default=dev_secret, help="signing secret (default: dev key)")
    token.add_argument(
        "--ttl",
        type=int,
        default=86_400,
        help="seconds of validity (86400; gateways refuse more than their "
        "token_max_lifetime, 30 days by default)",
    )
    token.set_defaults(command_parser=token, func=cmd_token)

    db = sub.add_parser("db", help=COMMAND_HELP["db"])
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
    mig.set_defaults(command_parser=mig, func=cmd_db_migrate)
    st = db_sub.add_parser(
        "status", help="print the schema version and the shard map",
        description="Print the metadata database's schema version and shard count, and "
        "which server holds which message shards (each checked: it answers, its shard "
        "tables exist). Exit 1 when something is missing.",
    )  # fmt: skip
    st.add_argument("--store", help="the metadata database: mysql://user:password@host:port/db")
    st.add_argument("--config", help="TOML config file to read the store URL from")
    st.set_defaults(command_parser=st, func=cmd_db_status)
    dbprune.add_parser(db_sub)
    add = db_sub.add_parser(
        "add-server", help="move message shards to a new MySQL server, gateways running",
        description="Create the tables on URL, then for each shard it takes: freeze it on "
        "its server (its sends answer unavailable meanwhile), copy its messages and its "
        "conversations' rows, verify row counts, switch the shard map (gateways follow "
        "within a second), wait --grace seconds and drop the old copy. A failure before "
        "the switch undoes the freeze and leaves the map as it was.",
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
    add.add_argument("--config", help="TOML config file to read the store URL from")
    add.set_defaults(command_parser=add, func=cmd_db_add_server)

    drain = sub.add_parser(
        "drain",
        help=COMMAND_HELP["drain"],
        description=(
            "Make a node stop accepting, KICK its clients with reason draining (they "
            "reconnect elsewhere, to --hint if given) at --rate per second, commit its "
            "pending sends and exit 0. --pid signals the process (SIGTERM; a supervisor "
            "drains all its workers); --admin asks one node over its admin port."
        ),
    )
    where = drain.add_mutually_exclusive_group()
    where.add_argument("--admin", metavar="HOST:PORT", help="the node's admin address")
    where.add_argument("--pid", type=int, help="the node's (or supervisor's) process id")
    drain.add_argument("--rate", type=float, help="KICKs per second (default: the node's own)")
    drain.add_argument("--hint", metavar="HOST:PORT", help="where clients should reconnect")
    drain.add_argument(
        "--admin-token", help="the node's admin token, with --admin (env IMGW_ADMIN_TOKEN)"
    )
    drain.add_argument(
        "--no-wait", dest="wait", action="store_false", help="return once the drain started"
    )
    drain.add_argument("--timeout", type=float, default=600, help="seconds to wait (600)")
    drain.set_defaults(command_parser=drain, func=cmd_drain)

    revoke = sub.add_parser(
        "revoke",
        help=COMMAND_HELP["revoke"],
        description=(
            "Ask a node over its admin port to refuse the tokens of --uid (all devices, or "
            "--device) minted until now, for the longest token lifetime, and to kick its "
            "sessions on every node with auth_revoked. Logging in again needs a v2 token "
            "(with iat) minted after the revocation; v1 tokens of the user stay refused."
        ),
    )
    revoke.add_argument(
        "--admin", metavar="HOST:PORT", required=True, help="a node's admin address"
    )
    revoke.add_argument("--uid", type=int, required=True, help="user id whose tokens are refused")
    revoke.add_argument("--device", help="only this device (default: all of them)")
    revoke.add_argument("--admin-token", help="the node's admin token (env IMGW_ADMIN_TOKEN)")
    revoke.set_defaults(command_parser=revoke, func=cmd_revoke)

    # Listed for `imgw --help` only; main() hands `imgw NAME ...` to the plugin whole.
    for name in sorted(set(KNOWN_PLUGINS) | set(plugin_commands())):
        about = KNOWN_PLUGINS[name][0] if name in KNOWN_PLUGINS else "(plugin command)"
        sub.add_parser(name, help=about, add_help=False)

    from gateway import chat

    chat_p = sub.add_parser("chat", help=COMMAND_HELP["chat"])
    chat.add_arguments(chat_p, default_key=DEV_KEY)
    chat_p.set_defaults(command_parser=chat_p, func=chat.main)
    return parser


def _unrecognized(parser: argparse.ArgumentParser, unknown: list[str]) -> None:
    """Exit with the usage of the command that was given the unknown option (argparse
    would show the top-level usage), naming the option meant when it is a near miss."""
    known = [s for a in parser._actions for s in a.option_strings]
    text = f"unrecognized arguments: {' '.join(unknown)}"
    for arg in unknown:
        close = difflib.get_close_matches(arg.partition("=")[0], known, n=1)
        if arg.startswith("-") and close:
            text += f" (did you mean {close[0]}?)"
            break
    parser.error(text)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        from gateway.cmdline import hide_secrets

        hide_secrets()  # ps shows --store mysql://user:***@... from here on
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        print(f"imgw: unknown option {argv[0]}\n" if argv else "", end="", file=sys.stderr)
        print(command_list(), file=sys.stderr)
        return 2
    name = argv[0]
    if name not in BUILTIN_COMMANDS and (name in KNOWN_PLUGINS or name in plugin_commands()):
        return run_plugin(name, argv[1:])  # its own parser, options and --help included
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _unrecognized(getattr(args, "command_parser", parser), unknown)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
