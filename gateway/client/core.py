"""`Client`: one logged-in device. Overview in the package docstring."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import random
import ssl
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Final, TypeAlias, TypeVar

from gateway.client.errors import (
    ClientError,
    ConnectionLost,
    RequestTimeout,
    SessionEnded,
    kick_name,
)
from gateway.client.inbox import ClientStats, Event, FirstPage, Inbox
from gateway.client.link import (
    READ_CHUNK,
    Endpoint,
    Link,
    describe,
    open_link,
    parse_addresses,
)
from protocol.codec import encode
from protocol.errors import FrameError
from protocol.frames import (
    ClientFrame,
    ConvOk,
    ConvRecord,
    Delivered,
    Error,
    Frame,
    GroupCreate,
    GroupInfo,
    GroupInfoResult,
    GroupMembers,
    History,
    HistoryResult,
    Invalid,
    Kick,
    Login,
    LoginOk,
    Logout,
    MediaGet,
    MediaUpload,
    MediaUrl,
    MsgRecord,
    Notice,
    Ok,
    Opaque,
    OpenP2P,
    Ping,
    Pong,
    Presence,
    PresenceResult,
    Pull,
    PullResult,
    Push,
    Read,
    ReadNotify,
    Recall,
    RecallOk,
    Send,
    SendAck,
    ServerFrame,
    Sync,
    SyncHint,
    SyncResult,
    Typing,
    TypingNotify,
)
from protocol.ops import CAP_OUTCOME_UNKNOWN, PROTOCOL_VERSION, ErrorCode, KickReason, MsgType

TokenSource: TypeAlias = str | Callable[[], str | Awaitable[str]]
"""A token, or a callable (sync or async) that mints a fresh one for each login."""

_MAX_RID: Final = (1 << 32) - 1
_PING: Final = encode(Ping())
_LOGOUT: Final = encode(Logout())
_RECONNECTING_KICKS: Final = frozenset({KickReason.DRAINING, KickReason.SHUTDOWN})
_CAPS: Final = (CAP_OUTCOME_UNKNOWN,)
# SEND outcomes answered by sending again with the same client_msg_id (0: no reply)
_SEND_AGAIN: Final = frozenset({0, ErrorCode.UNAVAILABLE, ErrorCode.OUTCOME_UNKNOWN})
_R = TypeVar("_R")


def _retrieve(fut: asyncio.Future[ServerFrame]) -> None:
    """Mark a reply's exception as seen: nobody may await the future any more."""
    if not fut.cancelled():
        fut.exception()


def _expect(reply: ServerFrame, cls: type[_R]) -> _R:
    if isinstance(reply, cls):
        return reply
    raise ClientError(0, f"expected {cls.__name__}, got {type(reply).__name__}")


class _Incoming:
    __slots__ = ("_client",)

    def __init__(self, client: Client) -> None:
        self._client = client

    def __aiter__(self) -> _Incoming:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self._client.next_event()
        except SessionEnded:
            raise StopAsyncIteration from None


