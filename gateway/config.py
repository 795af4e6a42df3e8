"""One typed configuration, from (lowest to highest precedence) defaults, an optional TOML
file, environment variables (IMGW_<NAME>) and command-line flags."""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from gateway.http.keys import parse_api_keys
from gateway.net.hostport import split_host_port
from protocol.ops import MAX_CONTENT_DEFAULT, MAX_FRAME_DEFAULT
from protocol.token import KeyRing
from storage.schemes import REDIS_SCHEMES

ENV_PREFIX: Final = "IMGW_"
DEFAULT_DATA_DIR: Final = "./imgw-data"
# cache URLs that name Redis (one server, a cluster, or a master found by Sentinels): a
# route store every node shares
REDIS_URLS: Final = tuple(f"{scheme}://" for scheme in REDIS_SCHEMES)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_origins(spec: str) -> frozenset[str] | None:
    """``--ws-origins``: ``*`` (any), or comma-separated origins; "" (none)."""
    parts = [p.strip().rstrip("/") for p in spec.split(",") if p.strip()]
    if "*" in parts:
        return None
    for p in parts:
        u = urlsplit(p)
        if u.scheme not in ("http", "https") or not u.netloc or u.path:
            raise ValueError(f"{p!r} is not an origin like https://chat.example.com")
    return frozenset(parts)


