"""One asyncio.Protocol per socket: framing, the session state machine, liveness,
write-buffer limits and the in-order request queue. The op semantics live in
`gateway.handlers`; this module only moves frames.

Every state transition of a connection happens in this module:

    AWAIT_LOGIN --LOGIN--> LOGGING_IN --route installed (activate)--> ACTIVE
         |                     |                                        |
         +---------------------+--- fail / kick / close / timeout ------+--> CLOSING
                                                                              |
                                                   socket gone (connection_lost) --> CLOSED

The node installs the route of a LOGIN and calls `activate`; it never writes a
connection's fields. What the connection needs from its node is the `Hub` Protocol below.

An idle connection owns no task and no timer handle: the node's timing wheel drives its
login deadline, idle timeout, token expiry and route renewal. A task exists only while
the connection has requests in flight.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import sys
import termios
import time
from collections import deque
from typing import TYPE_CHECKING, Final, Protocol, cast

from gateway.handlers import dispatch, dispatch_now
from gateway.ports import Services
from protocol.codec import encode
from protocol.decoder import FrameDecoder
from protocol.errors import FrameError
from protocol.frames import (
    Delivered,
    Error,
    Invalid,
    Kick,
    Login,
    Logout,
    Ping,
    Pong,
    Read,
    Send,
    Typing,
)
from protocol.ops import ErrorCode, KickReason, Op
from storage.models import Route

if TYPE_CHECKING:
    from gateway.ratelimit import UidRateLimiter
    from gateway.wheel import TimingWheel
    from protocol.frames import ClientFrame, Frame, ServerFrame

_PING: Final = encode(Ping())
_PONG: Final = encode(Pong())
CLOSE_GRACE_S: Final = 5.0  # a closing socket that has not flushed by then is aborted
MIN_READ_RATE: Final = 1024  # bytes/s: a peer this slow still gets its last frames
MAX_CLOSE_GRACE_S: Final = 300.0
LOGIN_WORK_FACTOR: Final = 3  # a received LOGIN's time to complete, in login_timeouts
CORK_MAX_S: Final = 0.2  # the longest send_ahead holds a frame for the next answer
# Frames decoded at a time. Over its op budget a connection stops there: the rest of the
# read waits undecoded (counted with unfinished frames against max_partial_bytes), and it
# is not read until its uid's bucket holds READ_BATCH tokens again (TCP slows the
# client), so a flood costs the node at most READ_BATCH frames per refill, not a read
# buffer (256 KiB: ~37,000 TYPING frames).
READ_BATCH: Final = 32
MAX_OVER_BUDGET_PAUSE_S: Final = 2.0  # a pause never keeps a client's PINGs unread longer
_UNBUDGETED: Final = frozenset({Ping, Send, Login, Logout})  # SEND has its own limit
# Positions a client asked to store, handled even when its connection closed (or began
# to) before they were: an app marks a conversation read and goes to the background.
# Every other request read but not handled by then is dropped: its answer has nowhere
# to go, and the client repeats it (a SEND with the same client_msg_id).
_AFTER_CLOSE: Final = frozenset({Read, Delivered})
_OVER_BUDGET: Final = "too many requests; slow down"
_NO_CAPS: Final[frozenset[str]] = frozenset()


def _kernel_queued(transport: asyncio.Transport) -> int:
    """Bytes in the socket's send queue (SIOCOUTQ), 0 where unknown."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        buf = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int.from_bytes(buf, sys.byteorder)


class Backlog:
    """Frames for a connection whose transport is past its high-water mark."""

    __slots__ = ("frames", "size")

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.size = 0


