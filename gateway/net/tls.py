"""TLS on the client and WebSocket ports, seen from the operator's side: which
certificate is served and until when (logged at start and checked daily, a warning
once it expires within `EXPIRY_WARN_DAYS`), and how many handshakes fail and why.

Handshakes are counted in the TLS library's own object: the context's `sslobject_class`
(the standard library's hook for it) is a subclass of ssl.SSLObject whose
`do_handshake` counts a completed handshake, and an ssl.SSLError as a failure labelled
with the library's reason (`wrong_version_number`: plain text on the TLS port;
`tlsv1_alert_unknown_ca`: the client does not trust the certificate). A client that
refuses the certificate without telling (Python's asyncio closes without sending its
alert) and a handshake cut at the login timeout leave an object that received bytes
and never finished: it counts as `abandoned` when it is freed with its connection. A
peer that sent nothing (a TCP health check) has failed nothing and is not counted.
The counts are plain integers that `Metrics.watch_tls` exposes: nothing is locked, so
counting from a finalizer is safe.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from gateway.metrics import Metrics
from gateway.net.certinfo import CertInfo, describe, read_pem

EXPIRY_WARN_DAYS: Final = 14
CHECK_EVERY_S: Final = 86_400.0


class HandshakeStats:
    """Server handshakes: completed, and failed by reason."""

    __slots__ = ("completed", "failed")

    def __init__(self) -> None:
        self.completed = 0
        self.failed: dict[str, int] = {}

    def fail(self, reason: str) -> None:
        self.failed[reason] = self.failed.get(reason, 0) + 1


def count_handshakes(ctx: ssl.SSLContext, stats: HandshakeStats) -> None:
    """Count the server handshakes of `ctx` in `stats`."""

    class CountedSSLObject(ssl.SSLObject):
        # do_handshake is called once as the connection opens, then once per read
        steps = 0
        counted = False  # each handshake's outcome once

        def do_handshake(self) -> None:
            self.steps += 1
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise  # more bytes to come: not an outcome yet
            except ssl.SSLError as e:
                if not self.counted:
                    self.counted = True
                    stats.fail(failure_reason(e))
                raise
            if not self.counted:
                self.counted = True
                stats.completed += 1

        def __del__(self) -> None:
            if not self.counted and self.steps > 1:
                stats.fail("abandoned")

    ctx.sslobject_class = CountedSSLObject


def failure_reason(error: ssl.SSLError) -> str:
    """The TLS library's short reason for a failed handshake, lower case."""
    reason = getattr(error, "reason", None)
    if isinstance(reason, str) and reason:
        return reason.lower()
    return type(error).__name__.lower()


def iso_day(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M UTC")


def summary(info: CertInfo | None) -> str:
    """What the startup line says of the served certificate."""
    if info is None:
        return "on"
    return f"on ({describe(info)}; expires {iso_day(info.not_after)})"


class CertificateWatch:
    """The served certificate (read once: what the context loaded at start is what is
    served until a restart) and the handshakes: exposes both in `metrics`, logs the
    certificate, and warns while it expires within EXPIRY_WARN_DAYS; `check` runs at
    start and then every CHECK_EVERY_S."""

    def __init__(
        self, cert_path: str, log: Any, metrics: Metrics, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.log = log
        self._clock = clock
        self.handshakes = HandshakeStats()
        self.info: CertInfo | None = None
        try:
            self.info = read_pem(Path(cert_path).read_text(errors="replace"))
        except (OSError, ValueError) as e:
            log.warning("TLS certificate: cannot read its names and expiry", error=str(e))
        metrics.watch_tls(self.handshakes, self.info.not_after if self.info else None)

    def serve(self, ctx: ssl.SSLContext) -> None:
        """Count the handshakes of `ctx` (the context that serves the certificate)."""
        count_handshakes(ctx, self.handshakes)

    def started(self) -> None:
        """The start's log line, then the expiry check."""
        info = self.info
        if info is not None:
            self.log.info(
                "TLS on",
                names=describe(info),
                expires=iso_day(info.not_after),
                days_left=int(info.expires_in_days(self._clock())),
            )
        self.check()

    async def check_async(self) -> None:
        self.check()

    def check(self) -> None:
        info = self.info
        if info is None:
            return
        days = info.expires_in_days(self._clock())
        if days <= 0:
            self.log.error(
                "the TLS certificate has expired: clients refuse it; renew it and restart",
                names=describe(info),
                expired=iso_day(info.not_after),
            )
        elif days <= EXPIRY_WARN_DAYS:
            self.log.warning(
                f"the TLS certificate expires within {EXPIRY_WARN_DAYS} days: renew it "
                "and restart the gateway",
                names=describe(info),
                expires=iso_day(info.not_after),
                days_left=round(days, 1),
            )
