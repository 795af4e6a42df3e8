"""A gateway node: the live connections of one worker and what they share (config, store,
routes, bus, timing wheel, send batcher, rate limiter, metrics), and fan-out.

Connections call into the node for everything that crosses connections: admission,
sessions (route install, duplicate-login kicks), route renewals, and delivery. The node
is the connections' `Hub` and their handlers' `Services` (gateway.ports); it reads its
connections but never changes their state (gateway.connection owns every transition).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, Final

import structlog

from gateway import envelope
from gateway.batcher import SendBatcher
from gateway.config import Config
from gateway.connection import Backlog, Connection
from gateway.fanout import FanOut
from gateway.hooks import hook_queue
from gateway.hooks.contentcheck import WebhookCheck
from gateway.hooks.queue import Owed
from gateway.logs import Throttle
from gateway.media import Media
from gateway.metrics import Metrics
from gateway.outbox import OutboxKeeper
from gateway.ports import Session, TooManyConnections
from gateway.ratelimit import SharedBudgets, UidRateLimiter
from gateway.routewatch import RouteWatch
from gateway.wheel import TimingWheel
from protocol.codec import encode
from protocol.decoder import FrameDecoder, Side
from protocol.frames import Push, SyncHint
from protocol.ops import KickReason
from storage.errors import BackendUnavailable
from storage.models import OutboxRow, Route, StoredMessage
from storage.pacing import Pacer
from storage.ports import Bus, ChatStore, RateBudgets, RouteStore

RATE_PRUNE_EVERY_S: Final = 60.0
PACE_STEP_S: Final = 0.05
KICKS_IN_FLIGHT: Final = 2  # duplicate-login kick publishes out at once (all nodes)
KICKS_LINGER_S: Final = 0.04  # between them, under load


class Node:
    def __init__(
        self,
        config: Config,
        *,
        node_id: str,
        store: ChatStore,
        routes: RouteStore,
        bus: Bus,
        budgets: RateBudgets | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config
        self.node_id = node_id
        self.store = store
        self.routes = routes
        self.bus = bus
        self.loop = loop or asyncio.get_running_loop()
        self.keyring = config.keyring()
        self.metrics = Metrics()
        # --max-connections, lowered at start to what the open-file limit allows
        self.max_connections = config.max_connections
        self.metrics.watch_bus(bus)
        self.metrics.watch_store(store)
        self.log = structlog.get_logger("imgw").bind(node=node_id)
        self.log_throttle = Throttle(self.loop.time)
        self.wheel = TimingWheel(self.loop, on_tick=self._on_tick, on_error=self._timer_failed)
        self.limiter = UidRateLimiter(
            burst=config.rate_burst, rate=config.rate_per_s, clock=self.loop.time
        )
        self.op_limiter = UidRateLimiter(
            burst=config.op_rate_burst, rate=config.op_rate_per_s, clock=self.loop.time
        )
        self.typing_limiter = UidRateLimiter(
            burst=config.typing_burst, rate=config.typing_per_s, clock=self.loop.time
        )
        self.group_limiter = UidRateLimiter(
            burst=config.groups_per_day, rate=config.groups_per_day / 86_400, clock=self.loop.time
        )
        self.shared_budgets = (
            None
            if budgets is None
            else SharedBudgets(
                budgets,
                {"send": self.limiter, "ops": self.op_limiter, "groups": self.group_limiter},
                now_ms=store.now_ms,
                log=self.log,
            )
        )
        self.check = (
            None
            if not config.check_url
            else WebhookCheck(
                config.check_url,
                timeout_s=config.check_timeout_ms / 1000,
                fail=config.check_fail,
                pool=config.check_pool,
                log=self.log,
                throttle=self.log_throttle.allow,
            )
        )
        # Whose hook rows this node's commits write (gateway/hooks/queue.py): its node id
        # where survivors take over a dead node (a shared store and a bus,
        # gateway/outbox.py); else one name that the next start of this single node finds.
        shared = store.outbox() is not None and not config.bus.startswith("local:")
        self.hook_node = node_id if shared else "local"
        self.hooks = hook_queue(
            config, node_id=node_id, hook_node=self.hook_node, store=store, routes=routes,
            log=self.log, throttle=self.log_throttle.allow,
        )  # fmt: skip
        # push events need what the fan-out saw; the notify webhook alone does not
        self._hooks_see = self.hooks is not None and bool(config.push_url or config.push_amqp)
        if self.hooks is not None:  # each commit stores what the hooks are owed
            store.set_hook_node(self.hook_node)
            self.metrics.watch_hooks(self.hooks)
        self.batcher = SendBatcher(
            store,
            max_batch=config.batch_max,
            max_delay_s=config.batch_delay_ms / 1000,
            max_inflight=config.batch_inflight or store.commit_slots,
            min_batch=config.batch_min,
            max_wait_s=config.batch_wait_ms / 1000,
            on_batch=self._after_batch,
            check=None if self.check is None else self.check.check,
        )
        self.held: set[Connection] = set()  # not read: send backpressure
        self.penalized: set[Connection] = set()  # not read: over the op budget
        # Decodes the whole frames of every connection (see Connection.data_received).
        self.decoder = self.new_decoder()
        self.sessions: dict[int, Connection] = {}  # conn_id -> logged-in connection
        self.by_device = Devices()
        self.open_count = 0
        self.partial_bytes = 0  # unfinished frames held by connections (max_partial_bytes)
        self._per_ip: dict[str, int] = {}  # with max_connections_per_ip (Connection.peer_ip)
        self._logins: dict[int, int] = {}  # logins under way, by uid (max_connections_per_uid)
        # Connection ids are unique across restarts of a node with the same node id, so a
        # route left in Redis by the previous process never names a new connection.
        self._next_conn_id = time.time_ns() // 1000
        self._renewals: list[Route] = []
        self._kicks: dict[str, list[int]] = {}  # node -> conn_ids to KICK, not yet sent
        self._kick_pacer = Pacer(
            self._publish_kicks,
            lambda: len(self._kicks),
            self._kicks.clear,  # shutdown
            in_flight=KICKS_IN_FLIGHT,
            linger_s=KICKS_LINGER_S,
            spawn=self.spawn,  # settle() waits for them
        )
        # frames waiting for connections whose transport is past its high-water mark
        self.backlog: dict[Connection, Backlog] = {}
        self.corked: dict[Connection, bytes] = {}  # Connection.send_ahead
        self._soon: dict[Connection, list[bytes]] = {}  # frames to write at the iteration's end
        self._background: set[asyncio.Task[Any]] = set()
        self._last_prune = self.loop.time()
        self.accepting = True
        self.drain_hint = config.reconnect_hint  # the reconnect hint of the drain under way
        self.route_watch = RouteWatch(
            routes,
            node_id,
            every_s=config.route_check_s,
            sessions=lambda: list(self.sessions.values()),
            hint_all=self.hint_all,
            log=self.log,
            on_loss=self.metrics.route_losses.inc,
        )
        self.fan = FanOut(
            node_id=node_id,
            loop=self.loop,
            routes=routes,
            bus=bus,
            sessions=self.sessions,
            local=self.by_device.of,
            metrics=self.metrics,
            spawn=self.spawn,
            on_lookup_failed=self.route_watch.fanout_failed,
            log=self.log,
            throttle=self.log_throttle.allow,
        )
        # Media by object key (gateway/media.py); the server sets it when --media is given.
        self.media: Media | None = None
        # The transactional outbox, where other nodes could deliver for a dead one.
        outbox = store.outbox()
        self.outbox: OutboxKeeper | None = None
        if outbox is not None and not config.bus.startswith("local:"):
            self.outbox = OutboxKeeper(
                outbox,
                node_id,
                lease_s=config.node_lease_s,
                redeliver=self._redeliver,
                settled=self.fan.settled,
                owes_hints=self.owes_hints,
                log=self.log,
                conn_floor=self._next_conn_id,  # before any connection: ids go up from it (admit)
                adopt=self._adopt_hooks if self.hooks is not None else None,
            )

    async def _adopt_hooks(self, dead: str) -> None:
        """Take over what a dead node owed the hooks (its hook rows)."""
        moved = await self.store.hooks_adopt(dead, self.hook_node)
        if moved:
            self.log.warning("taking over a dead node's hook rows", dead=dead, rows=moved)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self.bus.start(self.node_id, self._on_bus, self._on_bus_resume)
        await self.route_watch.start()
        if self.shared_budgets is not None:
            self.shared_budgets.start()
        if self.outbox is not None:
            await self.outbox.start()
        if self.hooks is not None:
            self.hooks.start()
        self.wheel.start()

    def protocol_factory(self) -> Connection:
        return Connection(self)

    def new_decoder(self) -> FrameDecoder:
        return FrameDecoder(max_frame=self.config.max_frame, side=Side.SERVER)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` in the background, keeping a reference until it is done."""
        task = self.loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def settle(self) -> None:
        """Wait for background work (route writes, fan-out) started so far."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # -- admission and bookkeeping -------------------------------------------------------

    def admit(self, conn: Connection, peer_ip: str = "") -> int:
        """A new connection id for `conn` (from `peer_ip`, given when connections per IP
        are limited), or 0: refused (full, draining, or too many from its IP)."""
        cfg = self.config
        if not self.accepting or self.open_count >= self.max_connections:
            return 0
        if cfg.max_connections_per_ip:
            n = self._per_ip.get(peer_ip, 0)
            if n >= cfg.max_connections_per_ip:
                self.metrics.refused.labels(why="per_ip").inc()
                return 0
            self._per_ip[peer_ip] = n + 1
            conn.peer_ip = peer_ip
        self.open_count += 1
        self._next_conn_id += 1
        self.metrics.connections.inc()
        return self._next_conn_id

    # -- send backpressure -----------------------------------------------------------------

    def hold_sends(self, conn: Connection) -> None:
        """`conn` queued a SEND while the batcher holds send_backpressure or more: stop
        reading from it until the queue is down to half (its kernel buffers fill and TCP
        slows the client), so an overloaded node commits at full speed rather than spend
        its CPU reading and refusing what it cannot commit."""
        if conn.hold_reading():
            self.held.add(conn)
            self.metrics.send_holds.inc()

    def _after_batch(self, size: int, seconds: float) -> None:
        self.metrics.observe_batch(size, seconds)
        if self.held and self.batcher.pending <= self.config.send_backpressure // 2:
            held, self.held = self.held, set()
            if self.accepting:  # a draining node keeps its connections paused
                for conn in held:
                    conn.release_reading()

    def closing(self, conn: Connection, *, was_active: bool) -> None:
        """`conn` started closing: stop routing to it now (unless LOGOUT did already)."""
        if was_active and self._end_local(conn) and conn.route is not None:
            self.spawn(self._remove_route(conn.route))

    def forget(self, conn: Connection, *, was_active: bool) -> None:
        """`conn`'s socket is gone."""
        if not conn.conn_id:
            return  # never admitted
        self.open_count -= 1
        self.metrics.connections.dec()
        self.held.discard(conn)
        self.penalized.discard(conn)
        if ip := conn.peer_ip:
            n = self._per_ip.get(ip, 1) - 1
            if n:
                self._per_ip[ip] = n
            else:
                self._per_ip.pop(ip, None)
        if was_active and self.sessions.get(conn.conn_id) is conn:
            self.closing(conn, was_active=True)

    def _end_local(self, conn: Connection) -> bool:
        """Forget `conn`'s session here; False if it had none (already ended)."""
        if self.sessions.get(conn.conn_id) is not conn:
            return False
        del self.sessions[conn.conn_id]
        self.metrics.sessions.dec()
        route = conn.route
        if route is not None and self.by_device.get((route.uid, route.device)) is conn:
            del self.by_device[(route.uid, route.device)]
        return True

    async def _remove_route(self, route: Route) -> None:
        try:
            await self.routes.remove(route)
        except Exception as e:
            if (held := self.log_throttle.allow("route remove")) is not None:
                self.log.warning(
                    "route remove failed", uid=route.uid, error=repr(e), similar_held_back=held
                )

    # -- sessions ------------------------------------------------------------------------

    async def open_session(
        self, conn: Connection, uid: int, device: str, exp: int, iat: int | None = None
    ) -> Route | None:
        """`_open_session`, within max_connections_per_uid: a uid's logins under way count
        with its sessions (decided before the first await, so that logins sent at once
        cannot all pass); a login of a device online already replaces it, so it passes.
        TooManyConnections when over."""
        cap = self.config.max_connections_per_uid
        n = self._logins.get(uid, 0)
        if cap and n + self.by_device.count(uid) >= cap and (uid, device) not in self.by_device:
            self.metrics.refused.labels(why="per_uid").inc()
            raise TooManyConnections(f"too many connections for uid {uid} (at most {cap})")
        self._logins[uid] = n + 1
        try:
            return await self._open_session(conn, uid, device, exp, iat)
        finally:  # a session now, or nothing
            if (n := self._logins[uid] - 1) > 0:
                self._logins[uid] = n
            else:
                del self._logins[uid]

    async def _open_session(
        self, conn: Connection, uid: int, device: str, exp: int, iat: int | None
    ) -> Route | None:
        """Install the route of `conn`'s verified LOGIN and register it as a session
        here; the previous connection of the same device, here or on another node, is
        kicked. None when `conn` lost: kicked (draining, or a later login of the device
        won) or closed meanwhile. `conn` activates itself with the route (Connection.log_in)
        in the same step."""
        if not self.accepting:  # draining: log in elsewhere
            conn.kick(KickReason.DRAINING, "server draining", self.drain_hint)
            return None
        route = Route(uid, device, self.node_id, conn.conn_id, time.time_ns())
        try:
            prev = await self.routes.register(route, iat=iat)
        except BackendUnavailable:
            # The write may have landed before the error: take it back (CAS, best effort).
            self.spawn(self._remove_route(route))
            raise
        waiting = conn.logging_in  # not closed while the route was written
        if not waiting or not self.accepting:
            await self.routes.remove(route)
            if waiting:
                conn.kick(KickReason.DRAINING, "server draining", self.drain_hint)
            return None
        old = self.by_device.get((uid, device))
        if old is not None and old is not conn:
            if old.route is not None and old.route.epoch > route.epoch:
                # A later login of this device finished first (its register came after
                # ours): this one is the older login and loses.
                conn.kick(KickReason.DUPLICATE_LOGIN, "logged in elsewhere")
                self.spawn(self._remove_route(route))  # CAS: only if ours won the write
                return None
            old.kick(KickReason.DUPLICATE_LOGIN, "logged in elsewhere")
        self.sessions[conn.conn_id] = conn
        self.by_device[(uid, device)] = conn
        self.metrics.sessions.inc()
        if prev is not None and prev.node != self.node_id:
            # Registered before this await: a close during it cleans up like any other.
            # In the background: the LOGIN does not wait for the broker's confirm.
            self._kick_remote(prev.node, prev.conn_id)
        return route

    async def revoke(self, uid: int, device: str | None) -> int:
        """Revoke the tokens of `uid` (one device, or all) minted until now: later logins
        with them are refused, their push registrations go (a stolen phone is told
        nothing more), and the sessions online anywhere are kicked with auth_revoked.
        The number of sessions kicked."""
        cfg = self.config
        await self.routes.revoke(
            uid, device, int(time.time()), cfg.token_max_lifetime + cfg.token_leeway
        )
        if device is not None:
            await self.store.push_unregister(uid, device)
        else:
            for d in (await self.store.push_devices([uid])).get(uid, ()):
                await self.store.push_unregister(uid, d.device)
        return await self.kick(uid, device, KickReason.AUTH_REVOKED, "token revoked")

    async def kick(self, uid: int, device: str | None, reason: KickReason, text: str) -> int:
        """KICK `reason` to the sessions of `uid` (one device, or all) online on any node
        (revocations, the server API). The number of sessions kicked."""
        online = await self.routes.online([uid])
        kicked = 0
        for route in online.get(uid, ()):
            if device is not None and route.device != device:
                continue
            kicked += 1
            if route.node == self.node_id:
                conn = self.sessions.get(route.conn_id)
                if conn is not None and conn.route == route:
                    conn.kick(reason, text)
            elif (reason, text) == (KickReason.AUTH_REVOKED, "token revoked"):
                # what every node reads, whatever its version
                await self.bus.publish(route.node, envelope.revoke([route.conn_id]))
            else:
                await self.bus.publish(route.node, envelope.kick_as([route.conn_id], reason, text))
        return kicked

    def write_soon(self, conn: Connection, frame: bytes) -> None:
        """Write `frame` to `conn` with the others queued for it in this loop iteration,
        in one write (the answers to a flood of refused requests)."""
        frames = self._soon.get(conn)
        if frames is None:
            if not self._soon:
                self.loop.call_soon(self._write_soon)
            frames = self._soon[conn] = []
        frames.append(frame)

    def _write_soon(self) -> None:
        soon, self._soon = self._soon, {}
        for conn, frames in soon.items():
            conn.write(b"".join(frames))

    def _kick_remote(self, node: str, conn_id: int) -> None:
        """KICK duplicate_login to a connection on another node. After a node dies, every
        client of it that logs in here names it, thousands a second in a reconnect storm:
        the kicks waiting go out as one publish per node, paced like the stores'
        coalescers (storage/pacing.py; one publish per loop iteration carried about one
        kick). A connection known gone with its process (its node's outbox lease lapsed,
        or the node restarted since: OutboxKeeper.gone) is not kicked. Kicks are best
        effort anyway (a bus outage loses them), and the old route no longer receives
        pushes once replaced."""
        if self.outbox is not None and self.outbox.gone(node, conn_id):
            self.metrics.kicks_to_dead_nodes.inc()
            return
        self._kicks.setdefault(node, []).append(conn_id)
        self._kick_pacer.request()

    async def _publish_kicks(self) -> None:
        """One publish: every kick waiting for the node asked longest ago. (One publish
        to every waiting node per batch sent ~6x the publishes in a 7-worker storm, most
        to nodes whose old connections were gone anyway, and took recovery from 37 s to
        65 s: docs/decisions.md, "Coalescers are paced".)"""
        node = next(iter(self._kicks))
        conn_ids = self._kicks.pop(node)
        if (keeper := self.outbox) is not None:  # gone while they waited?
            live = [c for c in conn_ids if not keeper.gone(node, c)]
            if len(live) < len(conn_ids):
                self.metrics.kicks_to_dead_nodes.inc(len(conn_ids) - len(live))
            conn_ids = live
        if conn_ids:
            await self.bus.publish(node, envelope.kick(conn_ids))

    async def end_session(self, conn: Connection) -> None:
        """LOGOUT: the route goes at once (closing it later removes nothing twice)."""
        route = conn.route
        if route is not None and self._end_local(conn):
            await self._remove_route(route)

    def renew_route(self, conn: Connection) -> None:
        if conn.route is not None:
            self._renewals.append(conn.route)

    def _timer_failed(self, entry: object, e: Exception) -> None:
        """A connection's timer work (or the node's tick) raised: a bug. Log it (at most
        once a second) and close the connection, which has no timer any more."""
        if (held := self.log_throttle.allow(f"timer {type(e).__name__}")) is not None:
            self.log.error("timer failed", error=repr(e), similar_held_back=held, exc_info=e)
        if isinstance(entry, Connection):
            entry.close()

    def _on_tick(self) -> None:
        if self._renewals:
            batch, self._renewals = self._renewals, []
            self.metrics.route_renewals.inc(len(batch))
            self.spawn(self._renew(batch))
        now = self.loop.time()
        if now - self._last_prune >= RATE_PRUNE_EVERY_S:
            self._last_prune = now
            self.limiter.prune()
            self.op_limiter.prune()
            self.typing_limiter.prune()
            self.group_limiter.prune()
            self.spawn(self._maintain())

    async def _maintain(self) -> None:
        if self.media is not None:  # beside the store's (pruning may take most of a minute)
            self.spawn(self._sweep_media())
        try:
            await self.store.maintain()
        except Exception as e:  # housekeeping retries next minute
            self.log.warning("store maintenance failed", error=repr(e))

    async def _sweep_media(self) -> None:
        if self.media is not None:
            try:
                if swept := await self.media.sweep():
                    self.metrics.media_swept.inc(swept)
                    self.log.info("orphaned media deleted", uploads=swept)
            except Exception as e:  # the next minute's sweep tries again
                self.log.warning("media sweep failed", error=repr(e))

    async def _renew(self, batch: Sequence[Route]) -> None:
        # Only routes still owned by a live session (not one that logged out since it
        # was queued: renewing that would bring the route back).
        batch = [r for r in batch if (c := self.sessions.get(r.conn_id)) and c.route == r]
        if not batch:
            return
        try:
            await self.routes.renew(batch)
        except Exception as e:
            self.log.warning("route renewal failed", routes=len(batch), error=repr(e))

    # -- delivery ------------------------------------------------------------------------

    def push_message(
        self,
        msg: StoredMessage,
        *,
        exclude: Session | None = None,
        uids: Iterable[int] | None = None,
    ) -> None:
        """PUSH a committed message to every online device of every member (or of `uids`)
        except the connection `exclude` that sent it. Best effort, in the background. Every
        committed message passes here once (sends, system and recall messages): the hook
        queue gets it here, or (for push events) once the fan-out knows where it went."""
        if self.hooks is not None and not self._hooks_see:
            self.hooks.add(Owed(msg))
        if uids is not None:
            self._push(msg, exclude, list(uids), owed=True)
        else:
            self.spawn(self._push_to_members(msg, exclude))

    async def _push_to_members(self, msg: StoredMessage, exclude: Session | None) -> None:
        try:
            uids = await self.store.member_uids(msg.conv_id)
        except Exception as e:  # its hook row, if any, is delivered from the store
            self.log.warning("fan-out failed", conv_id=msg.conv_id, seq=msg.seq, error=repr(e))
            return
        self._push(msg, exclude, uids, owed=True)

    def _push(
        self, msg: StoredMessage, exclude: Session | None, uids: Sequence[int], *, owed: bool
    ) -> None:
        """PUSH `msg` to `uids`; `owed`: the hook queue (when it wants to know where the
        message went) gets it once the fan-out is done."""
        payload = encode(
            Push(
                msg.conv_id, msg.seq, msg.msg_id, msg.sender_uid, msg.msg_type, msg.content,
                msg.server_ms, msg.client_msg_id,
            )
        )  # fmt: skip
        hooks = self.hooks
        if owed and self._hooks_see and hooks is not None:
            self.fan.deliver(
                uids, payload, exclude, lambda online: hooks.add(Owed(msg, uids, online))
            )
        else:
            self.fan.deliver(uids, payload, exclude)

    def deliver(self, uids: Sequence[int], payload: bytes, *, skip: Session | None = None) -> None:
        """Write `payload` to every online device of `uids` except `skip`, soon: local
        connections directly, remote ones through the bus (see gateway.fanout)."""
        self.fan.deliver(uids, payload, skip)

    async def _redeliver(self, row: OutboxRow) -> None:
        """PUSH again what a dead node's commit owed (see gateway.outbox)."""
        for conv_id, lo, hi in row.entries:
            msgs, _ = await self.store.read_after(
                conv_id, lo - 1, hi - lo + 1, min_seq=0, max_seq=hi
            )
            if msgs:
                uids = await self.store.member_uids(conv_id)
                for msg in msgs:  # its hook rows were adopted: not owed again from here
                    self._push(msg, None, uids, owed=False)

    def _on_bus(self, data: bytes) -> None:
        try:
            kind, items = envelope.unpack(data)
            for conn_ids, payload in items:
                for conn_id in conn_ids:
                    conn = self.sessions.get(conn_id)
                    if conn is None:
                        continue
                    if kind == envelope.FRAMES:
                        conn.write(payload)
                    elif kind == envelope.KICK:
                        conn.kick(KickReason.DUPLICATE_LOGIN, "logged in elsewhere")
                    elif kind == envelope.REVOKE:
                        conn.kick(KickReason.AUTH_REVOKED, "token revoked")
                    elif kind == envelope.KICK_AS:
                        reason, text = envelope.kick_reason(payload)
                        conn.kick(KickReason(reason), text)
        except Exception as e:
            self.log.warning("bad bus envelope", error=repr(e))
            raise  # the bus dead-letters it

    def owes_hints(self) -> bool:
        """Whether SYNC_HINTs for frames lost by fan-out are still to be sent."""
        return self.fan.owes_hints or self.route_watch.owes_hints

    def close(self) -> None:
        """Stop the node's timers and background retries (at the end of a shutdown)."""
        self.wheel.stop()
        self.route_watch.stop()
        if self.shared_budgets is not None:
            self.shared_budgets.stop()
        if self.outbox is not None:
            self.outbox.stop()
        self.fan.close()

    def _on_bus_resume(self) -> None:
        """The bus link is back after an outage: pushes to our connections may have been
        lost, so every session gets SYNC_HINT."""
        self.log.warning("bus link restored; sending SYNC_HINT", sessions=len(self.sessions))
        self.spawn(self.hint_all("bus outage"))

    async def hint_all(self, why: str) -> None:
        """SYNC_HINT to every session, spread over `sync_hint_spread_s` so that they do
        not all SYNC at once."""
        conns = list(self.sessions.values())
        self.metrics.sync_hints.labels(why=why).inc(len(conns))
        await self.paced(
            conns, len(conns) / max(self.config.sync_hint_spread_s, PACE_STEP_S), _sync_hint
        )

    async def paced(
        self, conns: Sequence[Session], per_s: float, act: Callable[[Session], None]
    ) -> None:
        """Apply `act` to each of `conns` still logged in, at most `per_s` per second
        (all at once when `per_s` <= 0)."""
        started = self.loop.time()
        done = 0
        while done < len(conns):
            allowed = due_by(self.loop.time() - started, per_s, len(conns))
            for conn in conns[done:allowed]:
                if conn.active:
                    act(conn)
            done = max(done, min(allowed, len(conns)))
            if done < len(conns):
                await asyncio.sleep(PACE_STEP_S)


