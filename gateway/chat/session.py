"""A running `imgw chat`: stdin lines go out as messages (or /commands), incoming
messages and read receipts are printed, each message once, and so is the state of the
connection: lost, reconnected, back with the missed messages caught up; a line that
waits for its ack is marked pending, and sent once acked (after the reconnect that let
it through is shown). Removed from the group (or left from another window), it says so
and the session ends (`ChatSession.gone`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from dataclasses import dataclass
from typing import Final

from gateway.chat.files import media_key_in, send_file
from gateway.chat.view import Receipts, quote, removal, render, render_notice
from gateway.client import Client, ClientError, Event, SessionEnded, kick_name
from protocol.frames import Error, Kick, MsgRecord, Notice, Push, ReadNotify
from protocol.ops import KickReason, MsgType

HISTORY_LINES: Final = 20
WATCH_S: Final = 0.2  # how often the connection's state is looked at when all is quiet
PENDING_AFTER_S: Final = 0.5  # a line not acked by then is shown as pending
_RECONNECTING: Final = (KickReason.DRAINING, KickReason.SHUTDOWN)
HELP: Final = """\
commands:
  /help     this list
  /send F   send the file at path F (the gateway needs --media)
  /quit     leave (so does end of input, Ctrl-D)
  //text    send a line that starts with "/"
