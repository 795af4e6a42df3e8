"""A running `imgw chat`: stdin lines go out as messages (or /commands), incoming
messages and read receipts are printed, each message once."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from typing import Final

from gateway.chatview import Receipts, render
from gateway.client import Client, ClientError, SessionEnded, kick_name
from protocol.frames import Error, Kick, MsgRecord, Push, ReadNotify
from protocol.ops import KickReason, MsgType

HISTORY_LINES: Final = 20
_RECONNECTING: Final = (KickReason.DRAINING, KickReason.SHUTDOWN)
HELP: Final = """\
commands:
  /help     this list
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


class ChatSession:
    __slots__ = ("client", "conv_id", "last_read", "printed", "receipts", "uid")

    def __init__(self, client: Client, uid: int, conv_id: int) -> None:
        self.client = client
        self.uid = uid
        self.conv_id = conv_id
        self.last_read = 0
        self.printed: set[int] = set()  # seqs shown (history and live overlap at start)
        self.receipts = Receipts()

    def show(self, m: Push | MsgRecord) -> None:
        if m.seq in self.printed:
            return
        self.printed.add(m.seq)
        say(render(m))
        if m.sender_uid == self.uid and m.msg_type == MsgType.TEXT:
            self.receipts.own(m.seq, m.content.decode("utf-8", "replace"))

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

    async def type_lines(self, lines: asyncio.Queue[str | None]) -> None:
        """Send each line, or run it as a /command; return at /quit or end of input."""
        while (line := await lines.get()) is not None:
            text = line.strip()
            if not text:
                continue
            if text.startswith("/") and not text.startswith("//"):
                if text == "/quit":
                    return
                word = text.split()[0]
                say(HELP if word == "/help" else f"! unknown command {word}; /help lists them")
                continue
            await self.send(line.lstrip()[1:] if text.startswith("//") else line)

    async def send(self, line: str) -> None:
        try:
            ack = await self.client.send(self.conv_id, line.encode())
        except SessionEnded:
            raise
        except ClientError as e:
            say(f"! not sent: {e}")
            return
        self.printed.add(ack.seq)
        self.receipts.own(ack.seq, line)

    async def show_incoming(self) -> None:
        async for frame in self.client.incoming():
            if isinstance(frame, Push) and frame.conv_id == self.conv_id:
                self.show(frame)
                await self.mark_read(frame.seq)
            elif isinstance(frame, ReadNotify) and frame.conv_id == self.conv_id:
                if frame.reader_uid != self.uid:
                    line = self.receipts.read(frame.reader_uid, frame.seq)
                    if line is not None:
                        say(line)
            elif isinstance(frame, Kick):
                why = kick_name(frame.reason) + (f": {frame.text}" if frame.text else "")
                then = "; reconnecting" if frame.reason in _RECONNECTING else ""
                say(f"* disconnected by the server ({why}){then}")
            elif isinstance(frame, Error):
                say(f"! server error: {ClientError(frame.code, frame.text)}")