class ConfigError(ValueError):
    """A setting is missing or invalid; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 7070
    token_keys: tuple[str, ...] = ()  # "KID:SECRET" entries
    data_dir: str = DEFAULT_DATA_DIR
    store: str = ""  # default: sqlite:///<data_dir>/imgw.db
    cache: str = "memory://"
    bus: str = "local://"
    node_id: str = ""  # default: <hostname>-<pid>
    # TLS on the client port: a PEM certificate chain and its private key (both or none)
    tls_cert: str = ""
    tls_key: str = ""
    # WebSocket clients (gateway/net/websocket.py) at ws://ws_listen/ws (wss:// with the TLS
    # above), and the browser chat page at its /. "" = no WebSocket listener.
    ws_listen: str = ""
    # Browser origins that may open a WebSocket: "*" (any), or comma-separated origins;
    # "" = any on a loopback listener, else none but the listener's own page. Clients
    # that send no Origin (not browsers) are always let in.
    ws_origins: str = ""
    # Session timing (seconds); hb and idle are announced in LOGIN_OK.
    hb: int = 30
    idle: int = 75
    login_timeout: float = 10.0
    route_renew_s: float = 30.0
    # How often a node checks that the route store still holds its routes (gateway.routewatch).
    route_check_s: float = 1.0
    # With a shared store and bus: a node silent this long is taken for dead, and another
    # node delivers the fan-out its commits still owed (gateway.outbox).
    node_lease_s: float = 5.0
    token_leeway: int = 60
    token_max_lifetime: int = 30 * 86_400  # a token whose exp is further ahead is refused
    # Limits.
    max_frame: int = MAX_FRAME_DEFAULT
    frame_timeout: float = 10.0  # a frame that has started must be complete within this
    max_partial_bytes: int = 64 << 20  # unfinished frames held by all connections together
    max_content: int = MAX_CONTENT_DEFAULT
    max_connections: int = 1_000_000
    # Client connections from one IP address (0 = unlimited): above the 18,000 of one
    # `imgw bench` generator process (each has its own 127.x address), far below a node.
    max_connections_per_ip: int = 20_000
    # Logged-in connections (devices) of one uid on this node (0 = unlimited).
    max_connections_per_uid: int = 16
    # Plain-TCP client connections as bare file descriptors ("fd", the default,
    # gateway/net/fdtransport.py: ~530 bytes fewer an idle connection), or on uvloop's
    # transports ("uvloop"). TLS connections are always on uvloop's.
    client_transport: str = "fd"
    max_write_buffer: int = 1 << 20  # a connection with more unsent bytes is slow_consumer
    max_inflight_requests: int = 256  # per connection; beyond this, reading pauses
    recall_window: float = 120.0
    rate_burst: int = 200
    rate_per_s: float = 100.0
    # Every other op that makes work for the node or the store (all but PING, LOGIN,
    # LOGOUT and SEND) draws on a second per-uid budget; TYPING also on its own.
    op_rate_burst: int = 300
    op_rate_per_s: float = 100.0
    typing_burst: int = 3
    typing_per_s: float = 2.0
    # Content check before the commit (gateway.hooks.contentcheck): a webhook URL, its deadline,
    # what a failure does ("open": store unchecked; "closed": answer unavailable), and
    # the connections it may hold.
    check_url: str = ""
    check_timeout_ms: float = 200.0
    check_fail: str = "open"
    check_pool: int = 8
    # After the commit, at least once (gateway/hooks/queue.py): the notify webhook
    # (committed messages POSTed in batches) and push events (the devices that were
    # offline) to a URL and/or a RabbitMQ exchange. The queue in memory holds
    # notify_queue_max messages; past it they wait in the store's hook rows.
    notify_url: str = ""
    notify_token: str = ""  # sent as Authorization: Bearer
    notify_queue_max: int = 10_000
    notify_batch_max: int = 500
    push_url: str = ""
    push_token: str = ""  # sent as Authorization: Bearer
    push_amqp: str = ""  # amqp:// URL: events to the exchange imgw.push
    # Quotas: groups a uid may create a day, and conversations a uid may be a member of
    # (checked when a group is created or members are added).
    groups_per_day: int = 100
    max_conversations: int = 10_000
    # Send batcher.
    batch_max: int = 512
    # A batch's wait at low rates, where waiting gathers nothing (0: it goes at the end of
    # the loop iteration that queued it).
    batch_delay_ms: float = 0.0
    batch_min: int = 32  # a batch starts once this many wait ...
    batch_wait_ms: float = 10.0  # ... or after this long, at rates that can fill it
    # Group commits running at once (disjoint conversations); 0: the store's own
    # `commit_slots` (4 on MySQL, 2 on the embedded store's single writer).
    batch_inflight: int = 0
    max_pending_sends: int = 20_000  # queued beyond this, SEND is refused as unavailable
    # Queued SENDs at which the gateway stops reading from the connections that send
    # (TCP pushes back on them) until the queue is down to half: under overload it commits
    # at full speed instead of spending its CPU on reading and refusing.
    send_backpressure: int = 2048
    # Operations.
    workers: int = 1  # worker processes sharing the port (SO_REUSEPORT) under a supervisor
    drain_rate: float = 2000.0  # KICK draining per second on drain/SIGTERM; 0 = all at once
    reconnect_hint: str = ""  # "host:port" sent with KICK draining; empty = any address
    # SYNC_HINT to every session after a bus or route-store outage, spread over this long
    sync_hint_spread_s: float = 5.0
    shutdown_timeout: float = 10.0
    admin_port: int = 0  # 0 = no admin HTTP listener
    admin_host: str = "127.0.0.1"
    # Bearer token for the admin port's actions (POST /drain) and its server API
    # (/api/v1/, docs/api.md); /healthz, /readyz and /metrics stay open. Without one the
    # admin port must be bound to loopback.
    admin_token: str = ""
    # Scoped keys for the server API, "NAME:SECRET:SCOPES" entries (gateway/http/keys.py):
    # scopes send, read, manage, moderate, push. Two entries of one name rotate it.
    api_keys: tuple[str, ...] = ()
    # The server API's broadcast notices: recipients (uids) per second for the node, in
    # bursts of this many.
    api_broadcast_burst: int = 10_000
    api_broadcast_per_s: float = 2_000.0
    # Media by object key (docs/media.md): file:///path or s3://bucket/prefix?endpoint=...
    # ("" = media disabled: MEDIA_UPLOAD and MEDIA_GET answer forbidden). A file:// root
    # is served by the media listener at media_listen (HOST:PORT), whose signed URLs
    # start with media_public_url (default http://<media_listen>) and are signed with
    # media_secret (default: generated once, kept in <data_dir>/media.secret).
    media: str = ""
    media_listen: str = ""
    media_public_url: str = ""
    media_secret: str = ""
    media_max_size: int = 100 << 20  # bytes an upload may have
    # connections the media listener holds from one client address (0: no cap)
    media_max_connections_per_ip: int = 64
    # content types an upload may have: exact names or major/* ("*/*": any)
    media_types: tuple[str, ...] = (
        "image/*", "audio/*", "video/*", "application/pdf", "application/octet-stream",
        "text/plain",
    )  # fmt: skip
    media_url_ttl: int = 900  # seconds a signed URL stays valid
    # an upload no message references this long after its URL was handed out is deleted
    media_orphan_s: int = 86_400
    log_format: str = "console"  # console | json
    log_level: str = "info"

    def tls_context(self) -> ssl.SSLContext | None:
        """The server's TLS context (TLS 1.2 and up), or None without TLS."""
        if not self.tls_cert:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"cannot load the TLS certificate and key: {e}") from e
        return ctx

    def keyring(self) -> KeyRing:
        return KeyRing.from_pairs(self.token_keys)

    def store_url(self) -> str:
        return self.store or f"sqlite:///{Path(self.data_dir) / 'imgw.db'}"

    def validate(self) -> None:
        if not self.token_keys:
            raise ConfigError(
                "no token keys: pass --token-key KID:SECRET (repeatable) or set "
                "IMGW_TOKEN_KEYS=kid:secret,kid2:secret2"
            )
        try:
            self.keyring()
        except ValueError as e:
            raise ConfigError(f"bad token key: {e}") from e
        if not 0 < self.port < 65536:
            raise ConfigError(f"port must be 1..65535, got {self.port}")
        if not 0 <= self.admin_port < 65536:
            raise ConfigError(f"admin_port must be 1..65535 (0 = none), got {self.admin_port}")
        _check_numbers(self)
        if self.reconnect_hint:
            try:
                split_host_port(self.reconnect_hint)
            except ValueError as e:
                raise ConfigError(f"reconnect_hint: {e}") from None
        if self.client_transport not in ("fd", "uvloop"):
            raise ConfigError("client_transport must be fd or uvloop")
        if self.log_level.lower() not in _LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(_LOG_LEVELS)}")
        if self.hb <= 0 or self.idle <= self.hb:
            raise ConfigError(f"need 0 < hb < idle, got hb={self.hb} idle={self.idle}")
        if self.max_content > self.max_frame - 256:
            raise ConfigError("max_content must leave room in max_frame for the SEND header")
        if self.max_inflight_requests < 2 or self.batch_max < 1 or self.batch_inflight < 0:
            raise ConfigError(
                "need max_inflight_requests >= 2, batch_max >= 1, batch_inflight >= 0"
            )
        if self.send_backpressure < 2:
            raise ConfigError("send_backpressure must be >= 2 (queued SENDs)")
        if self.batch_min < 1 or self.batch_delay_ms < 0 or self.batch_wait_ms < 0:
            raise ConfigError("need batch_min >= 1, batch_delay_ms >= 0, batch_wait_ms >= 0")
        if self.admin_port and not self.admin_token and not is_loopback(self.admin_host):
            raise ConfigError(
                f"admin host {self.admin_host} is not loopback and no admin token is set: "
                "pass --admin-token (or IMGW_ADMIN_TOKEN) so that POST /drain is authenticated"
            )
        try:
            parse_api_keys(self.api_keys)
        except ValueError as e:
            raise ConfigError(f"bad api key: {e}") from e
        if self.api_keys and not self.admin_port:
            raise ConfigError("api keys are presented to the admin listener: set --admin-port")
        if not (math.isfinite(self.frame_timeout) and self.frame_timeout > 0):
            raise ConfigError("frame_timeout must be a positive number of seconds")
        if self.max_partial_bytes < self.max_frame:
            raise ConfigError("max_partial_bytes must hold at least one max_frame")
        if self.check_fail not in ("open", "closed"):
            raise ConfigError("check_fail must be open or closed")
        if self.check_url and not self.check_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"--check-url must be an http:// or https:// URL, got {self.check_url!r}"
            )
        if self.notify_url and not self.notify_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"--notify-url must be an http:// or https:// URL, got {self.notify_url!r}"
            )
        if self.push_url and not self.push_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"--push-url must be an http:// or https:// URL, got {self.push_url!r}"
            )
        if self.push_amqp and not self.push_amqp.startswith(("amqp://", "amqps://")):
            raise ConfigError(
                f"--push-amqp must be an amqp:// or amqps:// URL, got {self.push_amqp!r}"
            )
        if self.notify_queue_max < 1 or self.notify_batch_max < 1:
            raise ConfigError("need notify_queue_max >= 1 and notify_batch_max >= 1")
        if not (self.check_timeout_ms > 0 and self.check_pool >= 1):
            raise ConfigError("need check_timeout_ms > 0 and check_pool >= 1")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                raise ConfigError(f"--{name.replace('_', '-')} {path}: not a readable file")
        if self.groups_per_day < 1 or self.max_conversations < 1:
            raise ConfigError("need groups_per_day >= 1 and max_conversations >= 1")
        if self.token_max_lifetime < 60:
            raise ConfigError("token_max_lifetime must be at least 60 seconds")
        for name in ("rate", "op_rate", "typing", "api_broadcast"):
            burst = getattr(self, f"{name}_burst")
            per_s = getattr(self, f"{name}_per_s")
            if burst < 1 or not (math.isfinite(per_s) and per_s > 0):
                raise ConfigError(f"need {name}_burst >= 1 and {name}_per_s > 0")
        if not (math.isfinite(self.route_check_s) and self.route_check_s > 0):
            raise ConfigError("route_check_s must be a positive number of seconds")
        if not (math.isfinite(self.node_lease_s) and self.node_lease_s >= 2):
            raise ConfigError("node_lease_s must be at least 2 seconds (renewed every second)")
        if not (math.isfinite(self.drain_rate) and math.isfinite(self.sync_hint_spread_s)):
            raise ConfigError("drain_rate and sync_hint_spread_s must be finite numbers")
        if self.workers < 1 or self.drain_rate < 0 or self.sync_hint_spread_s < 0:
            raise ConfigError("need workers >= 1, drain_rate >= 0, sync_hint_spread_s >= 0")
        shared = self.cache.startswith(REDIS_URLS) and self.bus.startswith(("amqp://", "amqps://"))
        if self.workers > 1 and not shared:
            raise ConfigError(
                "--workers N needs a shared route store and bus so that workers reach "
                "each other's connections: pass --cache redis://... and --bus amqp://..."
            )
        if self.log_format not in ("console", "json"):
            raise ConfigError("log_format must be console or json")
        self._validate_media()
        self._validate_ws()
        for name, url in (("store", self.store_url()), ("cache", self.cache), ("bus", self.bus)):
            if "://" not in url:
                raise ConfigError(f"--{name} must be a URL like scheme://..., got {url!r}")

    def _validate_ws(self) -> None:
        if self.ws_listen:
            try:
                split_host_port(self.ws_listen, any_port=True)
            except ValueError as e:
                raise ConfigError(f"ws_listen: {e}") from None
        try:
            parse_origins(self.ws_origins)
        except ValueError as e:
            raise ConfigError(f"ws_origins: {e}") from None

    def ws_origin_set(self) -> frozenset[str] | None:
        """The origins `ws_origins` allows (None: any), with its default applied."""
        if not self.ws_origins:
            host = split_host_port(self.ws_listen, any_port=True)[0] if self.ws_listen else ""
            return None if is_loopback(host) else frozenset()
        return parse_origins(self.ws_origins)

    def _validate_media(self) -> None:
        if not self.media:
            return
        if not self.media.startswith(("file:///", "s3://")):
            raise ConfigError(
                f"--media must be file:///path or s3://bucket/prefix?endpoint=..., "
                f"got {self.media!r}"
            )
        if self.media.startswith("file:") and not self.media_listen:
            raise ConfigError(
                "--media file://... needs --media-listen HOST:PORT: the gateway serves the "
                "signed upload and download URLs of a file:// root itself"
            )
        if self.media_listen:
            try:
                split_host_port(self.media_listen, any_port=True)
            except ValueError as e:
                raise ConfigError(f"media_listen: {e}") from None
        if self.media_public_url and not self.media_public_url.startswith(("http://", "https://")):
            raise ConfigError("--media-public-url must be an http:// or https:// URL")
        if self.media_secret and len(self.media_secret.encode()) < 16:
            raise ConfigError("--media-secret must be at least 16 bytes")
        if self.media_max_size < 1 or self.media_url_ttl < 1 or self.media_orphan_s < 7200:
            raise ConfigError(
                "need media_max_size >= 1, media_url_ttl >= 1 and media_orphan_s >= 7200 "
                "(an upload's sender has until 1 h before the sweep to send it)"
            )
        if self.media_url_ttl + 3600 > self.media_orphan_s:
            # an upload URL must expire before the sweep may forget its row: a PUT after
            # that stores a file no row tracks, which no sweep ever deletes
            raise ConfigError("media_url_ttl must end an hour before media_orphan_s")
        if not self.media_types:
            raise ConfigError("media_types lists no content type")