class Client:
    """A logged-in device: ``await connect()``, or ``async with Client(...) as c:``.

    `addresses`: "host:port", "h1:p1,h2:p2", "ws://host:port/ws" (WebSocket; "wss://"
    with TLS) or (host, port) pairs; `token`: a string,
    or a callable returning one (or an awaitable of one), called for every login.
    `reconnect`: log in again after a lost connection or KICK draining / shutdown,
    sleeping ``uniform(0, min(backoff_cap, backoff_base * 2**attempt))`` before each
    try. `request_timeout` bounds every reply and each connect+LOGIN. `heartbeat`:
    PING after `hb` quiet seconds, and drop a connection silent for `idle`. `catch_up`:
    SYNC/PULL what was missed after a reconnect or SYNC_HINT. A `send` is tried at most
    `send_attempts` times within `send_retry_s` seconds.
    """

    __slots__ = (
        "_auto_reconnect", "_backoff_base", "_backoff_cap", "_catch_up", "_closing", "_ended",
        "_first_sync", "_heartbeat", "_hint", "_inbox", "_last_ping", "_last_tx", "_link",
        "_link_event", "_next_addr", "_next_rid", "_pending", "_pongs", "_request_timeout",
        "_send_attempts", "_send_retry_s", "_task", "_timer", "_tls", "_token", "addresses",
        "device", "login_ok", "stats", "uid",
    )  # fmt: skip

    def __init__(
        self,
        addresses: Sequence[Endpoint] | str,
        uid: int,
        device: str,
        token: TokenSource,
        *,
        reconnect: bool = True,
        backoff_base: float = 0.2,
        backoff_cap: float = 10.0,
        request_timeout: float = 10.0,
        heartbeat: bool = True,
        catch_up: bool = True,
        send_attempts: int = 8,
        send_retry_s: float = 30.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.addresses = parse_addresses(addresses)
        self.uid = uid
        self.device = device
        self.login_ok: LoginOk | None = None
        self.stats = ClientStats()
        self._token = token
        self._auto_reconnect = reconnect
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._request_timeout = request_timeout
        self._heartbeat = heartbeat
        self._catch_up = catch_up
        self._send_attempts = send_attempts
        self._send_retry_s = send_retry_s
        self._tls = tls  # TLS to the gateway (ssl.create_default_context(cafile=...))
        self._inbox = Inbox(self, self.stats)
        self._link: Link | None = None
        self._link_event = asyncio.Event()  # set while a link is up or the session is over
        self._next_addr = 0
        self._hint: Endpoint | None = None  # a KICK's reconnect_hint, tried first
        self._next_rid = 0
        self._pending: dict[int, asyncio.Future[ServerFrame]] = {}
        self._pongs: deque[asyncio.Future[None] | None] = deque()  # None: a heartbeat's
        self._task: asyncio.Task[None] | None = None  # the reader
        self._timer: asyncio.TimerHandle | None = None  # the heartbeat
        self._last_tx = 0.0
        self._last_ping = 0.0
        self._ended: SessionEnded | None = None
        self._closing = False
        self._first_sync: FirstPage | None = None  # sent with the last LOGIN, for catch-up

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._link is not None

    @property
    def end_reason(self) -> SessionEnded | None:
        """Why the session ended; None while it lasts."""
        return self._ended

    async def connect(self) -> LoginOk:
        """Open TCP and LOGIN (each address tried once), start the reader task and run
        the baseline SYNC. Raises ClientError for an ERROR answer (auth_failed...) and
        ConnectionLost when no address could be reached."""
        if self._task is not None and not self._task.done():
            raise RuntimeError("client already connected")
        if self._ended is not None:  # a new session after an ended one
            self._ended = None
            self._inbox.reopen()
            self._link_event.clear()
        self._closing = False
        failure: Exception | None = None
        for _ in self.addresses:
            try:
                link = await self._open(self._pick_address())
            except (OSError, TimeoutError, ConnectionLost) as e:
                failure = e
                continue
            self._install(link)
            self._task = asyncio.get_running_loop().create_task(
                self._run(link), name=f"imgw-client-{self.uid}-{self.device}"
            )
            if self._catch_up:
                await self._inbox.catch_up(self._take_first_sync())
            return link.login_ok
        where = ",".join(map(describe, self.addresses))
        raise ConnectionLost(f"cannot connect to {where}: {failure}") from failure

    async def wait_connected(self) -> LoginOk:
        """Wait until a connection is logged in (after a reconnect, say); its LOGIN_OK.
        Raises SessionEnded if the session ends instead. Bound it with asyncio.timeout."""
        return (await self._wait_link(None)).login_ok

    async def logout(self) -> None:
        """LOGOUT (the server drops the route at once and closes), then close."""
        self._closing = True
        link, task = self._link, self._task
        if link is not None and task is not None:
            self._write(link, _LOGOUT)
            await asyncio.wait([task], timeout=self._request_timeout)
        await self.close()

    async def close(self) -> None:
        """Close the connection and stop the tasks; what waits on them fails."""
        self._closing = True
        await self._inbox.stop()
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved: a bug in _run, which ended the session
        self._end(SessionEnded("client closed"))
        link = self._link
        if link is not None:
            self._kill(link, "client closed")
            await link.wait_closed()

    def drop_connection(self) -> None:
        """Abort the TCP connection as a network failure would (tests, chaos drills)."""
        if self._link is not None:
            self._link.abort()

    def statistics(self) -> ClientStats:
        return dataclasses.replace(self.stats)

    # -- incoming -------------------------------------------------------------------------

    def incoming(self) -> AsyncIterator[Event]:
        """Server-initiated frames in arrival order (missed messages as Push); ends when
        the session ends."""
        return _Incoming(self)

    async def next_event(self, timeout: float | None = None) -> Event:  # noqa: ASYNC109
        """The next incoming frame. Raises TimeoutError after `timeout` seconds, and
        SessionEnded once the session is over and every frame was read."""
        async with asyncio.timeout(timeout):
            item = await self._inbox.get()
        if item is None:
            raise self._ended_error()
        return item

    def poll_event(self) -> Event | None:
        """The next incoming frame if one is queued, else None."""
        return self._inbox.poll()

    async def catch_up(self) -> None:
        """Run a catch-up pass now (SYNC, then PULL what was missed; what a SYNC_HINT or a
        reconnect starts): missed messages arrive on `incoming` as Push. Apps call it when
        they come to the foreground, say."""
        await self._inbox.catch_up()

    def mark_seen(self, conv_id: int, seqs: Iterable[int]) -> None:
        """Tell the dedup that the app already has these messages (from `history`)."""
        seen = self._inbox.seen(conv_id)
        for seq in seqs:
            seen.add(seq)

    # -- requests -------------------------------------------------------------------------

    async def request(self, frame: ClientFrame) -> ServerFrame:
        """Send a request under a fresh rid (the frame's own is replaced); the reply.
        An ERROR reply raises ClientError."""
        if not hasattr(frame, "rid"):
            raise TypeError(f"{type(frame).__name__} has no reply; it is not a request")
        frame = dataclasses.replace(frame, rid=self._rid())  # type: ignore[arg-type]
        return await self._call(self._need_link(), frame)

    async def send(
        self,
        conv_id: int,
        content: bytes,
        msg_type: int = MsgType.TEXT,
        client_msg_id: str | None = None,
    ) -> SendAck:
        """SEND; the SEND_ACK (the message is durable). After a lost connection, a
        timeout, ERROR unavailable or ERROR outcome_unknown it sends again with the same
        client_msg_id (waiting for the reconnect), which the server answers with the
        original ack if the message was stored."""
        cmid = client_msg_id or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._send_retry_s
        attempt = 0
        self._inbox.sending.add(cmid)
        try:
            while True:
                link = await self._wait_link(deadline)
                frame = Send(self._rid(), conv_id, cmid, int(msg_type), content)
                try:
                    return _expect(await self._call(link, frame), SendAck)
                except SessionEnded:
                    raise
                except ClientError as e:
                    if e.code not in _SEND_AGAIN:
                        raise
                    attempt += 1
                    if attempt >= self._send_attempts or loop.time() >= deadline:
                        raise
                    self.stats.send_retries += 1
                    if e.code != 0:
                        await asyncio.sleep(self._backoff(attempt))
        finally:
            self._inbox.sending.discard(cmid)

    async def open_p2p(self, peer: int) -> int:
        return _expect(await self._ask(OpenP2P(self._rid(), peer)), ConvOk).conv_id

    async def group_create(self, title: str, uids: Iterable[int]) -> int:
        reply = await self._ask(GroupCreate(self._rid(), title, tuple(uids)))
        return _expect(reply, ConvOk).conv_id

    async def group_members(
        self, conv_id: int, add: Iterable[int] = (), remove: Iterable[int] = ()
    ) -> None:
        reply = await self._ask(GroupMembers(self._rid(), conv_id, tuple(add), tuple(remove)))
        _expect(reply, Ok)

    async def group_info(self, conv_id: int) -> GroupInfoResult:
        return _expect(await self._ask(GroupInfo(self._rid(), conv_id)), GroupInfoResult)

    async def media_upload(self, sha256: str, size: int, content_type: str) -> MediaUrl:
        """A signed URL to PUT the file to (url "": stored already, send the key)."""
        reply = await self._ask(MediaUpload(self._rid(), sha256, size, content_type))
        return _expect(reply, MediaUrl)

    async def media_get(self, key: str) -> MediaUrl:
        """A signed URL to GET the object of `key` from."""
        return _expect(await self._ask(MediaGet(self._rid(), key)), MediaUrl)

    async def pull(self, conv_id: int, after_seq: int = 0, limit: int = 0) -> PullResult:
        reply = await self._ask(Pull(self._rid(), conv_id, after_seq, limit))
        return _expect(reply, PullResult)

    async def pull_all(self, conv_id: int, after_seq: int = 0, *, page: int = 0) -> list[MsgRecord]:
        """PULL pages of `page` messages (0: the server default) until has_more is false."""
        out: list[MsgRecord] = []
        while True:
            result = await self.pull(conv_id, after_seq, page)
            out.extend(result.msgs)
            if not result.has_more or not result.msgs:
                return out
            after_seq = result.msgs[-1].seq

    async def history(self, conv_id: int, before_seq: int = 0, limit: int = 0) -> HistoryResult:
        reply = await self._ask(History(self._rid(), conv_id, before_seq, limit))
        return _expect(reply, HistoryResult)

    async def sync(self, since: Opaque = 0, cursor: Opaque = 0, limit: int = 0) -> SyncResult:
        return _expect(await self._ask(Sync(self._rid(), since, cursor, limit)), SyncResult)

    async def sync_all(
        self, since: Opaque = 0, *, page: int = 0, first: FirstPage | None = None
    ) -> tuple[Opaque, list[ConvRecord]]:
        """Every page of one SYNC pass: (the next_since to keep, the rows). `first`: the
        pass's first page, already asked (from the same `since`)."""
        rows: list[ConvRecord] = []
        cursor: Opaque = 0
        while True:
            if first is not None:
                result = _expect(await self._answer(first.rid, first.reply), SyncResult)
                first = None
            else:
                result = await self.sync(since, cursor, page)
            rows.extend(result.convs)
            if not result.has_more or result.next_cursor == cursor:
                return result.next_since, rows
            cursor = result.next_cursor

    async def recall(self, conv_id: int, seq: int) -> int:
        """RECALL; the seq of the recall message."""
        return _expect(await self._ask(Recall(self._rid(), conv_id, seq)), RecallOk).recall_seq

    async def presence(self, uids: Iterable[int]) -> dict[int, list[str]]:
        reply = _expect(await self._ask(Presence(self._rid(), tuple(uids))), PresenceResult)
        return {uid: list(devices) for uid, devices in reply.entries}

    async def read(self, conv_id: int, seq: int) -> None:
        await self._tell(Read(conv_id, seq))

    async def delivered(self, conv_id: int, seq: int) -> None:
        await self._tell(Delivered(conv_id, seq))

    async def typing(self, conv_id: int) -> None:
        await self._tell(Typing(conv_id))

    async def ping(self) -> None:
        """PING and await the PONG."""
        link = self._need_link()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._write(link, _PING)
        self._pongs.append(waiter)
        try:
            async with asyncio.timeout(self._request_timeout):
                await waiter
        except TimeoutError:
            raise RequestTimeout("no PONG") from None

    # -- request plumbing -----------------------------------------------------------------

    def _rid(self) -> int:
        self._next_rid = self._next_rid % _MAX_RID + 1
        return self._next_rid

    def _need_link(self) -> Link:
        link = self._link
        if link is None:
            raise self._ended_error() if self._ended else ConnectionLost("not connected")
        return link

    def _ended_error(self) -> SessionEnded:
        ended = self._ended
        if ended is None:
            return SessionEnded("not connected")
        return SessionEnded(ended.text, ended.kick)  # a fresh one: tracebacks don't pile up

    async def _wait_link(self, deadline: float | None) -> Link:
        while True:
            if self._ended is not None or self._task is None or self._task.done():
                raise self._ended_error()
            if self._link is not None:
                return self._link
            try:
                async with asyncio.timeout_at(deadline):
                    await self._link_event.wait()
            except TimeoutError:
                raise ConnectionLost("not connected; gave up waiting for a reconnect") from None

    async def _ask(self, frame: ClientFrame) -> ServerFrame:
        return await self._call(self._need_link(), frame)

    async def _call(self, link: Link, frame: ClientFrame) -> ServerFrame:
        rid: int = getattr(frame, "rid")  # noqa: B009 - every request frame has one
        waiter: asyncio.Future[ServerFrame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = waiter
        self.stats.requests += 1
        try:
            async with asyncio.timeout(self._request_timeout):
                self._write(link, encode(frame))
                try:
                    await link.writer.drain()
                except OSError as e:
                    self._kill(link, f"write failed: {e}")
                return await waiter
        except TimeoutError:
            raise RequestTimeout(f"no reply to {type(frame).__name__} rid {rid}") from None
        finally:
            self._pending.pop(rid, None)

    async def _answer(self, rid: int, waiter: asyncio.Future[ServerFrame]) -> ServerFrame:
        """The reply to a request sent ahead (with a LOGIN), within the request timeout."""
        try:
            async with asyncio.timeout(self._request_timeout):
                return await waiter
        except TimeoutError:
            raise RequestTimeout(f"no reply to SYNC rid {rid}") from None
        finally:
            self._pending.pop(rid, None)

    def _take_first_sync(self) -> FirstPage | None:
        first, self._first_sync = self._first_sync, None
        return first

    async def _tell(self, frame: ClientFrame) -> None:
        """A frame without a reply (READ, DELIVERED, TYPING)."""
        link = self._need_link()
        self._write(link, encode(frame))
        try:
            await link.writer.drain()
        except OSError as e:
            self._kill(link, f"write failed: {e}")
            raise ConnectionLost(str(e)) from None

    def _write(self, link: Link, data: bytes) -> None:
        if link.dead:
            raise ConnectionLost("connection lost")
        link.writer.write(data)
        self._last_tx = asyncio.get_running_loop().time()

    # -- connections ----------------------------------------------------------------------

    def _pick_address(self) -> Endpoint:
        if self._hint is not None:
            addr, self._hint = self._hint, None
            return addr
        addr = self.addresses[self._next_addr % len(self.addresses)]
        self._next_addr += 1
        return addr

    async def _open(self, addr: Endpoint) -> Link:
        source = self._token
        if isinstance(source, str):
            token = source
        else:
            minted = source()
            token = await minted if inspect.isawaitable(minted) else minted
        login = Login(1, PROTOCOL_VERSION, self.uid, self.device, token, _CAPS)
        first: FirstPage | None = None
        then = b""
        if self._catch_up:
            # The catch-up's first SYNC goes in the LOGIN's write (docs/protocol.md): the
            # server answers it in LOGIN_OK's write, one round trip and wakeup fewer, which
            # after a gateway restart is thousands of clients at once.
            reply: asyncio.Future[ServerFrame] = asyncio.get_running_loop().create_future()
            reply.add_done_callback(_retrieve)  # a pass may not want it after all
            first = FirstPage(self._inbox.next_since, self._rid(), reply)
            self._pending[first.rid] = reply
            self.stats.requests += 1
            then = encode(Sync(first.rid, first.since, 0, 0))
        try:
            async with asyncio.timeout(self._request_timeout):
                link = await open_link(addr, login, self._tls, then=then)
        except BaseException:
            if first is not None:
                self._pending.pop(first.rid, None)
                first.reply.cancel()
            raise
        self._first_sync = first
        return link

    def _install(self, link: Link) -> None:
        loop = asyncio.get_running_loop()
        self._link = link
        self.login_ok = link.login_ok
        self.stats.connects += 1
        now = loop.time()
        link.last_rx = self._last_tx = self._last_ping = now
        self._link_event.set()
        if self._heartbeat:
            self._timer = loop.call_at(now + max(1, link.login_ok.hb), self._on_timer)
        backlog, link.backlog = link.backlog, []
        for frame in backlog:
            self._on_frame(link, frame)

    def _kill(self, link: Link, why: str) -> None:
        """Give up on `link`: abort it and fail what waits on it. Idempotent."""
        if link.dead:
            return
        link.dead = True
        if self._link is link:
            self._link = None
            if self._ended is None:
                self._link_event.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        link.abort()
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            if not waiter.done():
                waiter.set_exception(ConnectionLost(why))
        pongs, self._pongs = self._pongs, deque()
        for pong in pongs:
            if pong is not None and not pong.done():
                pong.set_exception(ConnectionLost(why))

    def _end(self, error: SessionEnded) -> None:
        if self._ended is None:
            self._ended = error
            self._inbox.end()
        self._link_event.set()  # wakes senders waiting for a reconnect: they fail now

    async def _run(self, link: Link) -> None:
        """The reader task: read until the link drops, then reconnect or end."""
        try:
            while True:
                await self._read(link)
                self._kill(link, "connection lost")
                await link.wait_closed()
                reason = self._end_reason(link.kick)
                if reason is not None:
                    self._end(SessionEnded(reason, link.kick))
                    return
                new_link = await self._reconnect()
                if new_link is None:
                    return
                link = new_link
                self.stats.reconnects += 1
                self._install(link)
                if self._catch_up:
                    self._inbox.catch_up(self._take_first_sync())
        except Exception as e:  # a bug: fail loudly, but never leave requests hanging
            self._kill(link, f"client failed: {e!r}")
            self._end(SessionEnded(f"client failed: {e!r}"))
            raise

    async def _read(self, link: Link) -> None:
        loop = asyncio.get_running_loop()
        reader, decoder = link.reader, link.decoder
        while not link.dead:
            try:
                data = await reader.read(READ_CHUNK)
            except OSError:
                return
            if not data:
                return
            link.last_rx = loop.time()
            try:
                frames = decoder.feed(data)
            except FrameError as e:
                for frame in e.frames:
                    self._on_frame(link, frame)
                return  # the server broke the framing: drop this connection
            for frame in frames:
                self._on_frame(link, frame)

    def _end_reason(self, kick: Kick | None) -> str | None:
        """Why the session ends after a lost link, or None to reconnect."""
        if self._closing:
            return "client closed"
        if kick is None:
            return None if self._auto_reconnect else "connection lost"
        what = f"kicked: {kick_name(kick.reason)}" + (f" ({kick.text})" if kick.text else "")
        if not self._auto_reconnect:
            return what
        if kick.reason in _RECONNECTING_KICKS:
            if kick.reconnect_hint:
                with contextlib.suppress(ValueError):  # unusable: cycle through our list
                    self._hint = parse_addresses(kick.reconnect_hint)[0]
            return None
        if kick.reason == KickReason.AUTH_REVOKED and not isinstance(self._token, str):
            return None  # the token callable mints a fresh one
        return what

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff, full jitter applied after the cap."""
        ceiling = min(self._backoff_cap, self._backoff_base * 2 ** min(attempt, 32))
        return random.uniform(0, ceiling)

    async def _reconnect(self) -> Link | None:
        attempt = 0
        while True:
            await asyncio.sleep(self._backoff(attempt))
            attempt += 1
            try:
                return await self._open(self._pick_address())
            except (OSError, TimeoutError, ConnectionLost):
                continue
            except ClientError as e:
                retry = e.code == ErrorCode.UNAVAILABLE or (
                    e.code == ErrorCode.AUTH_FAILED and not isinstance(self._token, str)
                )
                if not retry:
                    self._end(SessionEnded(f"reconnect refused: {e}"))
                    return None
            except Exception:  # the token callable failed: try again later
                continue

    # -- inbound frames -------------------------------------------------------------------

    def _on_frame(self, link: Link, frame: Frame | Invalid) -> None:
        match frame:
            case Push():
                self._inbox.deliver(frame)
            case Pong():
                if self._pongs:
                    pong = self._pongs.popleft()
                    if pong is not None and not pong.done():
                        pong.set_result(None)
            case ReadNotify() | TypingNotify() | Notice():
                self._inbox.put(frame)
            case SyncHint():
                self._inbox.put(frame)
                if self._catch_up and not self._closing:
                    self._inbox.catch_up()
            case Kick():
                link.kick = frame
                self._inbox.put(frame)
            case Invalid() | LoginOk():
                pass  # an op of a newer protocol revision, or a stray LOGIN_OK: ignore
            case _:
                if isinstance(frame, SendAck):  # ours: never on incoming
                    self._inbox.seen(frame.conv_id).add(frame.seq)
                rid: int = getattr(frame, "rid", 0)
                waiter = self._pending.pop(rid, None)
                if waiter is None or waiter.done():
                    if isinstance(frame, Error) and rid == 0:
                        self._inbox.put(frame)
                elif isinstance(frame, Error):
                    waiter.set_exception(ClientError(frame.code, frame.text))
                else:
                    waiter.set_result(frame)  # type: ignore[arg-type]

    def _on_timer(self) -> None:
        """The heartbeat: PING after `hb` quiet seconds; drop a server silent for `idle`."""
        self._timer = None
        link = self._link
        if link is None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        hb = max(1, link.login_ok.hb)
        idle = max(hb + 1, link.login_ok.idle)
        if now - link.last_rx >= idle:
            self._kill(link, f"server silent for {idle} s")
            return
        # Also probe when only one-way frames (READ, TYPING) went out and nothing came in.
        if now - self._last_tx >= hb or (now - link.last_rx >= hb and now - self._last_ping >= hb):
            self._write(link, _PING)
            self._pongs.append(None)
            self._last_ping = now
            self.stats.heartbeats += 1
        due = min(self._last_tx + hb, max(link.last_rx, self._last_ping) + hb, link.last_rx + idle)
        self._timer = loop.call_at(max(due, now + 0.01), self._on_timer)