class Hub(Services, Protocol):
    """What a connection needs from its node, beyond what its handlers need."""

    wheel: TimingWheel
    decoder: FrameDecoder  # the shared decoder of whole frames (see data_received)
    partial_bytes: int  # unfinished frames held by all connections
    backlog: dict[Connection, Backlog]
    corked: dict[Connection, bytes]  # frames held by send_ahead for the next answer
    held: set[Connection]  # not read: send backpressure
    penalized: set[Connection]  # not read: over the op budget, until _end_penalty
    accepting: bool  # False while draining
    op_limiter: UidRateLimiter
    typing_limiter: UidRateLimiter

    def new_decoder(self) -> FrameDecoder: ...

    def admit(self, conn: Connection, peer_ip: str = "") -> int:
        """A new connection id, or 0: refused (full, draining, too many from its IP)."""

    def closing(self, conn: Connection, *, was_active: bool) -> None:
        """`conn` started closing: stop routing to it."""

    def forget(self, conn: Connection, *, was_active: bool) -> None:
        """`conn`'s socket is gone."""

    def write_soon(self, conn: Connection, frame: bytes) -> None:
        """Write `frame` with the others for `conn` at the end of this loop iteration."""

    def renew_route(self, conn: Connection) -> None: ...

    async def open_session(
        self, conn: Connection, uid: int, device: str, exp: int, iat: int | None
    ) -> Route | None:
        """Install the route of a verified LOGIN; None when `conn` lost (it was kicked,
        or closed meanwhile). TooManyConnections past max_connections_per_uid."""

    async def end_session(self, conn: Connection) -> None: ...

    def hold_sends(self, conn: Connection) -> None: ...


class State(enum.IntEnum):
    AWAIT_LOGIN = 0
    LOGGING_IN = 1
    ACTIVE = 2
    CLOSING = 3
    CLOSED = 4