_FIELDS: Final = {f.name: f for f in fields(Config)}
_LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
# Settings that must be at least 1 (counts and sizes) or a number of seconds or ms > 0;
# the rest of the numbers are checked in validate() with their neighbours.
_AT_LEAST_ONE: Final = (
    "max_frame", "max_content", "max_connections", "max_write_buffer", "max_pending_sends",
    "max_partial_bytes",
)  # fmt: skip
_POSITIVE: Final = (
    "login_timeout", "route_renew_s", "recall_window", "shutdown_timeout",
    "check_timeout_ms",
)  # fmt: skip
_NOT_NEGATIVE: Final = (
    "max_connections_per_ip", "max_connections_per_uid", "token_leeway", "batch_delay_ms",
    "batch_wait_ms", "media_max_connections_per_ip",
)  # fmt: skip


def _check_numbers(cfg: Config) -> None:
    for name in _AT_LEAST_ONE:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    for name in _POSITIVE:
        value = getattr(cfg, name)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{name} must be a number above 0, got {value}")
    for name in _NOT_NEGATIVE:
        value = getattr(cfg, name)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be a number >= 0, got {value}")


# The settings whose flag is spelled otherwise than the field (--token-key is repeated
# for token_keys; the flags of the *_s durations drop the unit): the file and the
# environment take both spellings.
FLAG_SPELLINGS: Final = {
    "token_key": "token_keys",
    "api_key": "api_keys",
    "sync_hint_spread": "sync_hint_spread_s",
    "node_lease": "node_lease_s",
    "route_check": "route_check_s",
    "media_orphan": "media_orphan_s",
}


