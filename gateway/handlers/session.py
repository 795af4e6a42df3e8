"""LOGIN, PING (when queued behind other requests) and LOGOUT (which also removes the
device's push registration: gateway/handlers/push.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.handlers.push import unregister_at_logout
from gateway.ports import TooManyConnections
from protocol.frames import Login, LoginOk, Logout, Ping, Pong
from protocol.ops import KNOWN_CAPS, PROTOCOL_VERSION, ErrorCode
from protocol.token import DEVICE_RE, TokenError, verify_token
from storage.errors import BackendUnavailable, Revoked

if TYPE_CHECKING:
    from gateway.ports import Services, Session


_NO_CAPS: frozenset[str] = frozenset()
_CAPS: dict[frozenset[str], frozenset[str]] = {}


async def login(node: Services, conn: Session, f: Login) -> None:
    if conn.active:
        conn.error(f.rid, ErrorCode.BAD_REQUEST, "already logged in")
        return
    if f.v != PROTOCOL_VERSION:
        node.metrics.logins.labels(result="version").inc()
        conn.fail(ErrorCode.VERSION_UNSUPPORTED, f"protocol v{f.v} unsupported; use v1", f.rid)
        return
    if DEVICE_RE.fullmatch(f.device) is None:
        node.metrics.logins.labels(result="bad_request").inc()
        conn.fail(ErrorCode.BAD_REQUEST, "device must match [A-Za-z0-9_-]{1,32}", f.rid)
        return
    cfg = node.config
    try:
        claims = verify_token(
            f.token,
            node.keyring,
            uid=f.uid,
            device=f.device,
            now=time.time(),
            leeway=cfg.token_leeway,
            max_lifetime=cfg.token_max_lifetime,
        )
    except TokenError as e:
        node.metrics.logins.labels(result="auth_failed").inc()
        node.log.info("login refused", uid=f.uid, device=f.device, reason=e.reason)
        conn.fail(ErrorCode.AUTH_FAILED, "token refused", f.rid)
        return
    caps = _NO_CAPS
    if f.caps:  # one shared set per combination: connections hold no copy of their own
        known = frozenset(c for c in f.caps if c in KNOWN_CAPS)
        caps = _CAPS.setdefault(known, known)
    try:
        opened = await conn.log_in(f.uid, f.device, claims.exp, claims.iat, caps)
    except TooManyConnections as e:
        node.metrics.logins.labels(result="too_many").inc()
        conn.fail(ErrorCode.RATE_LIMITED, str(e), f.rid)
        return
    except Revoked:
        node.metrics.logins.labels(result="auth_failed").inc()
        node.log.info("login refused", uid=f.uid, device=f.device, reason="revoked")
        conn.fail(ErrorCode.AUTH_FAILED, "token revoked", f.rid)
        return
    except BackendUnavailable as e:
        if (held := node.log_throttle.allow("login")) is not None:
            node.log.warning(
                "login failed: route store unavailable", error=str(e), similar_held_back=held
            )
        conn.fail(ErrorCode.UNAVAILABLE, "route store unavailable; retry", f.rid)
        return
    if not opened:
        return  # the connection closed while the route was being written
    node.metrics.logins.labels(result="ok").inc()
    # A request pipelined behind the LOGIN (apps send SYNC in the same write) answers in
    # the same write as LOGIN_OK.
    conn.send_ahead(
        LoginOk(
            f.rid,
            node.node_id,
            cfg.hb,
            cfg.idle,
            cfg.max_frame,
            cfg.max_content,
            int(time.time() * 1000),
        )
    )


async def ping(node: Services, conn: Session, f: Ping) -> None:
    conn.send(Pong())


async def logout(node: Services, conn: Session, f: Logout) -> None:
    uid, device, active = conn.uid, conn.device, conn.active
    await conn.log_out()
    if active:  # not a connection a newer login of the device replaced
        await unregister_at_logout(node, uid, device)
    conn.close()
