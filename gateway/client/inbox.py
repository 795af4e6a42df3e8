"""What the app receives: the incoming queue, duplicate suppression and catch-up.

Live PUSH frames and the messages a catch-up pulls go through `Inbox.deliver`, which
drops any seq the app was already given, so `incoming()` is one stream in which a
message appears at most once. A catch-up pass is SYNC from the kept `since`, then PULL
for every conversation whose max_seq is above what the client holds (docs/protocol.md,
Paging and SYNC). The first pass of a session is a baseline: it only records where every
conversation stands, since what came before the session is history, not news.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias

from gateway.client.errors import ClientError
from gateway.client.seen import SeenSeqs
from protocol.frames import (
    ConvRecord,
    Error,
    Kick,
    MsgRecord,
    Notice,
    Opaque,
    PullResult,
    Push,
    ReadNotify,
    ServerFrame,
    SyncHint,
    TypingNotify,
)
from protocol.ops import ErrorCode

Event: TypeAlias = Push | ReadNotify | TypingNotify | Notice | SyncHint | Kick | Error
"""What `Client.incoming()` yields: server-initiated frames, and ERRORs with rid 0."""

CATCH_UP_PAGE: Final = 200  # the server's cap on a PULL


@dataclass(slots=True)
class FirstPage:
    """A catch-up's first SYNC, sent ahead (in the LOGIN's write) from `since`: its rid
    and the future its reply resolves."""

    since: Opaque
    rid: int
    reply: asyncio.Future[ServerFrame]


@dataclass(slots=True)
class ClientStats:
    connects: int = 0  # successful logins, the first included
    reconnects: int = 0  # successful logins after a lost connection
    requests: int = 0
    pushes: int = 0  # live PUSH frames delivered on incoming
    caught_up: int = 0  # messages delivered on incoming from catch-up PULLs
    dup_drops: int = 0  # PUSH or pulled messages dropped as already seen
    send_retries: int = 0
    heartbeats: int = 0  # PINGs sent by the heartbeat timer


class Requests(Protocol):
    """The requests a catch-up makes (the Client)."""

    uid: int

    async def sync_all(
        self, since: Opaque = 0, *, page: int = 0, first: FirstPage | None = None
    ) -> tuple[Opaque, list[ConvRecord]]: ...

    async def pull(self, conv_id: int, after_seq: int = 0, limit: int = 0) -> PullResult: ...


class Inbox:
    __slots__ = (
        "_again", "_api", "_events", "_first", "_seen", "_since", "_task", "sending", "stats",
    )  # fmt: skip

    def __init__(self, api: Requests, stats: ClientStats) -> None:
        self._api = api
        self.stats = stats
        self._events: asyncio.Queue[Event | None] = asyncio.Queue()  # None: session over
        self._seen: dict[int, SeenSeqs] = {}
        self._since: Opaque | None = None  # None until a first SYNC pass completes
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._first: FirstPage | None = None  # sent ahead, for the next pass
        self.sending: set[str] = set()  # client_msg_ids of sends awaiting their ack

    # -- the queue ------------------------------------------------------------------------

    def put(self, event: Event) -> None:
        self._events.put_nowait(event)

    def end(self) -> None:
        """The session is over: readers get None once the queue is empty."""
        self._events.put_nowait(None)

    def reopen(self) -> None:
        """A new session: a fresh queue (dedup state and `since` are kept)."""
        self._events = asyncio.Queue()

    async def get(self) -> Event | None:
        item = await self._events.get()
        if item is None:
            self._events.put_nowait(None)  # every later reader ends too
        return item

    def poll(self) -> Event | None:
        try:
            item = self._events.get_nowait()
        except asyncio.QueueEmpty:
            return None
        if item is None:
            self._events.put_nowait(None)
        return item

    # -- dedup ----------------------------------------------------------------------------

    def seen(self, conv_id: int) -> SeenSeqs:
        seen = self._seen.get(conv_id)
        if seen is None:
            seen = self._seen[conv_id] = SeenSeqs()
        return seen

    def deliver(self, push: Push, *, pulled: bool = False) -> None:
        """Queue `push` unless the app was given it before."""
        if not self.seen(push.conv_id).add(push.seq):
            self.stats.dup_drops += 1
        elif pulled and push.sender_uid == self._api.uid and push.client_msg_id in self.sending:
            pass  # our own send whose ack was lost: `send` returns it
        else:
            if pulled:
                self.stats.caught_up += 1
            else:
                self.stats.pushes += 1
            self._events.put_nowait(push)

    # -- catch-up -------------------------------------------------------------------------

    @property
    def catching_up(self) -> asyncio.Task[None] | None:
        task = self._task
        return task if task is not None and not task.done() else None

    @property
    def next_since(self) -> Opaque:
        """Where the next pass's SYNC starts."""
        return 0 if self._since is None else self._since

    def catch_up(self, first: FirstPage | None = None) -> asyncio.Task[None]:
        """Start a catch-up pass, or ask the running one for another pass. `first`: the
        pass's first SYNC, already sent (with a new connection's LOGIN)."""
        if first is not None:
            self._first = first
        task = self.catching_up
        if task is not None:
            self._again = True
            return task
        self._task = task = asyncio.get_running_loop().create_task(self._catch_up())
        return task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved

    async def _catch_up(self) -> None:
        while True:
            self._again = False
            with contextlib.suppress(ClientError):  # connection lost (its next login asks
                await self._pass()  # again) or a refusal
            if not self._again:
                return

    async def _pass(self) -> None:
        baseline = self._since is None
        since = self.next_since
        first, self._first = self._first, None
        if first is not None and first.since != since:
            first = None  # asked from another since: its answer is not this pass's
        try:
            next_since, rows = await self._api.sync_all(since, first=first)
        except ClientError as e:
            if e.code != ErrorCode.BAD_REQUEST or since == 0:
                raise
            next_since, rows = await self._api.sync_all(0)  # a since of another deployment
        for row in rows:
            seen = self.seen(row.conv_id)
            if baseline:
                seen.skip_to(row.max_seq)
            elif row.max_seq > seen.floor:
                await self._pull_missed(row.conv_id, seen)
        self._since = next_since

    async def _pull_missed(self, conv_id: int, seen: SeenSeqs) -> None:
        after = seen.floor
        while True:
            try:
                result = await self._api.pull(conv_id, after, CATCH_UP_PAGE)
            except ClientError as e:
                if e.code in (ErrorCode.NOT_MEMBER, ErrorCode.NO_SUCH_CONVERSATION):
                    return
                raise
            for m in result.msgs:
                self.deliver(_push_of(conv_id, m), pulled=True)
            if result.msgs:
                after = result.msgs[-1].seq
            if not result.has_more or not result.msgs:
                break
        seen.skip_to(after)


def _push_of(conv_id: int, m: MsgRecord) -> Push:
    return Push(
        conv_id, m.seq, m.msg_id, m.sender_uid, m.msg_type, m.content, m.server_ms,
        m.client_msg_id,
    )  # fmt: skip
