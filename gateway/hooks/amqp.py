"""`--push-amqp URL`: push events to RabbitMQ, one persistent message per event,
acknowledged by the broker's publisher confirm (docs/push.md).

Topology, declared by the sink when it connects (idempotent):

- `imgw.push`: durable direct exchange; events go with the routing key `event`.
- `imgw.push.events`: durable queue bound to it, where push workers consume. A worker
  that rejects an event (`requeue=False`) sends it to the dead-letter exchange.
- `imgw.push.dead`: durable fanout exchange, and the durable queue `imgw.push.dead`
  bound to it, holding the rejected events for an operator to look at.

Each message is JSON (`content_type` application/json) with the event's `id` as its
`message_id`, so a worker deduplicates what a retry sent twice. A batch is acknowledged
once the broker confirmed every event of it: confirmed messages are on the broker's
disk, so a broker restart loses none. A publish that is not confirmed within
`timeout_s`, or returned as unroutable (someone deleted the queue), fails the batch,
which the hook queue sends again. The connection is aio-pika's robust one: it reconnects
by itself, and a send while it is down fails at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any, Final

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractRobustConnection
from yarl import URL

from gateway.hooks.push import Event
from storage.amqp.bus import redact

EXCHANGE: Final = "imgw.push"
ROUTING_KEY: Final = "event"
QUEUE: Final = "imgw.push.events"
DEAD_EXCHANGE: Final = "imgw.push.dead"
DEAD_QUEUE: Final = "imgw.push.dead"
CONNECT_TIMEOUT_S: Final = 5.0


class AmqpSink:
    name = "amqp"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        log: Any,
        throttle: Callable[[str], int | None] = lambda key: 0,
    ) -> None:
        self._url = url
        self._shown = redact(url)
        self._timeout_s = timeout_s
        self._log = log
        self._throttle = throttle
        self._conn: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self.failures = 0  # batches not confirmed

    def start(self) -> None:
        """Nothing: the first send connects (a broker down at start fails that send)."""

    async def _exchange_now(self) -> AbstractExchange:
        if self._exchange is not None and self._conn is not None and not self._conn.is_closed:
            return self._exchange
        if self._conn is None:
            conn = aio_pika.RobustConnection(
                URL(self._url), client_properties={"connection_name": "imgw push"}
            )
            try:
                async with asyncio.timeout(2 * CONNECT_TIMEOUT_S):
                    await conn.connect(timeout=CONNECT_TIMEOUT_S)
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
        channel = await self._conn.channel(publisher_confirms=True, on_return_raises=True)
        self._channel = channel
        exchange = await channel.declare_exchange(
            EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True
        )
        dead = await channel.declare_exchange(
            DEAD_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True
        )
        dead_queue = await channel.declare_queue(DEAD_QUEUE, durable=True)
        await dead_queue.bind(dead, routing_key="")
        queue = await channel.declare_queue(
            QUEUE, durable=True, arguments={"x-dead-letter-exchange": DEAD_EXCHANGE}
        )
        await queue.bind(exchange, routing_key=ROUTING_KEY)
        self._exchange = exchange
        return exchange

    async def send(self, events: list[Event]) -> bool:
        try:
            async with asyncio.timeout(self._timeout_s):
                exchange = await self._exchange_now()
                results = await asyncio.gather(
                    *(
                        exchange.publish(
                            aio_pika.Message(
                                json.dumps(e, separators=(",", ":")).encode(),
                                content_type="application/json",
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                message_id=e["id"],
                            ),
                            routing_key=ROUTING_KEY,
                            mandatory=True,
                        )
                        for e in events
                    )
                )
            if all(isinstance(r, aiormq.spec.Basic.Ack) for r in results):
                return True
            error = "not confirmed"
        except Exception as e:  # timeouts, nacks, returns, a closed channel alike
            error = repr(e)
            await self._drop_channel()  # declare again on a fresh channel next time
        self.failures += 1
        if (held := self._throttle("push amqp failed")) is not None:
            self._log.warning(
                "push events not confirmed by RabbitMQ; retrying", url=self._shown,
                events=len(events), error=error, similar_held_back=held,
            )  # fmt: skip
        return False

    async def _drop_channel(self) -> None:
        """Close the channel, not just forget it: the robust connection holds on to its
        channels and reopens each one after a reconnect, so one left open would be
        another channel on the broker after every outage."""
        channel, self._channel, self._exchange = self._channel, None, None
        if channel is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await channel.close()

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
            self._channel = None
            self._exchange = None
