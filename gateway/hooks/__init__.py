"""What leaves the node for other systems, outside the send's latency: the content check
before a commit (`contentcheck`), and after it, from the durable hook queue (`queue`),
the notify webhook (`notify`) and push events for devices that were offline (`push`,
with the RabbitMQ sink in `amqp`). `post` is the HTTP client the webhooks share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.hooks.notify import NotifyStage
from gateway.hooks.post import JsonPost
from gateway.hooks.push import PushSink, PushStage, UrlSink
from gateway.hooks.queue import HookQueue, Stage

if TYPE_CHECKING:
    from gateway.config import Config
    from storage.ports import ChatStore, RouteStore


def hook_queue(
    config: Config,
    *,
    node_id: str,
    hook_node: str,
    store: ChatStore,
    routes: RouteStore,
    log: Any,
    throttle: Any,
) -> HookQueue | None:
    """The node's hook queue with the stages `config` asks for (None: none)."""
    stages: list[Stage] = []
    if config.notify_url:
        post = JsonPost(
            config.notify_url, what="notify webhook", token=config.notify_token, log=log,
            throttle=throttle,
        )  # fmt: skip
        stages.append(NotifyStage(post, node_id=node_id))
    sinks: list[PushSink] = []
    if config.push_url:
        post = JsonPost(
            config.push_url, what="push URL", token=config.push_token, log=log,
            throttle=throttle,
        )  # fmt: skip
        sinks.append(UrlSink(post, node_id=node_id))
    if config.push_amqp:
        from gateway.hooks.amqp import AmqpSink  # aio-pika only where it is used

        sinks.append(AmqpSink(config.push_amqp, log=log, throttle=throttle))
    if sinks:
        stages.append(PushStage(sinks, store=store, routes=routes, log=log, throttle=throttle))
    if not stages:
        return None
    return HookQueue(
        stages,
        queue_max=config.notify_queue_max,
        batch_max=config.notify_batch_max,
        log=log,
        throttle=throttle,
        hooks=store,
        hook_node=hook_node,
    )
