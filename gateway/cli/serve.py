"""`imgw serve`: run a gateway node. Its options are the settings of docs/configuration.md
(also read from a TOML file and IMGW_* variables, gateway/config.py)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Final

from gateway.cli.common import DEV_KEY
from gateway.config import DEFAULT_DATA_DIR, Config, ConfigError, is_loopback, load
from gateway.net.listen import BACKLOG, bind_listener
from gateway.redact import config_secrets, redact_text, remember

NAME: Final = "serve"
HELP: Final = "run a gateway node"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(NAME, help=HELP)
    _serve_args(p)
    p.set_defaults(command_parser=p, func=run)


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


def run(args: argparse.Namespace) -> int:
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