any other line is sent as a message."""


def say(line: str) -> None:
    print(line, flush=True)


def start_stdin_reader(loop: asyncio.AbstractEventLoop) -> asyncio.Queue[str | None]:
    """Lines of stdin on a queue, None at the end; a daemon thread does the blocking."""
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def put(item: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while we were reading
            loop.call_soon_threadsafe(lines.put_nowait, item)

    def pump() -> None:
        try:
            for line in sys.stdin:
                put(line.rstrip("\r\n"))
        finally:
            put(None)

    threading.Thread(target=pump, name="imgw-chat-stdin", daemon=True).start()
    return lines


@dataclass(slots=True)
class _Line:
    text: str
    pending: bool = False  # shown as pending: say when it is sent


class ChatSession:
    __slots__ = (
        "catching", "client", "connects", "conv_id", "gone", "kicked", "last_read",
        "lookups", "missed", "name", "outbox", "printed", "receipts", "stalled", "uid", "up",
    )  # fmt: skip

    def __init__(self, client: Client, uid: int, conv_id: int, name: str = "") -> None:
        self.client = client
        self.uid = uid
        self.conv_id = conv_id
        self.name = name or f"conversation {conv_id}"  # 'group "crew"': what to call it
        self.gone: str | None = None  # why we are no longer a member: the session ends
        self.last_read = 0
        self.printed: set[int] = set()  # seqs shown (history and live overlap at start)
        self.receipts = Receipts()
        self.outbox: asyncio.Queue[_Line] = asyncio.Queue()
        self.stalled = False  # a send is waiting for its ack longer than PENDING_AFTER_S
        self.up = True  # the connection, as last shown
        self.connects = client.stats.connects
        self.kicked = False  # a KICK said why the connection went, and that it comes back
        self.catching: asyncio.Task[None] | None = None  # the catch-up after a reconnect
        self.missed = 0  # messages shown since the reconnect
        self.lookups: set[asyncio.Task[None]] = set()  # download URLs being asked for

    def show(self, m: Push | MsgRecord) -> None:
        if m.seq in self.printed:
            return
        self.printed.add(m.seq)
        self.missed += self.catching is not None
        say(render(m))
        if (key := media_key_in(m.msg_type, m.content)) is not None:
            task = asyncio.create_task(self._show_download(m.seq, key))
            self.lookups.add(task)
            task.add_done_callback(self.lookups.discard)
        if m.sender_uid == self.uid and m.msg_type == MsgType.TEXT:
            read = self.receipts.own(m.seq, m.content.decode("utf-8", "replace"))
            if read is not None:
                say(read)

    async def _show_download(self, seq: int, key: str) -> None:
        try:
            signed = await self.client.media_get(key)
        except ClientError as e:
            say(f"  (message {seq}: no download URL: {e})")
            return
        say(f"  (message {seq}: download {signed.url})")

    async def show_history(self) -> None:
        result = await self.client.history(self.conv_id, 0, HISTORY_LINES)
        for m in result.msgs:
            self.show(m)
        self.client.mark_seen(self.conv_id, (m.seq for m in result.msgs))
        if result.msgs:
            await self.mark_read(result.msgs[-1].seq)

    async def mark_read(self, seq: int) -> None:
        if seq > self.last_read:
            self.last_read = seq
            with contextlib.suppress(ClientError):  # down: the next line will read it
                await self.client.read(self.conv_id, seq)

    # -- typing -----------------------------------------------------------------------

    async def type_lines(self, lines: asyncio.Queue[str | None]) -> None:
        """Send each line, or run it as a /command; return at /quit or end of input,
        once what was typed before is sent (or refused)."""
        sender = asyncio.create_task(self._send_all())
        try:
            while (line := await lines.get()) is not None:
                text = line.strip()
                if text == "/quit":
                    break
                if text.startswith("/send ") or text == "/send":
                    path = text[len("/send") :].strip()
                    if path:
                        await self.outbox.join()  # after the lines typed before it
                        await self._send_file(path)
                    else:
                        say("! /send F: name the file to send")
                elif text.startswith("/") and not text.startswith("//"):
                    word = text.split()[0]
                    say(HELP if word == "/help" else f"! unknown command {word}; /help lists them")
                elif text:
                    self._queue(line.lstrip()[1:] if text.startswith("//") else line)
            sent = asyncio.create_task(self.outbox.join())
            await asyncio.wait({sent, sender}, return_when=asyncio.FIRST_COMPLETED)
            sent.cancel()
        finally:
            sender.cancel()
        if sender.done() and not sender.cancelled() and (error := sender.exception()):
            raise error

    async def _send_file(self, path: str) -> None:
        try:
            ack, key = await send_file(self.client, self.conv_id, path)
        except SessionEnded:
            raise
        except (OSError, ClientError) as e:
            say(f"! not sent: {path}: {e}")
            return
        self.printed.add(ack.seq)
        say(f"(sent {os.path.basename(path)} as {key})")

    def _queue(self, text: str) -> None:
        line = _Line(text)
        self._watch_link(idle=False)  # "lost" before the "(pending)" it explains
        if self.stalled or not self.client.connected:
            self._pending(line)
        self.outbox.put_nowait(line)

    def _pending(self, line: _Line) -> None:
        if not line.pending:
            line.pending = True
            say(f"(pending) {quote(line.text)}: sent once the gateway acks it")

    async def _send_all(self) -> None:
        while True:
            line = await self.outbox.get()
            try:
                await self._send(line)
            finally:
                self.outbox.task_done()

    async def _send(self, line: _Line) -> None:
        sending = asyncio.create_task(self.client.send(self.conv_id, line.text.encode()))
        try:
            if not (await asyncio.wait({sending}, timeout=PENDING_AFTER_S))[0]:
                self.stalled = True
                self._pending(line)
            ack = await sending
        except SessionEnded:
            raise
        except ClientError as e:
            say(f"! not sent: {quote(line.text)}: {e}")
            return
        finally:
            sending.cancel()
            self.stalled = False
        self.printed.add(ack.seq)
        if line.pending:
            self._watch_link(idle=False)  # the reconnect that let it through, first
            say(f"(sent) {quote(line.text)}")
        if (read := self.receipts.own(ack.seq, line.text)) is not None:
            say(read)  # read before its ack reached us

    # -- incoming and the connection -----------------------------------------------------

    async def show_incoming(self) -> None:
        """Show what arrives until the session ends, or until we are out of the
        conversation (`gone`)."""
        while self.gone is None:
            try:
                frame = await self.client.next_event(WATCH_S)
            except TimeoutError:
                self._watch_link(idle=True)
                continue
            except SessionEnded:
                return
            self._watch_link(idle=False)
            await self._show_event(frame)

    async def _show_event(self, frame: Event) -> None:
        if isinstance(frame, Push) and frame.conv_id == self.conv_id:
            self.show(frame)
            if (why := removal(frame, self.uid, self.name)) is not None:
                self.gone = why  # no READ: it would only be refused, not_member
                say(f"* {why}; leaving")
                return
            await self.mark_read(frame.seq)
        elif isinstance(frame, ReadNotify) and frame.conv_id == self.conv_id:
            if frame.reader_uid != self.uid:
                line = self.receipts.read(frame.reader_uid, frame.seq)
                if line is not None:
                    say(line)
        elif isinstance(frame, Notice):
            say(render_notice(frame))
        elif isinstance(frame, Kick):
            why = kick_name(frame.reason) + (f": {frame.text}" if frame.text else "")
            self.kicked = frame.reason in _RECONNECTING
            say(f"* disconnected by the server ({why}){'; reconnecting' * self.kicked}")
        elif isinstance(frame, Error):
            say(f"! server error: {ClientError(frame.code, frame.text)}")

    def _watch_link(self, *, idle: bool) -> None:
        """Say when the connection went, when it is back, and (once the queue is drained:
        `idle`) how many missed messages the catch-up brought."""
        client = self.client
        lost = "* connection to the gateway lost; reconnecting"
        if self.up and not client.connected:
            self.up = False
            if not self.kicked:
                say(lost)
        if client.connected and client.stats.connects != self.connects:
            if self.up and not self.kicked:  # gone and back between two looks
                say(lost)
            self.connects, self.up, self.kicked, self.missed = client.stats.connects, True, False, 0
            node = client.login_ok.node if client.login_ok is not None else "?"
            say(f"* reconnected to {node}; catching up")
            self.catching = asyncio.create_task(client.catch_up())
        task = self.catching
        if idle and task is not None and task.done():
            self.catching = None
            if not task.cancelled() and task.exception() is None:
                n = self.missed
                say(f"* back: {n} missed message{'s' * (n != 1)} caught up")
