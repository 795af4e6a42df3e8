"""The RabbitMQ adapter: `AmqpBus`, the `Bus` port on aio-pika (topology in `bus`)."""

from storage.amqp.bus import AmqpBus, AmqpOptions, parse_amqp_url

__all__ = ["AmqpBus", "AmqpOptions", "parse_amqp_url"]
