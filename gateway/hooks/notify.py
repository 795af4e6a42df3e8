"""The notify webhook: every committed message, in batches, POSTed to `--notify-url`,
so that a backend can index them or moderate after the fact (docs/api.md, Webhook).

    POST <notify_url>   (Authorization: Bearer <notify_token> when one is set)
    {"node": "<node id>", "messages": [{"conv_id": 12, "seq": 8, "msg_id": "…",
      "sender_uid": 1001, "msg_type": 1, "content_b64": "…", "server_ms": …,
      "client_msg_id": "…", "text": "…"}, ...]}

A stage of the node's hook queue (gateway/hooks/queue.py): at least once, in commit
order, a receiver deduplicates by `msg_id`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.hooks.post import JsonPost
from gateway.hooks.queue import Owed
from gateway.http.jsonout import message_json, out_id
from storage.models import StoredMessage


def notification(msg: StoredMessage) -> dict[str, Any]:
    return {
        "conv_id": out_id(msg.conv_id),
        **message_json(
            msg.seq, msg.msg_id, msg.sender_uid, msg.msg_type, msg.content, msg.server_ms,
            msg.client_msg_id,
        ),
    }  # fmt: skip


class NotifyStage:
    name = "notify"

    def __init__(self, post: JsonPost, *, node_id: str) -> None:
        self.post = post
        self._node_id = node_id

    def start(self) -> None:
        self.post.start()

    async def deliver(self, batch: Sequence[Owed]) -> bool:
        body = {"node": self._node_id, "messages": [notification(o.msg) for o in batch]}
        return await self.post.post(body, len(batch))

    async def close(self) -> None:
        await self.post.close()
