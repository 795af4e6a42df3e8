"""The storage ports: what the gateway needs from its backends, as typing.Protocol classes.

Adapters: `storage.embedded` (SQLite + in-process routes and bus, the default). The
MySQL, Redis and RabbitMQ adapters implement the same ports.

Every method that can block is `async`; adapters never block the event loop. A failure of
the authoritative store raises `StoreUnavailable` and commits nothing; a Redis adapter
raises `CacheUnavailable`, the bus `BusUnavailable`: all `BackendUnavailable`
(storage/errors.py).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from storage.models import (
    AppendResult,
    Conversation,
    HookRow,
    Membership,
    MembershipChange,
    NewMessage,
    NodeLease,
    OutboxRow,
    PushDevice,
    RecallResult,
    Route,
    SentRecord,
    StoredMessage,
    SyncPage,
)


class ChatStore(Protocol):
    """The authority: conversations, members, messages, seqs, read and delivered positions."""

    # How many group commits (`append`) pay to run at once: the send batcher's default.
    commit_slots: int

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def get_conversation(self, conv_id: int) -> Conversation | None: ...

    async def get_membership(self, conv_id: int, uid: int) -> Membership | None:
        """The member row, current (left_seq None) or former; None if never a member."""
        ...

    async def member_uids(self, conv_id: int) -> list[int]:
        """Current members in join order (owner first for groups)."""
        ...

    async def open_p2p(self, a: int, b: int) -> int:
        """The p2p conversation of a and b, created on first use. Idempotent."""
        ...

    async def find_p2p(self, a: int, b: int) -> int | None:
        """The p2p conversation of `a` and `b` if it exists (never creates it)."""
        ...

    async def create_group(
        self, owner: int, title: str, uids: Sequence[int]
    ) -> tuple[int, StoredMessage]:
        """Create a group owned by `owner` with `uids` (owner first, deduplicated) and write
        its "created" system message. Returns the conv_id and that message."""
        ...

    async def change_members(
        self,
        conv_id: int,
        by: int,
        add: Sequence[int],
        remove: Sequence[int],
        *,
        max_members: int = 1000,
    ) -> MembershipChange:
        """Apply adds and removes atomically (GroupFull, changing nothing, if the group
        would exceed `max_members`), one system message per event in the order
        added, removed, left (`by` removing itself is "left"). Members already present are
        not re-added; non-members are not removed. When the owner leaves, the earliest
        remaining member becomes owner."""
        ...

    async def set_title(self, conv_id: int, by: int, title: str) -> StoredMessage | None:
        """Set a group's title and write its "titled" system message ({"event": "titled",
        "by", "uids": [], "title"}), in one transaction; None (changing nothing) unless
        `by` owns the group at commit."""
        ...

    async def append(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        """Commit a batch of client messages in one transaction, seqs in batch order per
        conversation. In that transaction, in this order: a (sender, client_msg_id)
        already stored returns the original (DUPLICATE), or CONFLICT if conv/type/content
        differ; a sender that is not a current member gets NOT_MEMBER (membership is
        checked against the same commit order as the seqs, so no message lands after the
        sender's removal); the rest are STORED, each with the conversation's members at
        commit for fan-out. Raises StoreUnavailable if the commit fails (then nothing in
        the batch is stored)."""
        ...

    async def find_sent(self, sender_uid: int, client_msg_id: str) -> SentRecord | None:
        """The idempotency record of a stored send, if any."""
        ...

    async def read_after(
        self, conv_id: int, after_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        """First `limit` messages with after_seq < seq, min_seq <= seq <= max_seq, ascending;
        and whether more exist."""
        ...

    async def read_before(
        self, conv_id: int, before_seq: int, limit: int, *, min_seq: int, max_seq: int | None
    ) -> tuple[list[StoredMessage], bool]:
        """Last `limit` messages with seq < before_seq (0 = newest), within bounds,
        ascending; and whether older ones exist."""
        ...

    async def recall(
        self, conv_id: int, seq: int, by: int, *, window_ms: int, min_seq: int
    ) -> RecallResult: ...

    async def set_read(self, conv_id: int, uid: int, seq: int) -> int | None:
        """Advance the read position (clamped to max_seq); the new position, or None if it
        did not move."""
        ...

    async def set_delivered(self, conv_id: int, uid: int, device: str, seq: int) -> int | None:
        """Advance this device's delivered position, as set_read."""
        ...

    async def sync(
        self,
        uid: int,
        device: str,
        *,
        changed_since_ms: int,
        after: tuple[int, int] | None,
        limit: int,
    ) -> SyncPage:
        """The caller's conversation rows changed at or after `changed_since_ms`, ordered
        by (last_active_ms, conv_id) descending, starting after the `after` key."""
        ...

    async def shared_with(self, uid: int, others: Sequence[int]) -> set[int]:
        """Those of `others` whose presence `uid` may see: they share a current
        conversation with `uid` and have shown up in it (storage/membership.py: read up
        to at least their first visible seq, or created the group). Opening a p2p with a
        stranger, adding one to a group, or leaving them the ownership of a group shows
        nothing of them."""
        ...

    async def conversation_counts(self, uids: Sequence[int]) -> dict[int, int]:
        """How many conversations each uid has joined and is a member of now: its p2ps,
        and the groups it has shown up in (created, or read in; storage/membership.py).
        A group others put it in counts once it reads there. Uids in none omitted."""
        ...

    # -- offline push (docs/protocol.md, Offline push; the rules: storage/push.py) ---------

    async def push_register(
        self,
        uid: int,
        device: str,
        provider: str,
        token: str,
        *,
        preview: bool,
        locale: str,
        max_devices: int,
    ) -> list[tuple[int, str]]:
        """Register (uid, device) for push, in one transaction: its registration is
        written (replacing its earlier one), the (provider, token) moves here from any
        other device holding it, and the uid's least recently registered devices beyond
        `max_devices` lose theirs. Returns the (uid, device)s whose registration went."""
        ...

    async def push_unregister(self, uid: int, device: str) -> bool:
        """Remove the device's registration; whether it had one."""
        ...

    async def push_devices(self, uids: Sequence[int]) -> dict[int, list[PushDevice]]:
        """The registrations of each of `uids`, newest first (uids with none omitted):
        one query per `storage.push.UIDS_PER_QUERY` uids, whatever their number."""
        ...

    async def push_delete(self, provider: str, token: str) -> bool:
        """Remove the registration holding (provider, token), as when the push service
        reports the token invalid; whether there was one."""
        ...

    async def set_mute(self, conv_id: int, uid: int, until_ms: int) -> None:
        """No notifications of `conv_id` to `uid`'s devices until `until_ms` (ms since
        the epoch); 0, or a time not after the store's clock, unmutes."""
        ...

    async def muted(self, pairs: Sequence[tuple[int, int]], now_ms: int) -> set[tuple[int, int]]:
        """Those (conv_id, uid) of `pairs` where uid muted conv_id until after `now_ms`:
        one query per `storage.push.PAIRS_PER_QUERY` pairs."""
        ...

    async def unread_badges(self, uids: Sequence[int]) -> dict[int, int]:
        """Each uid's push badge (storage/badges.py: bounded, over its most recently active
        conversations; uids with nothing unread omitted): one query per
        `storage.push.UIDS_PER_QUERY` uids (and server) for the windows, and counts of
        what the windows gained and lost since the store last counted them."""
        ...

    # -- hook rows: webhooks and push events owed, at least once (storage/hooks.py) ------

    def set_hook_node(self, node: str) -> None:
        """From now on every transaction that stores messages also writes one hook row
        per message, owed by `node`, in the same commit; "" (the default) writes none."""
        ...

    async def hooks_of(self, node: str, limit: int) -> list[HookRow]:
        """Up to `limit` hook rows of `node`, oldest first (created_ms, then conv_id,
        seq); with several servers, each server's first `limit`, merged."""
        ...

    async def hooks_done(self, keys: Sequence[tuple[int, int]]) -> None:
        """Delete the hook rows of these (conv_id, seq) (batched; a key with no row is
        skipped)."""
        ...

    async def hooks_adopt(self, from_node: str, to_node: str) -> int:
        """Re-tag every hook row of `from_node` (a dead node) as `to_node`'s; how many
        moved."""
        ...

    async def hooks_backlog(self) -> tuple[int, int]:
        """(hook rows pending across all nodes, counted up to
        `storage.hooks.HOOK_BACKLOG_CAP`; the oldest one's created_ms, 0 if none): for
        metrics, a bounded read of the node index."""
        ...

    def now_ms(self) -> int:
        """The store's clock, the one that stamps server_ms and activity times."""
        ...

    async def maintain(self) -> None:
        """Periodic housekeeping (the node calls it about once a minute)."""
        ...

    def durability(self) -> dict[str, str]:
        """The settings that decide whether a commit survives a crash (for the startup
        log)."""
        ...

    def outbox(self) -> Outbox | None:
        """The transactional outbox, for stores shared by several nodes (None: a node's
        fan-out cannot outlive it, nor need to)."""
        ...


class Outbox(Protocol):
    """The transactional outbox: the fan-out each group commit owes is recorded in the
    commit itself (one row per commit, owned by the committing node) and cleared once
    delivered; a node alive renews its lease; a survivor takes over the rows of a node
    whose lease lapsed and delivers them again."""

    def record_for(self, node: str) -> None:
        """From now on every `ChatStore.append` records its fan-out as owed by `node`."""
        ...

    async def clear(self, ids: Sequence[int]) -> None:
        """Delete delivered rows (one round trip)."""
        ...

    async def keep_lease(self, node: str, ttl_ms: int, conn_floor: int = 0) -> None:
        """`node` is alive for `ttl_ms` more; its process's connection ids are above
        `conn_floor`."""
        ...

    async def claim_lapsed(self, me: str, ttl_ms: int) -> list[str]:
        """Nodes whose lease lapsed, each now claimed by `me` for `ttl_ms` (another
        survivor cannot take them meanwhile)."""
        ...

    async def leases(self) -> dict[str, NodeLease]:
        """Every node with a lease row (one small read: a row per node)."""
        ...

    async def owed(self, node: str, limit: int) -> list[OutboxRow]:
        """The oldest `limit` rows `node` still owes."""
        ...

    async def release(self, node: str, me: str) -> bool:
        """Drop the lease of a dead node claimed by `me` if it owes nothing any more."""
        ...


class RateBudgets(Protocol):
    """Per-uid token buckets shared by every node (storage/redis/budgets.py)."""

    async def spend(
        self, kind: str, spent: Mapping[int, int], *, burst: int, rate: float, now_ms: int
    ) -> dict[int, float]:
        """Take `spent` tokens per uid off the shared buckets of `kind`; the levels after
        (negative: overdrawn across nodes)."""
        ...


class RouteStore(Protocol):
    """Where each online (uid, device) is connected. Routes expire unless renewed; a
    route is renewed or removed only by the connection that owns it (node, conn_id,
    epoch), so a stale connection can never touch a newer login's route."""

    async def register(self, route: Route, *, iat: int | None = None) -> Route | None:
        """Install `route`, replacing and returning any previous route of the device.
        Raises `Revoked`, installing nothing, when a revocation of the uid or device
        covers a token minted at `iat` (None: a v1 token, covered by any)."""
        ...

    async def renew(self, routes: Sequence[Route]) -> None:
        """Extend the TTL of each route still owned by its connection (one round trip)."""
        ...

    async def remove(self, route: Route) -> bool:
        """Delete the route if it is still this connection's."""
        ...

    async def get(self, uid: int, device: str) -> Route | None: ...

    async def ttl(self, uid: int, device: str) -> float | None:
        """Seconds until the device's route expires; None if it has none."""
        ...

    async def online(self, uids: Sequence[int]) -> dict[int, list[Route]]:
        """Online routes of each uid (uids with none are omitted), in one round trip."""
        ...

    async def revoke(self, uid: int, device: str | None, at_s: int, keep_s: int) -> None:
        """Record that the tokens of `uid` (one device, or all with None) minted up to
        `at_s` (Unix seconds) are revoked; the record lasts `keep_s` (the longest token
        lifetime). A route store may lose it with its routes: the one a node is given
        (`storage.revocations.DurableRevocations`) writes it to the authoritative store
        first, and keeps a copy read back from there."""
        ...

    async def mark(self, node: str) -> bool:
        """Keep `node`'s liveness marker beside the routes and say whether it was missing:
        True means the route data may have been lost since the previous call (a flush, a
        restart without persistence, a failover to an empty replica, or an outage longer
        than the route TTL), so the node's live routes must be registered again. One
        round trip, whatever the number of routes; the first call of a node says True.
        (The node calls it every second: `DurableRevocations` also starts reading the
        revocations changed since its last read then, in the background.)"""
        ...

    async def close(self) -> None: ...


BusHandler = Callable[[bytes], Awaitable[None] | None]


class Delivery(enum.Enum):
    """What became of one publish."""

    OK = "ok"  # the broker took it for the node's queue
    LOST = "lost"  # link down, timeout, refused: the node may be alive and missed it
    UNROUTABLE = "unroutable"  # no queue for the node: it is gone


ResumeHandler = Callable[[], None]


class Bus(Protocol):
    """Carries encoded frames to other nodes (one queue per node).

    Counters (plain ints, read by the metrics collector): `published` envelopes handed to
    the broker, `lost` publishes that failed (link down, timeout), `unroutable` ones the
    broker returned (no queue: the target node is gone), `dead_lettered` received envelopes
    the handler failed on, `outages` times the link went down."""

    published: int
    lost: int
    unroutable: int
    dead_lettered: int
    outages: int

    async def start(self, node: str, handler: BusHandler, on_resume: ResumeHandler) -> None:
        """Consume this node's queue, calling `handler` with each envelope; `on_resume`
        runs each time the link comes back after an outage (pushes may have been lost)."""
        ...

    async def publish(self, node: str, payload: bytes) -> Delivery:
        """Best effort and prompt: never raises and never waits for a reconnect; a
        failure is counted in `lost` or `unroutable` and returned."""
        ...

    async def close(self) -> None: ...
