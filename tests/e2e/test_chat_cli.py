"""`imgw chat` as a new user meets it (issue 16): processes against an in-process
gateway on the embedded store, asserting the lines they print."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from gateway.client import Client
from gateway.server import Server
from protocol.frames import Push
from tests.support.wire import TOKEN_KEY, token

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 20.0

pytestmark = pytest.mark.backends("embedded")

Proc = asyncio.subprocess.Process


async def start_chat(gw: Server, *args: str) -> Proc:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "chat", *args,
        "--addr", f"127.0.0.1:{gw.port}", "--key", TOKEN_KEY, cwd=ROOT, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


async def read_until(proc: Proc, text: str) -> str:
    """The first line of stdout containing `text`; fails with what came instead."""
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(WAIT_S):
            while line := (await proc.stdout.readline()).decode():
                seen.append(line)
                if text in line:
                    return line
    except TimeoutError:
        pass
    raise AssertionError(f"{text!r} not in output: {''.join(seen)!r}")


async def type_line(proc: Proc, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(f"{line}\n".encode())
    await proc.stdin.drain()


async def quit_chat(proc: Proc) -> tuple[int, str]:
    """/quit; the exit status and stderr."""
    await type_line(proc, "/quit")
    _, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@asynccontextmanager
async def chats(gw: Server, *argvs: list[str]) -> AsyncIterator[list[Proc]]:
    """`imgw chat` processes, each up (its header printed); killed if still running."""
    procs = [await start_chat(gw, *argv) for argv in argvs]
    try:
        for p in procs:
            await read_until(p, "/quit to exit")
        yield procs
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.communicate()


@asynccontextmanager
async def client(gw: Server, uid: int, device: str = "py") -> AsyncIterator[Client]:
    c = Client(f"127.0.0.1:{gw.port}", uid, device, lambda: token(uid, device))
    await c.connect()
    try:
        yield c
    finally:
        await c.close()


async def next_push(c: Client) -> Push:
    async with asyncio.timeout(WAIT_S):
        while not isinstance(event := await c.next_event(WAIT_S), Push):
            del event
        return event


async def test_two_windows_of_one_uid_do_not_log_each_other_out(gw: Server) -> None:
    async with (
        chats(gw, ["--uid", "11", "--peer", "12"], ["--uid", "11", "--peer", "12"]) as (
            first,
            second,
        ),
        client(gw, 12) as peer,
    ):
        conv_id = await peer.open_p2p(11)
        await peer.send(conv_id, b"to both windows")
        for window in (first, second):
            await read_until(window, "12: to both windows")
        for window in (first, second):
            rc, err = await quit_chat(window)
            assert (rc, err) == (0, "")
