"""Push events: for each committed message, the registered devices that did not get it
(docs/push.md). A stage of the node's hook queue (gateway/hooks/queue.py), so events
are delivered at least once, by the committing node or, when it dies, by a survivor.

The recipients of a message's event are its members' registered devices (PUSH_REGISTER,
storage/push.py) that had no online session when it was delivered, less the sender's
own devices and the members who muted the conversation. "Online" is what the fan-out
saw (`Owed.online`): the devices it wrote the PUSH to, here, or published it to on the
bus with the broker's confirm; a device that dropped between the route lookup and the
write is not among them and so is offline. A message read back from the store (the
node restarted, or adopted a dead node's rows) has no such record: its devices with a
route at the time of delivery count as online (they were given the message, or will
SYNC it). Only messages that count as unread (client messages, not system ones) have
events; a message without recipients has none.

Each event:

    {"id": "12:8", "conv_id": 12, "seq": 8, "msg_id": "…", "sender_uid": 1001,
     "msg_type": 1, "server_ms": …,
     "recipients": [{"uid": 1002, "device": "phone", "provider": "apns", "token": "…",
                     "locale": "fr", "unread": 3, "text": "…"}]}

`id` (conv_id:seq) is the same on every delivery of the event: sinks deduplicate by it.
`unread` is the recipient's unread count for the badge as it stands when the event is
built, bounded as storage/badges.py says (their most recently active conversations, each
counting at most its latest messages), so that building a batch of events costs the
same whatever its recipients left unread: a query for their devices, one for mutes, and
the badges (mostly remembered counts moved by the batch's messages). `text` is there
only where the device registered with `preview` and the message is text.

The sinks (`--push-url`, gateway/hooks/post.py; `--push-amqp`, gateway/hooks/amqp.py)
get the same events; a batch is done when both acknowledged it, and a sink that has is
not sent the batch again while the other is retried.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gateway.hooks.post import JsonPost
from gateway.hooks.queue import Owed
from gateway.http.jsonout import message_text, out_id
from storage.models import PushDevice
from storage.rules import counts_as_unread

if TYPE_CHECKING:
    from storage.ports import ChatStore, RouteStore

Event = dict[str, Any]


class PushSink(Protocol):
    name: str

    @property
    def failures(self) -> int:
        """Deliveries that failed."""
        ...

    def start(self) -> None: ...

    async def send(self, events: list[Event]) -> bool:
        """Deliver `events`; True once acknowledged. Never raises."""
        ...

    async def close(self) -> None: ...


class UrlSink:
    """`--push-url`: the events POSTed as {"node": …, "events": [...]}."""

    name = "url"

    def __init__(self, post: JsonPost, *, node_id: str) -> None:
        self.post = post
        self._node_id = node_id

    @property
    def failures(self) -> int:
        return self.post.failures

    def start(self) -> None:
        self.post.start()

    async def send(self, events: list[Event]) -> bool:
        return await self.post.post({"node": self._node_id, "events": events}, len(events))

    async def close(self) -> None:
        await self.post.close()


class PushStage:
    name = "push"

    def __init__(
        self,
        sinks: Sequence[PushSink],
        *,
        store: ChatStore,
        routes: RouteStore,
        log: Any,
        throttle: Callable[[str], int | None] = lambda key: 0,
    ) -> None:
        self.sinks = list(sinks)
        self._store = store
        self._routes = routes
        self._log = log
        self._throttle = throttle
        # the batch being delivered, its events, and the sinks that acknowledged them
        self._batch: Sequence[Owed] | None = None
        self._events: list[Event] = []
        self._acked: set[str] = set()
        self.events = 0  # events every sink acknowledged
        self.recipients = 0  # their recipients

    def start(self) -> None:
        for sink in self.sinks:
            sink.start()

    async def deliver(self, batch: Sequence[Owed]) -> bool:
        if batch is not self._batch:
            try:
                events = await self.build(batch)
            except Exception as e:
                if (held := self._throttle("push events")) is not None:
                    self._log.warning(
                        "cannot build push events; retrying", messages=len(batch),
                        error=repr(e), similar_held_back=held,
                    )  # fmt: skip
                return False
            self._batch, self._events, self._acked = batch, events, set()
        events = self._events
        if events:
            for sink in self.sinks:
                if sink.name not in self._acked and await sink.send(events):
                    self._acked.add(sink.name)
            if len(self._acked) < len(self.sinks):
                return False
            self.events += len(events)
            self.recipients += sum(len(e["recipients"]) for e in events)
        self._batch, self._events = None, []
        return True

    async def build(self, batch: Sequence[Owed]) -> list[Event]:
        """The events of `batch`, in its order: one per message with recipients."""
        store = self._store
        owed = [o for o in batch if counts_as_unread(o.msg.msg_type)]
        if not owed:
            return []
        members: list[list[int]] = []
        for o in owed:
            uids = o.members if o.members is not None else await store.member_uids(o.msg.conv_id)
            members.append([u for u in uids if u != o.msg.sender_uid])
        everyone = list(dict.fromkeys(u for m in members for u in m))
        devices = await store.push_devices(everyone)
        if not devices:
            return []
        unknown = [u for o, m in zip(owed, members, strict=True) if o.online is None for u in m]
        routed: set[tuple[int, str]] = set()
        if unknown:
            online = await self._routes.online([u for u in dict.fromkeys(unknown) if u in devices])
            routed = {(u, r.device) for u, rs in online.items() for r in rs}
        now = store.now_ms()
        found: list[tuple[Owed, list[PushDevice]]] = []
        for o, m in zip(owed, members, strict=True):
            seen = o.online if o.online is not None else routed
            offline = [d for u in m for d in devices.get(u, ()) if (u, d.device) not in seen]
            if offline:
                found.append((o, offline))
        if not found:
            return []
        muted = await store.muted(
            [(o.msg.conv_id, d.uid) for o, offline in found for d in offline], now
        )
        if muted:
            found = [
                (o, [d for d in offline if (o.msg.conv_id, d.uid) not in muted])
                for o, offline in found
            ]
        badge = await store.unread_badges(
            list({d.uid: None for _, offline in found for d in offline})
        )
        return [self._event(o, offline, badge) for o, offline in found if offline]

    @staticmethod
    def _event(o: Owed, offline: list[PushDevice], badge: dict[int, int]) -> Event:
        m = o.msg
        text = message_text(m.msg_type, m.content) if any(d.preview for d in offline) else None
        recipients = []
        for d in offline:
            r: dict[str, Any] = {
                "uid": out_id(d.uid), "device": d.device, "provider": d.provider,
                "token": d.token, "locale": d.locale, "unread": badge.get(d.uid, 0),
            }  # fmt: skip
            if d.preview and text is not None:
                r["text"] = text
            recipients.append(r)
        return {
            "id": f"{m.conv_id}:{m.seq}",
            "conv_id": out_id(m.conv_id),
            "seq": out_id(m.seq),
            "msg_id": str(m.msg_id),
            "sender_uid": out_id(m.sender_uid),
            "msg_type": m.msg_type,
            "server_ms": m.server_ms,
            "recipients": recipients,
        }

    async def close(self) -> None:
        for sink in self.sinks:
            await sink.close()
