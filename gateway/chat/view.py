"""How `imgw chat` shows things: messages as terminal lines, and read receipts as who
has read which of your messages."""

from __future__ import annotations

import time
from typing import Final

import msgpack

from protocol.frames import MsgRecord, Notice, Push
from protocol.ops import MsgType

QUOTE_CHARS: Final = 40
OWN_KEPT: Final = 200  # your latest messages that read receipts can name


def _clock(server_ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(server_ms / 1000))


def _uids(value: object) -> str:
    return ", ".join(str(u) for u in value) if isinstance(value, list) else "?"


_MEDIA: Final[dict[int, str]] = {
    MsgType.IMAGE: "image",
    MsgType.VOICE: "voice",
    MsgType.FILE: "file",
}


def render(m: Push | MsgRecord) -> str:
    """One message as a terminal line."""
    head = f"[{_clock(m.server_ms)}]"
    if m.msg_type == MsgType.TEXT:
        return f"{head} {m.sender_uid}: {m.content.decode('utf-8', 'replace')}"
    if m.msg_type == MsgType.SYSTEM:
        try:
            ev = msgpack.unpackb(m.content, raw=False)
            event, by, who = ev.get("event"), ev.get("by"), _uids(ev.get("uids"))
        except Exception:
            return f"{head} * (unreadable system message)"
        if event == "created":
            return f'{head} * {by} created "{ev.get("title", "")}" with {who}'
        if event == "added":
            return f"{head} * {by} added {who}"
        if event == "removed":
            return f"{head} * {by} removed {who}"
        if event == "left":
            return f"{head} * {who} left"
        if event == "titled":
            return f'{head} * {by} renamed the group "{ev.get("title", "")}"'
        if event == "notice":
            return f"{head} * notice: {ev.get('text', '')}"
        return f"{head} * {event}"
    if m.msg_type == MsgType.RECALL:
        if not m.content:
            return f"{head} {m.sender_uid}: (recalled)"
        try:
            (seq,) = msgpack.unpackb(m.content, raw=False)
        except Exception:
            return f"{head} * a message was recalled"
        return f"{head} * message {seq} recalled"
    label = _MEDIA.get(m.msg_type)
    if label is not None:
        return f"{head} {m.sender_uid}: [{label}] {_media_text(m.content)}"
    return f"{head} {m.sender_uid}: [type {m.msg_type}, {len(m.content)} bytes]"


def _media_text(content: bytes) -> str:
    """A media message's content: the file name and object key it carries, or (a
    client's own format) its text."""
    try:
        value = msgpack.unpackb(content, raw=False)
    except Exception:
        value = None
    if isinstance(value, dict) and isinstance(value.get("key"), str):
        name = value.get("name")
        return f"{name} ({value['key']})" if isinstance(name, str) else value["key"]
    return content.decode("utf-8", "replace")


def render_notice(n: Notice) -> str:
    """A broadcast NOTICE (not stored, in no conversation) as a terminal line."""
    return f"[{_clock(n.server_ms)}] * notice from the server: " + n.content.decode(
        "utf-8", "replace"
    )


def quote(text: str) -> str:
    """`text` shortened to one quotable line."""
    line = " ".join(text.split())
    return f'"{line if len(line) <= QUOTE_CHARS else line[: QUOTE_CHARS - 1] + "…"}"'


def removal(m: Push | MsgRecord, uid: int, name: str) -> str | None:
    """What to tell `uid` when message `m` takes it out of the conversation `name`
    (a system message: removed by the owner, or left from another of its devices);
    None for any other message."""
    if m.msg_type != MsgType.SYSTEM:
        return None
    try:
        ev = msgpack.unpackb(m.content, raw=False)
        event, by, uids = ev.get("event"), ev.get("by"), ev.get("uids")
    except Exception:
        return None
    if not isinstance(uids, list) or uid not in uids:
        return None
    if event == "removed":
        return f"you were removed from {name} by {by}"
    if event == "left":
        return f"you left {name} (from another window or device)"
    return None


class Receipts:
    """Who has read which of your messages: READ_NOTIFY says "uid read up to seq";
    this turns it into "read by 3: <your latest message 3 has read>", each reader once
    per message of yours. A READ_NOTIFY may overtake the ack of the message it reads
    (another member reads it off its PUSH first): the reader's position is kept, and
    the line shows when the ack names the message (`own`)."""

    __slots__ = ("_own", "_read", "_shown")

    def __init__(self) -> None:
        self._own: dict[int, str] = {}  # seq -> text of your messages, the latest ones
        self._read: dict[int, int] = {}  # reader uid -> seq read up to
        self._shown: dict[int, int] = {}  # reader uid -> your latest message shown read

    def own(self, seq: int, text: str) -> str | None:
        """Your message `seq` is stored (its ack, or it came from another device of
        yours); the line to show for those who have read it already, or None."""
        self._own[seq] = text
        if len(self._own) > OWN_KEPT:
            del self._own[min(self._own)]
        readers = sorted(r for r, upto in self._read.items() if upto >= seq > self._shown.get(r, 0))
        for r in readers:
            self._shown[r] = seq
        return self._line(readers, seq) if readers and seq in self._own else None

    def read(self, reader: int, seq: int) -> str | None:
        """The line to show when `reader` has read up to `seq`; None when that reaches
        none of your messages not shown read by it before."""
        if seq <= self._read.get(reader, 0):
            return None
        self._read[reader] = seq
        shown = self._shown.get(reader, 0)
        newly = [s for s in self._own if shown < s <= seq]
        if not newly:
            return None
        latest = self._shown[reader] = max(newly)
        return self._line([reader], latest)

    def _line(self, readers: list[int], seq: int) -> str:
        return f"(read by {', '.join(map(str, readers))}: {quote(self._own[seq])})"
