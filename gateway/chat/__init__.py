"""`imgw chat`: a line-based terminal chat on the client library.

It mints its own token (the dev key unless told otherwise), opens a p2p conversation or
uses a group, prints the last messages, then sends every stdin line and prints what
arrives (gateway.chat.session; how things look: gateway.chat.view). Reading stdin happens
on a daemon thread, so it works the same from a terminal, a pipe or a file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import ssl
import sys
import time
from typing import Final

from gateway.chat.session import ChatSession, say, start_stdin_reader
from gateway.client import Client, ClientError, ConnectionLost, parse_addresses
from gateway.client.link import TlsMismatch
from protocol.token import DEVICE_RE, sign_token

TOKEN_TTL_S: Final = 86_400

_EPILOG = """\
examples:
  imgw chat --uid 1 --peer 2                 (and `imgw chat --uid 2 --peer 1` elsewhere)
  imgw chat --uid 1 --create-group team --members 2,3
  imgw chat --uid 2 --group 17 --addr 10.0.0.5:7070 --device laptop

Each window is a device of its own unless --device says which: the same uid and device
in two windows logs the first one out (kicked: duplicate_login).

Type a line and press Enter to send it; /send PATH sends a file (when the gateway has
--media); /quit or end of input (Ctrl-D) exits, /help lists the commands. Incoming
messages print as "[HH:MM:SS] <sender uid>: text", read receipts as "(read by 2: <your
message>)" (each reader once), files with the download URL the gateway signs for you.
Removed from the group, it says so and exits (status 0).
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
        help="gateway address(es) (default 127.0.0.1:7070), or WebSocket URLs "
        "(ws://HOST:PORT/ws, wss:// with --tls)",
    )
    p.add_argument(
        "--device",
        help="device name (default: one per terminal, cli-pts-N, or cli-PID without one); "
        "the same uid and device in a second window logs the first one out",
    )
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--ca", metavar="PEM", help="with --tls: trust this CA (default: the system's)")
    p.add_argument(
        "--key",
        metavar="KID:SECRET",
        help="token signing key (default: the first entry of IMGW_TOKEN_KEYS, else the "
        "development key)",
    )
    p.set_defaults(chat_default_key=default_key)


def default_device() -> str:
    """A device name of its own for each `imgw chat`, so that several windows of one uid
    (the README's examples) do not log each other out: the terminal's (cli-pts-3), or
    the process's (cli-4711) when stdin is not a terminal."""
    try:
        tty = os.ttyname(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return f"cli-{os.getpid()}"
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", tty.removeprefix("/dev/")).strip("-")
    return f"cli-{name}"[:32]


def _signing_key(args: argparse.Namespace) -> tuple[str, str]:
    spec: str = args.key or ""
    if not spec:
        env = [e.strip() for e in os.environ.get("IMGW_TOKEN_KEYS", "").split(",") if e.strip()]
        spec = env[0] if env else args.chat_default_key
    kid, sep, secret = spec.partition(":")
    if not sep or not kid or not secret:
        raise ValueError("--key must be KID:SECRET")
    return kid, secret


def _members(spec: str) -> list[int]:
    try:
        uids = [int(u) for u in spec.split(",") if u.strip()]
    except ValueError:
        raise ValueError(f"--members must be uids separated by commas, got {spec!r}") from None
    if any(u < 1 for u in uids):
        raise ValueError("--members must be positive uids")
    return uids


async def _open_conversation(client: Client, args: argparse.Namespace) -> tuple[int, str, bool]:
    """The conversation to chat in, what to call it, and whether it was created now."""
    if args.peer is not None:
        return await client.open_p2p(args.peer), f"chat with {args.peer}", False
    if args.group is not None:
        info = await client.group_info(args.group)
        return args.group, f'group "{info.title}"', False
    conv_id = await client.group_create(args.create_group, _members(args.members))
    return conv_id, f'group "{args.create_group}"', True


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
        except ConnectionLost as e:
            hint = "; is `imgw serve` running there? (--addr says where)"
            if isinstance(e.__cause__, TlsMismatch):
                hint = ""  # it says what to change
            _err(f"imgw chat: {e}{hint}")
            return 1
        except ClientError as e:
            _err(f"imgw chat: cannot log in to {args.addr} as {uid}/{device}: {e}")
            return 1
        try:
            conv_id, name, created = await _open_conversation(client, args)
            chat = ChatSession(client, uid, conv_id, name)
            await chat.show_history()
        except ClientError as e:
            _err(f"imgw chat: {e}")
            return 1
        say(
            f"--- {'new ' * created}{name}, conversation {conv_id} on {ok.node}, "
            f"as {uid}/{device}; "
            "/quit to exit, /help for more ---"
        )
        lines = start_stdin_reader(asyncio.get_running_loop())
        typing = asyncio.create_task(chat.type_lines(lines))
        showing = asyncio.create_task(chat.show_incoming())
        await asyncio.wait({typing, showing}, return_when=asyncio.FIRST_COMPLETED)
        for task in (typing, showing):
            task.cancel()
        await asyncio.wait({typing, showing})
        if chat.gone is not None:  # out of the conversation: said so, nothing failed
            with contextlib.suppress(ClientError):
                await client.logout()
            return 0
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


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, if anything."""
    if args.uid < 1:
        return "--uid must be a positive integer"
    if DEVICE_RE.fullmatch(args.device) is None:
        return "--device must match [A-Za-z0-9_-]{1,32}"
    if args.members and args.create_group is None:
        return "--members goes with --create-group"
    if (args.peer is not None and args.peer < 1) or (args.group is not None and args.group < 1):
        return "--peer and --group must be positive integers"
    try:
        _signing_key(args)
        others = set(_members(args.members)) - {args.uid}
    except ValueError as e:
        return str(e)
    if args.create_group is not None and not others:
        return "--create-group needs --members UID,UID: the others in the group (you are in it)"
    try:
        parse_addresses(args.addr)
    except ValueError as e:
        return f"--addr: {e}"
    return None


def main(args: argparse.Namespace) -> int:
    if args.device is None:
        args.device = default_device()
    if (problem := _problem(args)) is not None:
        print(f"imgw chat: {problem}", file=sys.stderr)
        return 2
    kid, secret = _signing_key(args)
    try:
        return asyncio.run(_chat(args, kid, secret))
    except KeyboardInterrupt:
        return 130
