"""`imgw chat`: a line-based terminal chat on the client library.

It mints its own token (the dev key unless told otherwise), opens a p2p conversation or
uses a group, prints the last messages, then sends every stdin line and prints what
arrives. Reading stdin happens on a daemon thread, so it works the same from a
terminal, a pipe or a file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import ssl
import sys
import threading
import time
from typing import Final

import msgpack

from gateway.client import Client, ClientError, SessionEnded, kick_name
from protocol.frames import Error, Kick, MsgRecord, Notice, Push, ReadNotify
from protocol.ops import KickReason, MsgType
from protocol.token import DEVICE_RE, sign_token

HISTORY_LINES: Final = 20
_RECONNECTING: Final = (KickReason.DRAINING, KickReason.SHUTDOWN)
TOKEN_TTL_S: Final = 86_400

_EPILOG = """\
examples:
  imgw chat --uid 1 --peer 2                 (and `imgw chat --uid 2 --peer 1` elsewhere)
  imgw chat --uid 1 --create-group team --members 2,3
  imgw chat --uid 2 --group 17 --addr 10.0.0.5:7070

Type a line and press Enter to send it; /quit or end of input (Ctrl-D) exits.
Incoming messages print as "[HH:MM:SS] <sender uid>: text".
"""


def add_arguments(p: argparse.ArgumentParser, *, default_key: str) -> None:
    p.description = "Chat from a terminal: send stdin lines, print incoming messages."
    p.epilog = _EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--uid", type=int, required=True, help="your user id")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--peer", type=int, metavar="UID", help="chat one to one with UID")
    target.add_argument("--group", type=int, metavar="CONV_ID", help="chat in this group")
    target.add_argument(
        "--create-group", metavar="TITLE", help="create a group (with --members) and chat in it"
    )
    p.add_argument("--members", default="", metavar="UID,UID", help="members of --create-group")
    p.add_argument(
        "--addr",
        default="127.0.0.1:7070",
        metavar="HOST:PORT[,HOST:PORT]",
        help="gateway address(es) (default 127.0.0.1:7070)",
    )
    p.add_argument("--device", default="cli", help='device name (default "cli")')
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--ca", metavar="PEM", help="with --tls: trust this CA (default: the system's)")
    p.add_argument(
        "--key",
        metavar="KID:SECRET",
        help="token signing key (default: the first entry of IMGW_TOKEN_KEYS, else the "
        "development key)",
    )
    p.set_defaults(chat_default_key=default_key)


def _signing_key(args: argparse.Namespace) -> tuple[str, str]:
    spec: str = args.key or ""
    if not spec:
        env = [e.strip() for e in os.environ.get("IMGW_TOKEN_KEYS", "").split(",") if e.strip()]
        spec = env[0] if env else args.chat_default_key
    kid, sep, secret = spec.partition(":")
    if not sep or not kid or not secret:
        raise ValueError("--key must be KID:SECRET")
    return kid, secret


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
        return f"{head} {m.sender_uid}: [{label}] {m.content.decode('utf-8', 'replace')}"
    return f"{head} {m.sender_uid}: [type {m.msg_type}, {len(m.content)} bytes]"


def _say(line: str) -> None:
    print(line, flush=True)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _members(spec: str) -> list[int]:
    try:
        uids = [int(u) for u in spec.split(",") if u.strip()]
    except ValueError:
        raise ValueError(f"--members must be uids separated by commas, got {spec!r}") from None
    if any(u < 1 for u in uids):
        raise ValueError("--members must be positive uids")
    return uids


def _start_stdin_reader(loop: asyncio.AbstractEventLoop) -> asyncio.Queue[str | None]:
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


class _Chat:
    __slots__ = ("client", "conv_id", "last_seq", "uid")

    def __init__(self, client: Client, uid: int, conv_id: int) -> None:
        self.client = client
        self.uid = uid
        self.conv_id = conv_id
        self.last_seq = 0

    async def show_history(self) -> None:
        result = await self.client.history(self.conv_id, 0, HISTORY_LINES)
        for m in result.msgs:
            _say(render(m))
        self.client.mark_seen(self.conv_id, (m.seq for m in result.msgs))
        if result.msgs:
            await self.mark_read(result.msgs[-1].seq)

    async def mark_read(self, seq: int) -> None:
        if seq > self.last_seq:
            self.last_seq = seq
            with contextlib.suppress(ClientError):  # down: the next line will read it
                await self.client.read(self.conv_id, seq)

    async def type_lines(self, lines: asyncio.Queue[str | None]) -> None:
        while (line := await lines.get()) is not None:
            if line.strip() == "/quit":
                return
            if not line.strip():
                continue
            try:
                await self.client.send(self.conv_id, line.encode())
            except SessionEnded:
                raise
            except ClientError as e:
                _say(f"! not sent: {e}")

    async def show_incoming(self) -> None:
        async for frame in self.client.incoming():
            if isinstance(frame, Push) and frame.conv_id == self.conv_id:
                _say(render(frame))
                await self.mark_read(frame.seq)
            elif isinstance(frame, ReadNotify) and frame.conv_id == self.conv_id:
                if frame.reader_uid != self.uid:
                    _say(f"({frame.reader_uid} read up to {frame.seq})")
            elif isinstance(frame, Notice):
                text = frame.content.decode("utf-8", "replace")
                _say(f"[{_clock(frame.server_ms)}] * notice from the server: {text}")
            elif isinstance(frame, Kick):
                why = kick_name(frame.reason) + (f": {frame.text}" if frame.text else "")
                then = "; reconnecting" if frame.reason in _RECONNECTING else ""
                _say(f"* disconnected by the server ({why}){then}")
            elif isinstance(frame, Error):
                _say(f"! server error: {ClientError(frame.code, frame.text)}")


async def _chat(args: argparse.Namespace, kid: str, secret: str) -> int:
    uid, device = args.uid, args.device

    def token() -> str:
        now = int(time.time())
        return sign_token(kid, secret, uid, device, now + TOKEN_TTL_S, iat=now)

    tls = ssl.create_default_context(cafile=args.ca) if args.tls or args.ca else None
    client = Client(args.addr, uid, device, token, tls=tls)
    try:
        try:
            ok = await client.connect()
        except ClientError as e:
            _err(f"imgw chat: cannot log in to {args.addr} as {uid}/{device}: {e}")
            return 1
        try:
            if args.peer is not None:
                conv_id = await client.open_p2p(args.peer)
                what = f"chat with {args.peer}"
            elif args.group is not None:
                conv_id, what = args.group, f"group {args.group}"
            else:
                conv_id = await client.group_create(args.create_group, _members(args.members))
                what = f'new group "{args.create_group}"'
            chat = _Chat(client, uid, conv_id)
            await chat.show_history()
        except ClientError as e:
            _err(f"imgw chat: {e}")
            return 1
        _say(f"--- {what}, conversation {conv_id} on {ok.node}; /quit to exit ---")
        lines = _start_stdin_reader(asyncio.get_running_loop())
        typing = asyncio.create_task(chat.type_lines(lines))
        showing = asyncio.create_task(chat.show_incoming())
        await asyncio.wait({typing, showing}, return_when=asyncio.FIRST_COMPLETED)
        for task in (typing, showing):
            task.cancel()
        await asyncio.wait({typing, showing})
        if typing.cancelled():  # incoming ended first: the session is over
            _err(f"imgw chat: {client.end_reason or 'session ended'}")
            return 1
        if (error := typing.exception()) is not None:
            _err(f"imgw chat: {error}")
            return 1
        with contextlib.suppress(ClientError):
            await client.logout()
        return 0
    finally:
        await client.close()


def main(args: argparse.Namespace) -> int:
    if args.uid < 1:
        print("imgw chat: --uid must be a positive integer", file=sys.stderr)
        return 2
    if DEVICE_RE.fullmatch(args.device) is None:
        print("imgw chat: --device must match [A-Za-z0-9_-]{1,32}", file=sys.stderr)
        return 2
    if args.members and args.create_group is None:
        print("imgw chat: --members goes with --create-group", file=sys.stderr)
        return 2
    try:
        kid, secret = _signing_key(args)
        _members(args.members)
    except ValueError as e:
        print(f"imgw chat: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_chat(args, kid, secret))
    except KeyboardInterrupt:
        return 130
