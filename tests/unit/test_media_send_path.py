"""With media on, a text SEND keeps the synchronous path and never touches the media
index; only a media type (2-4) takes the queued path, where its key is checked."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from gateway.config import Config
from gateway.handlers.messaging import send_now
from protocol.frames import Send
from protocol.ops import MsgType


class Untouchable:
    """A media service that fails the test if anything but `is not None` looks at it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the text SEND path touched media.{name}")


class Batcher:
    pending = 0

    def __init__(self) -> None:
        self.submitted: list[Any] = []

    def submit(self, msg: Any) -> asyncio.Future[Any]:
        self.submitted.append(msg)
        return asyncio.get_running_loop().create_future()


async def test_text_sends_stay_synchronous_and_media_types_are_queued() -> None:
    batcher = Batcher()
    node: Any = SimpleNamespace(
        config=Config(),
        media=Untouchable(),
        batcher=batcher,
        limiter=SimpleNamespace(take=lambda uid: True),
        loop=asyncio.get_running_loop(),
    )
    conn: Any = SimpleNamespace(uid=1, hold_sends=lambda: None)
    assert send_now(node, conn, Send(1, 5, "t", MsgType.TEXT, b"hi"))
    assert send_now(node, conn, Send(2, 5, "a", 100, b"app type"))
    assert [m.client_msg_id for m in batcher.submitted] == ["t", "a"]
    for media_type in (MsgType.IMAGE, MsgType.VOICE, MsgType.FILE):
        assert not send_now(node, conn, Send(3, 5, "m", media_type, b"\x81\xa3key\xa1k"))
    assert len(batcher.submitted) == 2
    node.media = None  # media off: every type takes the synchronous path
    assert send_now(node, conn, Send(4, 5, "i", MsgType.IMAGE, b"\x81\xa3key\xa1k"))
    assert len(batcher.submitted) == 3


async def test_a_rate_limited_media_send_is_refused_before_any_media_work() -> None:
    """The send rate limit comes first: a flood of media SENDs costs no media index
    transaction and no object-store request beyond the limit."""
    from gateway.handlers.base import RequestError
    from gateway.handlers.messaging import send
    from protocol.mediakeys import media_content, media_key
    from protocol.ops import ErrorCode

    async def find_sent(uid: int, client_msg_id: str) -> None:
        return None

    node: Any = SimpleNamespace(
        config=Config(),
        media=Untouchable(),
        batcher=Batcher(),
        limiter=SimpleNamespace(take=lambda uid: False),
        store=SimpleNamespace(find_sent=find_sent),
        metrics=SimpleNamespace(
            sends=SimpleNamespace(labels=lambda **kw: SimpleNamespace(inc=lambda: None))
        ),
    )
    conn: Any = SimpleNamespace(uid=1)
    content = media_content(media_key(1, "a" * 64))
    try:
        await send(node, conn, Send(1, 5, "m", MsgType.IMAGE, content))
    except RequestError as e:
        assert e.code == ErrorCode.RATE_LIMITED
    else:
        raise AssertionError("a rate-limited media SEND was not refused")
