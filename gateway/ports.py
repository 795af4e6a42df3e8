"""What request handlers and fan-out may use: a session, and the node's services.

Handlers (`gateway.handlers`) and fan-out (`gateway.fanout`) are typed against these two
Protocols, not against `Connection` and `Node`, so that they import neither: the
connection calls the handlers, the node owns the connections and the fan-out, and the
arrows of the import graph all point one way (docs/architecture.md draws them).
`Connection` is the one `Session`; `Node` is the one `Services`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.batcher import SendBatcher
    from gateway.config import Config
    from gateway.logs import Throttle
    from gateway.media import Media
    from gateway.metrics import Metrics
    from gateway.outbox import OutboxKeeper
    from gateway.ratelimit import UidRateLimiter
    from protocol.frames import ServerFrame
    from protocol.ops import ErrorCode, KickReason
    from protocol.token import KeyRing
    from storage.models import Route, StoredMessage
    from storage.ports import ChatStore, RouteStore


class TooManyConnections(Exception):
    """A LOGIN would take its uid past max_connections_per_uid on this node."""


class Session(Protocol):
    """One client connection, as the code that answers its requests sees it."""

    @property
    def conn_id(self) -> int:
        """Unique on this node, across restarts of a node with the same id."""

    @property
    def route(self) -> Route | None:
        """The route its LOGIN installed; None before."""

    @property
    def uid(self) -> int:
        """The logged-in user; 0 before LOGIN succeeds."""

    @property
    def device(self) -> str: ...

    @property
    def active(self) -> bool:
        """Logged in, and not closing."""

    @property
    def caps(self) -> frozenset[str]:
        """The known capabilities its LOGIN listed."""

    async def log_in(
        self, uid: int, device: str, exp: int, iat: int | None, caps: frozenset[str]
    ) -> bool:
        """Install the route of a verified LOGIN and become active; False (and the
        connection kicked or closing) when it cannot."""

    async def log_out(self) -> None:
        """LOGOUT: the route goes at once (the caller closes the connection)."""

    def write(self, data: bytes) -> None:
        """Queue encoded frames (dropped once the connection is closing)."""

    def send(self, frame: ServerFrame) -> None: ...

    def send_ahead(self, frame: ServerFrame) -> None:
        """Send `frame` in one write with the answer to the request queued next, or at
        once when none is queued (a LOGIN_OK with a pipelined SYNC's answer)."""

    def error(self, rid: int, code: ErrorCode, text: str = "") -> None:
        """Answer ERROR; the codes that close the connection close it."""

    def fail(self, code: ErrorCode, text: str, rid: int = 0) -> None:
        """Send a closing ERROR and close."""

    def kick(self, reason: KickReason, text: str = "", reconnect_hint: str = "") -> None: ...

    def close(self) -> None:
        """Close without a frame."""

    def hold_sends(self) -> None:
        """It queued a SEND while the send queue is long: stop reading from it until the
        queue is down (send backpressure)."""


class Services(Protocol):
    """The node, as request handlers see it."""

    node_id: str
    config: Config
    store: ChatStore
    routes: RouteStore
    keyring: KeyRing
    metrics: Metrics
    log: Any  # a structlog BoundLogger bound to the node
    log_throttle: Throttle
    loop: asyncio.AbstractEventLoop
    limiter: UidRateLimiter  # SEND
    group_limiter: UidRateLimiter  # GROUP_CREATE per day
    batcher: SendBatcher
    outbox: OutboxKeeper | None
    media: Media | None  # None: media disabled (no --media)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` in the background, holding a reference until it ends."""

    def push_message(
        self,
        msg: StoredMessage,
        *,
        exclude: Session | None = None,
        uids: Iterable[int] | None = None,
    ) -> None:
        """PUSH a committed message to every online device of its conversation's members
        (or of `uids`), except `exclude`, which sent it."""

    def deliver(self, uids: Sequence[int], payload: bytes, *, skip: Session | None = None) -> None:
        """Write an encoded frame to every online device of `uids` except `skip`."""