class Devices:
    """The logged-in connection of each (uid, device) on this node, looked up by
    ``(uid, device)`` like a dict. Kept by uid: the one device of most uids is held
    without a tuple key or a dict of its own, and a uid's count is at hand
    (max_connections_per_uid). A connection stored here has its route (it activates in
    the step that stores it), which names its device."""

    __slots__ = ("_by_uid",)

    def __init__(self) -> None:
        self._by_uid: dict[int, Connection | dict[str, Connection]] = {}

    def get(self, key: tuple[int, str]) -> Connection | None:
        uid, device = key
        held = self._by_uid.get(uid)
        if held is None:
            return None
        if type(held) is dict:
            return held.get(device)
        assert isinstance(held, Connection)
        return held if _device(held) == device else None

    def __getitem__(self, key: tuple[int, str]) -> Connection:
        conn = self.get(key)
        if conn is None:
            raise KeyError(key)
        return conn

    def __contains__(self, key: object) -> bool:
        return type(key) is tuple and self.get(key) is not None

    def __setitem__(self, key: tuple[int, str], conn: Connection) -> None:
        uid, device = key
        held = self._by_uid.get(uid)
        if held is None:
            self._by_uid[uid] = conn
        elif type(held) is dict:
            held[device] = conn
        else:
            assert isinstance(held, Connection)
            if (other := _device(held)) == device:
                self._by_uid[uid] = conn
            else:
                self._by_uid[uid] = {other: held, device: conn}

    def __delitem__(self, key: tuple[int, str]) -> None:
        uid, device = key
        held = self._by_uid.get(uid)
        if type(held) is dict:
            del held[device]
            if len(held) == 1:
                self._by_uid[uid] = next(iter(held.values()))
        elif isinstance(held, Connection) and _device(held) == device:
            del self._by_uid[uid]
        else:
            raise KeyError(key)

    def __len__(self) -> int:
        return sum(len(h) if type(h) is dict else 1 for h in self._by_uid.values())

    def of(self, uid: int) -> tuple[Connection, ...]:
        """The uid's logged-in connections."""
        held = self._by_uid.get(uid)
        if held is None:
            return ()
        if type(held) is dict:
            return tuple(held.values())
        assert isinstance(held, Connection)
        return (held,)

    def count(self, uid: int) -> int:
        """The uid's logged-in connections."""
        held = self._by_uid.get(uid)
        return 0 if held is None else len(held) if type(held) is dict else 1


def _device(conn: Connection) -> str:
    route = conn.route
    assert route is not None  # stored with its route (open_session, then activate)
    return route.device


def due_by(elapsed_s: float, per_s: float, total: int) -> int:
    """How many of `total` paced actions are due `elapsed_s` after the start, at `per_s`
    a second (the first at once; all at once when `per_s` <= 0)."""
    if per_s <= 0:
        return total
    return min(total, int(elapsed_s * per_s) + 1)


_SYNC_HINT: Final = encode(SyncHint())


def _sync_hint(conn: Session) -> None:
    conn.write(_SYNC_HINT)