def setting_name(key: str) -> str | None:
    """The Config field that a file key or an environment name (after IMGW_) sets:
    flag spelling or field spelling, dashes or underscores, any case; None if none."""
    name = key.replace("-", "_").lower()
    name = FLAG_SPELLINGS.get(name, name)
    return name if name in _FIELDS else None


def _unknown(key: str, path: str) -> ConfigError:
    spellings = [*_FIELDS, *FLAG_SPELLINGS]
    close = difflib.get_close_matches(key.replace("-", "_"), spellings, n=1)
    hint = f" (did you mean {close[0].replace('_', '-')}?)" if close else ""
    return ConfigError(
        f"unknown setting {key!r} in {path}{hint}; imgw.example.toml lists every setting"
    )


def _coerce(name: str, raw: Any) -> Any:
    kind = _FIELDS[name].type
    try:
        if kind == "tuple[str, ...]":
            if isinstance(raw, str):
                return tuple(p.strip() for p in raw.split(",") if p.strip())
            return tuple(str(p) for p in raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return str(raw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"setting {name}: cannot use {raw!r} ({e})") from e


def load(
    overrides: Mapping[str, Any] | None = None,
    *,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Merge file, environment and explicit overrides (flags); None values are ignored."""
    values: dict[str, Any] = {}
    path = config_file or (env or os.environ).get(ENV_PREFIX + "CONFIG")
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config file {path}: {e}") from e
        for key, raw in data.items():
            if (name := setting_name(key)) is None:
                raise _unknown(key, path)
            values[name] = _coerce(name, raw)
    for key, raw in (env if env is not None else os.environ).items():
        if key.startswith(ENV_PREFIX) and key != ENV_PREFIX + "CONFIG":
            name = setting_name(key[len(ENV_PREFIX) :])
            if name is not None:
                values[name] = _coerce(name, raw)
    for name, raw in (overrides or {}).items():
        if raw is None or (name in ("token_keys", "api_keys") and not raw):
            continue
        values[name] = _coerce(name, raw)
    return dataclasses.replace(Config(), **values)