class Connection(asyncio.Protocol):
    """`phase_deadline` is when the current phase must end: before ACTIVE, the LOGIN
    deadline; while ACTIVE, that of the unfinished frame (0: none); while CLOSING, the
    moment the socket is aborted if the peer has not taken our last bytes."""

    __slots__ = (
        "caps",
        "conn_id",
        "decoder",
        "inbox",
        "last_renew",
        "last_rx",
        "node",
        "peer_ip",
        "phase_deadline",
        "route",
        "state",
        "task",
        "timer_at",
        "timer_slot",
        "token_deadline",
        "transport",
    )

    def __init__(self, node: Hub) -> None:
        self.node = node
        self.conn_id = 0
        self.transport: asyncio.Transport | None = None
        self.decoder: FrameDecoder | None = None
        self.state = State.AWAIT_LOGIN
        self.route: Route | None = None
        self.last_rx = 0.0
        self.last_renew = 0.0
        self.phase_deadline = 0.0
        self.token_deadline = 0.0
        self.timer_at = 0.0
        self.timer_slot = 0
        self.inbox: deque[ClientFrame] | None = None
        self.task: asyncio.Task[None] | None = None
        self.caps: frozenset[str] = _NO_CAPS  # the known capabilities its LOGIN listed
        self.peer_ip = ""  # with max_connections_per_ip only (the node counts by it)

    # -- identity -----------------------------------------------------------------------

    @property
    def uid(self) -> int:
        return self.route.uid if self.route is not None else 0

    @property
    def device(self) -> str:
        return self.route.device if self.route is not None else ""

    @property
    def paused(self) -> bool:
        """Not read from (a full request queue, send backpressure, a penalty, a drain):
        the transport's own state, no slot of ours."""
        transport = self.transport
        return transport is not None and not transport.is_reading()

    @property
    def active(self) -> bool:
        return self.state == State.ACTIVE

    @property
    def logging_in(self) -> bool:
        return self.state == State.LOGGING_IN

    # -- session ----------------------------------------------------------------------

    async def log_in(
        self, uid: int, device: str, exp: int, iat: int | None, caps: frozenset[str]
    ) -> bool:
        """LOGIN verified: install the route (the node kicks an older login of the same
        device) and become ACTIVE. False when this connection lost or closed meanwhile."""
        route = await self.node.open_session(self, uid, device, exp, iat)
        if route is None:
            return False
        self._activate(route, exp + self.node.config.token_leeway, caps)
        return True

    def _activate(self, route: Route, token_expires: float, caps: frozenset[str]) -> None:
        node = self.node
        cfg = node.config
        now = node.loop.time()
        self.route = route
        self.state = State.ACTIVE
        self.caps = caps
        self.phase_deadline = 0.0  # from now on that of an unfinished frame
        self.last_renew = now
        self.token_deadline = now + (token_expires - time.time())
        node.wheel.schedule(
            self, min(self.last_rx + cfg.idle, now + cfg.route_renew_s, self.token_deadline)
        )

    async def log_out(self) -> None:
        if self.active:
            await self.node.end_session(self)

    def hold_sends(self) -> None:
        self.node.hold_sends(self)

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        node = self.node
        peer_ip = ""
        if node.config.max_connections_per_ip:  # only then is the address worth its bytes
            peer = transport.get_extra_info("peername")
            peer_ip = sys.intern(peer[0]) if peer else ""  # one string an address
        conn_id = node.admit(self, peer_ip)
        if not conn_id:
            transport.abort()
            self.state = State.CLOSED
            return
        self.conn_id = conn_id
        now = node.loop.time()
        self.last_rx = now
        self.phase_deadline = now + node.config.login_timeout
        node.wheel.schedule(self, self.phase_deadline)

    def data_received(self, data: bytes) -> None:
        if self.state >= State.CLOSING:
            return
        node = self.node
        self.last_rx = node.loop.time()
        decoder = self.decoder  # only while a partial frame waits: see below
        if data == _PING and decoder is None and self.state == State.ACTIVE:
            self.write(_PONG)  # a heartbeat alone in its read, the common case: no decoding
            return
        # READ_BATCH frames at a time, until none is left or the connection stops reading
        # (over its budget: the rest waits undecoded, and _decode_ahead goes on with it)
        while True:
            decoder = self.decoder
            held = 0
            if decoder is None:
                # Whole frames are decoded by the node's shared decoder, which then holds
                # nothing: an idle connection owns no decoder (72 bytes each). A read that
                # ends inside a frame (or stops at READ_BATCH while not read) leaves that
                # decoder with the rest: this connection keeps it, and the node takes a
                # fresh one.
                decoder = node.decoder  # always clean: a partial or failed one is replaced
            else:
                held = decoder.buffered
            try:
                frames = decoder.feed(data, READ_BATCH)
            except FrameError as e:
                if decoder is node.decoder:
                    node.decoder = node.new_decoder()  # a failed decoder stays failed
                else:
                    node.partial_bytes -= held
                    self.decoder = None
                for frame in e.frames:
                    self._accept(frame)
                self.fail(e.code, str(e))
                return
            if buffered := decoder.buffered:
                if decoder is node.decoder:
                    self.decoder, node.decoder = decoder, node.new_decoder()
                if decoder.ahead:  # whole frames wait: no frame deadline, the client is done
                    if not self.unfinished_frame(buffered - held, False):
                        return
                    if self.state == State.ACTIVE:
                        self.phase_deadline = 0.0
                # the unfinished frame started in this read, or none had a deadline yet
                elif not self.unfinished_frame(
                    buffered - held, bool(frames) or not self.phase_deadline
                ):
                    return
            elif decoder is self.decoder:
                self.decoder = None  # the frame completed: back to owning none
                self.frame_finished(held)
            for frame in frames:
                if self.state >= State.CLOSING:
                    return
                self._accept(frame)
            # Within budget the next batch follows (at most a read's frames in all).
            if not decoder.ahead or self.state >= State.CLOSING or self.paused:
                return
            data = b""

    def _decode_ahead(self) -> None:
        """Reading resumed: decode the frames that waited, unless paused again since."""
        decoder = self.decoder
        if decoder is not None and decoder.ahead and self.state < State.CLOSING and not self.paused:
            self.data_received(b"")

    def _resume(self) -> None:
        """Read again; the frames that wait undecoded go first, in the next iteration."""
        transport = self.transport
        assert transport is not None
        transport.resume_reading()  # (a draining node resumes nothing: see callers)
        if self.decoder is not None and self.decoder.ahead:
            self.node.loop.call_soon(self._decode_ahead)

    def unfinished_frame(self, grown: int, started: bool) -> bool:
        """The transport holds `grown` more bytes of an unfinished frame (TCP: in this
        connection's decoder; WebSocket: in its transport). The node's total is bounded
        by max_partial_bytes, and a frame that `started` has frame_timeout to complete.
        False when that failed the connection."""
        node = self.node
        node.partial_bytes += grown
        if self.state == State.ACTIVE and started:
            self.phase_deadline = self.last_rx + node.config.frame_timeout
            node.wheel.schedule(self, self.phase_deadline)
        if node.partial_bytes > node.config.max_partial_bytes:
            self.fail(ErrorCode.BAD_FRAME, "server busy: too many unfinished frames")
            return False
        return True

    def frame_finished(self, held: int) -> None:
        """The unfinished frame of `held` bytes completed (or its connection is gone)."""
        self.node.partial_bytes -= held
        if self.state == State.ACTIVE:
            self.phase_deadline = 0.0

    def _mid_frame(self) -> bool:
        """A frame has started and not completed, here or in a WebSocket transport."""
        return self.decoder is not None or getattr(self.transport, "unfinished", 0) > 0

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        prev = self.state
        self.state = State.CLOSED
        self.timer_at = 0.0
        self.node.backlog.pop(self, None)
        self.node.corked.pop(self, None)
        if self.decoder is not None:
            self.node.partial_bytes -= self.decoder.buffered
            self.decoder = None
        inbox = self.inbox
        if inbox and prev >= State.ACTIVE and self.task is not None:
            self.inbox = deque(f for f in inbox if type(f) in _AFTER_CLOSE) or None
        else:
            self.inbox = None
        self.node.forget(self, was_active=prev >= State.ACTIVE)

    def pause_writing(self) -> None:
        """The transport's buffer is past its high-water mark: frames wait in the node's
        backlog for this connection from now on, so that the transport only ever holds
        whole frames up to about that mark, and a slow_consumer KICK can still be sent
        after them (the backlog is dropped instead)."""
        if self.state < State.CLOSING and self not in self.node.backlog:
            self.node.backlog[self] = Backlog()

    def resume_writing(self) -> None:
        backlog = self.node.backlog.pop(self, None)
        transport = self.transport
        if backlog and backlog.frames and transport is not None and self.state < State.CLOSING:
            transport.writelines(backlog.frames)

    # -- inbound ------------------------------------------------------------------------

    def _accept(self, frame: Frame | Invalid) -> None:
        if self.state == State.AWAIT_LOGIN:
            if isinstance(frame, Login):
                self.state = State.LOGGING_IN
                # The client was in time; what is left is the node's own work. A node
                # slow to get through a reconnect storm must not blame its client with
                # `not_logged_in` (hundreds of clients a storm, each then backing off
                # for up to 10 s): it gets LOGIN_WORK_FACTOR times login_timeout, and
                # past that the answer is `unavailable`.
                cfg = self.node.config
                self.phase_deadline = self.last_rx + LOGIN_WORK_FACTOR * cfg.login_timeout
            elif isinstance(frame, Invalid):
                if frame.op == Op.LOGIN:  # a LOGIN with bad fields
                    self.fail(ErrorCode.BAD_REQUEST, frame.text, frame.rid)
                else:
                    self.fail(ErrorCode.NOT_LOGGED_IN, "LOGIN must come first", frame.rid)
                return
            else:
                self.fail(
                    ErrorCode.NOT_LOGGED_IN, "LOGIN must come first", getattr(frame, "rid", 0)
                )
                return
        elif self.state == State.ACTIVE:
            if type(frame) is Ping:
                self.write(_PONG)  # no queue, no task; always answered, but a PING that
                # came with other frames (a lone one takes data_received's fast path)
                # draws on the op budget: pipelined PINGs are a flood like any other
                if not self.node.op_limiter.take(self.uid):
                    self._slow_down()
                return
            if type(frame) not in _UNBUDGETED and not self._within_budget(frame):
                return
            if self.task is None and dispatch_now(self.node, self, frame):
                return  # handled in order: nothing was queued ahead of it
        inbox = self.inbox
        if inbox is None:
            inbox = self.inbox = deque()
        inbox.append(frame)  # type: ignore[arg-type]
        if self.task is None:
            self.task = self.node.loop.create_task(self._drain())
        if len(inbox) >= self.node.config.max_inflight_requests and not self.paused:
            assert self.transport is not None
            self.transport.pause_reading()

    def _within_budget(self, frame: Frame | Invalid) -> bool:
        """Draw on the uid's op budget (and TYPING on its own). Over the op budget a
        request is answered `rate_limited` (TYPING is dropped) and the connection is not
        read until the budget holds READ_BATCH tokens again (at most
        MAX_OVER_BUDGET_PAUSE_S): what the read brought beyond the current batch waits
        undecoded. The refusals of one batch go out in one write."""
        node = self.node
        uid = self.uid
        limiter = node.op_limiter
        if not limiter.take(uid):
            node.metrics.ops_limited.labels(why="budget").inc()
            if type(frame) is not Typing:
                rid = getattr(frame, "rid", 0)
                node.write_soon(self, encode(Error(rid, int(ErrorCode.RATE_LIMITED), _OVER_BUDGET)))
            self._slow_down()
            return False
        if type(frame) is Typing and not node.typing_limiter.take(uid):
            node.metrics.ops_limited.labels(why="typing").inc()
            return False  # an indicator: a later one says the same
        return True

    def _slow_down(self) -> None:
        """Over the op budget: not read until it holds READ_BATCH tokens again (at most
        MAX_OVER_BUDGET_PAUSE_S); what the read brought beyond this batch waits."""
        node = self.node
        if self.hold_reading():
            node.penalized.add(self)
            pause = min(node.op_limiter.wait_s(self.uid, READ_BATCH), MAX_OVER_BUDGET_PAUSE_S)
            node.loop.call_later(pause, self._end_penalty)

    def _end_penalty(self) -> None:
        self.node.penalized.discard(self)
        if self not in self.node.held:  # send backpressure releases it itself
            self.release_reading()

    def hold_reading(self) -> bool:
        """Stop reading (send backpressure); False if not reading anyway."""
        transport = self.transport
        if self.paused or transport is None or self.state >= State.CLOSING:
            return False
        transport.pause_reading()
        return True

    def release_reading(self) -> None:
        """Read again after hold_reading, unless the request queue still needs the pause
        or the node is draining (a draining node keeps its connections paused)."""
        transport = self.transport
        if (
            not self.paused
            or transport is None
            or self.state >= State.CLOSING
            or not self.node.accepting
            or self in self.node.penalized  # _end_penalty releases it
        ):
            return
        if self.inbox and len(self.inbox) >= self.node.config.max_inflight_requests // 2:
            return  # _drain resumes it when the queue is down
        self._resume()

    async def _drain(self) -> None:
        """Handle queued requests one at a time, in arrival order; once the connection
        is closing, only the positions among them (_AFTER_CLOSE)."""
        low_water = self.node.config.max_inflight_requests // 2
        try:
            node = self.node
            while inbox := self.inbox:
                frame = inbox.popleft()
                if self.state >= State.CLOSING and type(frame) not in _AFTER_CLOSE:
                    continue
                ahead = bool(node.corked) and self in node.corked  # held for this answer
                await dispatch(node, self, frame)
                if ahead:
                    self.uncork()  # the request answered nothing: it goes alone
                # Not while draining: a connection paused for its drain step stays paused.
                if (
                    self.paused
                    and len(inbox) < low_water
                    and self.state < State.CLOSING
                    and self.node.accepting
                    and self not in self.node.held
                    and self not in self.node.penalized
                ):
                    self._resume()
        finally:
            self.task = None
            self.inbox = None  # an idle connection holds no queue (a deque is ~760 bytes)

    # -- outbound -----------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or self.state >= State.CLOSING:
            return
        node = self.node
        if node.corked and (ahead := node.corked.pop(self, None)) is not None:
            data = ahead + data  # a LOGIN_OK held for this answer (send_ahead)
        backlog = node.backlog
        if backlog and (waiting := backlog.get(self)) is not None:
            waiting.frames.append(data)  # the transport is past its high-water mark
            waiting.size += len(data)
            if waiting.size > node.config.max_write_buffer:
                self.kick(KickReason.SLOW_CONSUMER, "write buffer full")
            return
        transport.write(data)

    def send(self, frame: ServerFrame) -> None:
        self.write(encode(frame))

    def send_ahead(self, frame: ServerFrame) -> None:
        """Send `frame` in one write with the answer to the request queued behind the one
        being handled: a LOGIN_OK with the answer to the SYNC a client pipelined behind
        its LOGIN, one write and one wakeup of the client fewer (a reconnect storm is
        thousands a second). At once when nothing is queued; otherwise once the next
        request is handled, whether it answered or not, or after CORK_MAX_S at the
        latest, or before the frame that closes the connection."""
        data = encode(frame)
        if not self.inbox or self.state >= State.CLOSING:
            self.write(data)
            return
        node = self.node
        node.corked[self] = data
        node.loop.call_later(CORK_MAX_S, self.uncork)

    def uncork(self) -> None:
        """Write what send_ahead holds, if anything."""
        corked = self.node.corked
        if corked and (data := corked.pop(self, None)) is not None:
            self.write(data)

    def error(self, rid: int, code: ErrorCode, text: str = "") -> None:
        """Answer with ERROR; errors that close the connection close it."""
        if code.closes_connection or self.state < State.ACTIVE:
            self.fail(code, text, rid)
        else:
            self.send(Error(rid, int(code), text))

    def fail(self, code: ErrorCode, text: str, rid: int = 0) -> None:
        """Send a closing ERROR and close."""
        self.node.metrics.errors.labels(code=code.name.lower()).inc()
        self._close_with(encode(Error(rid, int(code), text)))

    def kick(self, reason: KickReason, text: str = "", reconnect_hint: str = "") -> None:
        self.node.metrics.kicks.labels(reason=reason.name.lower()).inc()
        transport = self.transport
        if reason == KickReason.SLOW_CONSUMER and transport is not None:
            # What the transport has not begun to write goes too, so that the KICK is
            # right behind the frame on its way (a bare fd's transport can; uvloop's
            # keeps its buffer, whole frames up to about its high-water mark).
            drop = getattr(transport, "drop_unsent", None)
            if drop is not None and self.state < State.CLOSING:
                drop()
        self._close_with(encode(Kick(int(reason), text, reconnect_hint)))

    def close(self) -> None:
        """Close without a frame."""
        self._close_with(None)

    def _close_with(self, last: bytes | None) -> None:
        transport = self.transport
        if transport is None or self.state >= State.CLOSING:
            return
        was = self.state
        self.state = State.CLOSING
        self.node.backlog.pop(self, None)  # undelivered frames go; the last one is sent
        if self.node.corked and (ahead := self.node.corked.pop(self, None)) is not None:
            transport.write(ahead)  # a LOGIN_OK held back: it came first
        if last is not None:
            transport.write(last)
        queued = transport.get_write_buffer_size()
        if getattr(transport, "lingers", False) or not transport.can_write_eof():
            transport.close()  # a bare fd's transport lingers by itself (fdtransport.py)
        else:
            # Closing a socket the peer still writes to (a PING behind the frames it has
            # not read) answers it with a reset, and the peer's kernel then drops what
            # it had not read yet: our last frames. So: FIN after our last byte, and
            # the socket closes when the peer closes its side (or at the deadline).
            queued += _kernel_queued(transport)
            transport.write_eof()
            transport.resume_reading()  # its EOF; what else comes is not looked at
        self.node.closing(self, was_active=was == State.ACTIVE)
        # The peer has CLOSE_GRACE_S to take our last bytes, or longer for more of them
        # at MIN_READ_RATE (what is queued before a slow consumer's KICK).
        grace = min(MAX_CLOSE_GRACE_S, max(CLOSE_GRACE_S, queued / MIN_READ_RATE))
        self.phase_deadline = self.node.loop.time() + grace
        self.timer_at = 0.0
        self.node.wheel.schedule(self, self.phase_deadline)

    # -- timing wheel -------------------------------------------------------------------

    def on_timer(self, now: float) -> float | None:
        state = self.state
        if state == State.CLOSED:
            return None
        if state == State.CLOSING:
            if now >= self.phase_deadline and self.transport is not None:
                self.transport.abort()  # the peer never took our last bytes
                return None
            return self.phase_deadline
        if state < State.ACTIVE:
            if now >= self.phase_deadline:
                if state == State.LOGGING_IN:  # the node's fault, not the client's
                    self.fail(ErrorCode.UNAVAILABLE, "login not completed in time; retry")
                else:
                    self.fail(ErrorCode.NOT_LOGGED_IN, "login timeout")
                return None
            return self.phase_deadline
        cfg = self.node.config
        # Deadlines compared as sums, the form they are returned in: `now - last_rx >=
        # idle` can be false at exactly `last_rx + idle` (float rounding), and the
        # timer would fire again at the same time.
        if now >= self.last_rx + cfg.idle:
            self.close()
            return None
        if self.phase_deadline and now >= self.phase_deadline and self._mid_frame():
            self.fail(ErrorCode.BAD_FRAME, f"frame not completed within {cfg.frame_timeout:g} s")
            return None
        if self.token_deadline and now >= self.token_deadline:
            self.kick(KickReason.AUTH_REVOKED, "token expired")
            return None
        if now >= self.last_renew + cfg.route_renew_s:
            if self.last_rx > self.last_renew:
                self.last_renew = now
                self.node.renew_route(self)
            nxt_renew = now + cfg.route_renew_s
        else:
            nxt_renew = self.last_renew + cfg.route_renew_s
        nxt = min(self.last_rx + cfg.idle, nxt_renew)
        if self.token_deadline:
            nxt = min(nxt, self.token_deadline)
        if self.phase_deadline:
            nxt = min(nxt, self.phase_deadline)
        return nxt
