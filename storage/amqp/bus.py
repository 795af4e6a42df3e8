"""The RabbitMQ `Bus` (aio-pika robust connection): frames between gateway nodes.

Topology, declared by every node at start (idempotent) and re-declared by aio-pika after
each reconnect:

- `imgw.bus`: durable direct exchange; the routing key is the target node id.
- `imgw.node.<node_id>`: one queue per node, bound to `imgw.bus` with the node id. Not
  exclusive and not durable: pushes are hints backed by the store (a client that misses
  one catches up with SYNC), so they are not worth disk writes, but the queue outlives a
  dropped connection and keeps buffering while its node reconnects. `x-expires` deletes
  it once its node has been gone for `expires_s`, after which publishes to that node come
  back unroutable instead of piling up; `x-max-length` (`queue_max`) bounds it while the
  node is alive but slow.
- `imgw.dlx`: durable fanout exchange, the node queues' dead-letter exchange, feeding the
  durable queue `imgw.dead` (at most 10000 messages, each kept 24 h): envelopes the
  handler failed on are rejected there for inspection, never redelivered in a loop.
  RabbitMQ also dead-letters what `x-max-length` drops from a full node queue (the oldest
  envelopes), so an overflow is visible there too.

Publishing uses a channel WITH publisher confirms. aiormq matches a `basic.return` to its
publish through the confirmation bookkeeping only; on a channel without confirms a returned
message is merely logged ("Unhandled message … returning") and no return callback runs, so
`unroutable` could never move. With confirms the publish resolves to the returned message
(counted `unroutable`) or to `Basic.Ack` (counted `published`: the broker has routed it to
a queue), and a nack is counted `lost`. The cost is one broker round trip per publish,
bounded by `publish_timeout_s`; the channel's lock is released before the ack is awaited, so
concurrent publishes still pipeline.

Link state: the connection's `close_callbacks` mark the link down (`outages += 1`) and make
`publish` count `lost` at once instead of waiting for the reconnect; the robust connection's
`reconnect_callbacks` run after it has reopened the channels and restored the exchanges,
queues, bindings, qos and consumer, and then `on_resume` runs.

URL: `amqp[s]://user:pw@host:port/vhost?queue_max=100000&expires_s=60&prefetch=512&
publish_timeout_s=1.0`; also passed to aio-pika: `heartbeat` (default 10 s, so a hung
broker is noticed), `name`, and the TLS options `cafile`, `capath`, `certfile`, `keyfile`,
`no_verify_ssl`. Any other option is an error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
import aiormq
import structlog
from aio_pika.abc import (
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractRobustChannel,
    AbstractRobustConnection,
)
from yarl import URL

from storage.errors import BusUnavailable
from storage.ports import BusHandler, Delivery, ResumeHandler

log = structlog.get_logger("imgw.bus")

BUS_EXCHANGE = "imgw.bus"
DEAD_EXCHANGE = "imgw.dlx"
DEAD_QUEUE = "imgw.dead"
DEAD_MAX = 10_000
DEAD_TTL_MS = 24 * 3600 * 1000
NODE_QUEUE_PREFIX = "imgw.node."

CONNECT_TIMEOUT_S = 5.0
MAX_INFLIGHT = 10_000  # publishes awaiting their confirm; beyond this they count as lost
HEARTBEAT_S = 10
RECONNECT_INTERVAL_S = 2
SCHEMES = ("amqp", "amqps")
PASSTHROUGH = ("heartbeat", "name", "cafile", "capath", "certfile", "keyfile", "no_verify_ssl")


@dataclass(frozen=True, slots=True)
class AmqpOptions:
    queue_max: int = 100_000
    expires_s: float = 60.0
    prefetch: int = 512
    publish_timeout_s: float = 1.0


def redact(url: str) -> str:
    """`url` with its password masked, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def parse_amqp_url(url: str) -> tuple[str, AmqpOptions]:
    """The URL for aio-pika (our options stripped, heartbeat and reconnect interval set) and
    the bus options. Raises ValueError on a bad scheme, option or value."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"bad bus URL {redact(url)!r}: use amqp://user:pw@host:5672/vhost")
    names = [f.name for f in dataclasses.fields(AmqpOptions)]
    fields = {name: str(getattr(AmqpOptions(), name)) for name in names}
    rest: dict[str, str] = {"heartbeat": str(HEARTBEAT_S)}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in fields:
            fields[name] = value
        elif name in PASSTHROUGH:
            rest[name] = value
        else:
            raise ValueError(
                f"unknown option {name!r} in bus URL {redact(url)!r}: use "
                f"{', '.join([*names, *PASSTHROUGH])}"
            )
    try:
        opts = AmqpOptions(
            queue_max=int(fields["queue_max"]),
            expires_s=float(fields["expires_s"]),
            prefetch=int(fields["prefetch"]),
            publish_timeout_s=float(fields["publish_timeout_s"]),
        )
    except ValueError:
        raise ValueError(f"bad number in bus URL {redact(url)!r}") from None
    if opts.queue_max < 1 or opts.expires_s < 0.001 or opts.publish_timeout_s <= 0:
        raise ValueError(
            f"bus URL {redact(url)!r}: need queue_max >= 1, expires_s > 0, publish_timeout_s > 0"
        )
    if not 0 <= opts.prefetch <= 65535:  # basic.qos prefetch-count is a short
        raise ValueError(f"bus URL {redact(url)!r}: prefetch must be 0..65535 (0 = unlimited)")
    rest["reconnect_interval"] = str(RECONNECT_INTERVAL_S)
    return urlunsplit(parts._replace(query=urlencode(rest))), opts


class AmqpBus:
    """The `Bus` port on RabbitMQ (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self._url, self.options = parse_amqp_url(url)
        self._shown_url = redact(url)
        self.published = self.lost = self.unroutable = self.dead_lettered = self.outages = 0
        self._inflight = 0  # publishes awaiting their confirm
        self._conn: AbstractRobustConnection | None = None
        self._push: AbstractExchange | None = None
        self._pub_channel: AbstractRobustChannel | None = None
        self._handler: BusHandler | None = None
        self._on_resume: ResumeHandler | None = None
        self._order = asyncio.Lock()  # one envelope at a time, in queue order
        self._down = False
        self._closing = False

    @staticmethod
    def queue_name(node: str) -> str:
        return NODE_QUEUE_PREFIX + node

    async def start(self, node: str, handler: BusHandler, on_resume: ResumeHandler) -> None:
        if self._conn is not None:
            raise RuntimeError("AmqpBus already started")
        self._handler, self._on_resume = handler, on_resume
        conn = aio_pika.RobustConnection(
            URL(self._url), client_properties={"connection_name": f"imgw bus {node}"}
        )
        try:
            async with asyncio.timeout(2 * CONNECT_TIMEOUT_S):
                await conn.connect(timeout=CONNECT_TIMEOUT_S)
                await self._declare(conn, node)
        except Exception as e:
            await conn.close()
            raise BusUnavailable(
                f"amqp: cannot start the bus on {self._shown_url}: {type(e).__name__}: {e} "
                "(is RabbitMQ running and the URL right? start it with "
                "`rabbitmq-server -detached` or `systemctl start rabbitmq-server`)"
            ) from e
        conn.close_callbacks.add(self._link_closed)
        conn.reconnect_callbacks.add(self._link_restored)
        self._conn = conn

    async def _declare(self, conn: AbstractRobustConnection, node: str) -> None:
        opts = self.options
        sub = await conn.channel(publisher_confirms=False)
        await sub.set_qos(prefetch_count=opts.prefetch)
        push = await sub.declare_exchange(BUS_EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
        dlx = await sub.declare_exchange(DEAD_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
        dead = await sub.declare_queue(
            DEAD_QUEUE,
            durable=True,
            arguments={"x-max-length": DEAD_MAX, "x-message-ttl": DEAD_TTL_MS},
        )
        await dead.bind(dlx, routing_key="")
        queue = await sub.declare_queue(
            self.queue_name(node),
            durable=False,
            exclusive=False,
            arguments={
                "x-expires": max(1, round(opts.expires_s * 1000)),
                "x-max-length": opts.queue_max,
                "x-dead-letter-exchange": DEAD_EXCHANGE,
            },
        )
        await queue.bind(push, routing_key=node)
        await queue.consume(self._deliver, no_ack=False)
        # Publishing has its own channel (with confirms, see the module docstring), so a
        # publish burst never queues behind acks and a channel error there spares the
        # consumer. Its exchange object only names `imgw.bus` (declared above).
        pub = await conn.channel(publisher_confirms=True, on_return_raises=False)
        self._push = await pub.get_exchange(BUS_EXCHANGE, ensure=False)
        self._pub_channel = pub

    async def _deliver(self, message: AbstractIncomingMessage) -> None:
        failed: Exception | None = None
        async with self._order:
            handler = self._handler
            if handler is None:  # closing: left unacked, the broker requeues it
                return
            try:
                result = handler(message.body)
                if inspect.isawaitable(result):
                    await result
            except Exception as e:
                failed = e
        try:
            if failed is None:
                await message.ack()
            else:
                self.dead_lettered += 1
                log.warning("bus envelope dead-lettered", error=repr(failed))
                await message.reject(requeue=False)
        except Exception as e:  # the channel is gone: the broker redelivers the envelope
            log.info("bus ack failed", error=repr(e))

    async def publish(self, node: str, payload: bytes) -> Delivery:
        exchange, channel = self._push, self._pub_channel
        if exchange is None or channel is None or self._down or channel.is_closed:
            self.lost += 1  # link down (or not started): never wait for the reconnect
            return Delivery.LOST
        if self._inflight >= MAX_INFLIGHT:
            # The broker is slow (flow control, a half-dead link the heartbeat has not
            # caught yet): do not pile frames up in the client's buffer.
            self.lost += 1
            return Delivery.LOST
        message = aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT)
        self._inflight += 1
        try:
            async with asyncio.timeout(self.options.publish_timeout_s):
                result = await exchange.publish(message, routing_key=node, mandatory=True)
        except Exception:  # timeout, nack, channel or connection closed under us
            self.lost += 1
            return Delivery.LOST
        finally:
            self._inflight -= 1
        if isinstance(result, aiormq.spec.Basic.Ack):
            self.published += 1
            return Delivery.OK
        self.unroutable += 1  # the returned message: no queue is bound for `node`
        return Delivery.UNROUTABLE

    def _link_closed(self, _conn: object, exc: BaseException | None = None) -> None:
        if self._closing or self._down:
            return
        self._down = True
        self.outages += 1
        log.warning("bus link lost", url=self._shown_url, error=repr(exc))

    def _link_restored(self, _conn: object) -> None:
        if self._closing:
            return
        self._down = False
        log.warning("bus link restored", url=self._shown_url)
        if self._on_resume is not None:
            try:
                self._on_resume()
            except Exception as e:
                log.error("bus on_resume failed", error=repr(e))

    async def close(self) -> None:
        self._closing = True
        self._handler = None
        conn, self._conn = self._conn, None
        self._push = self._pub_channel = None
        if conn is not None:
            await conn.close()
