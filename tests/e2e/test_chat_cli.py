"""`imgw chat` as a new user meets it: processes against an in-process
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
from tests.conftest import StartGateway
from tests.support.api import TOKEN as API_TOKEN
from tests.support.api import Api
from tests.support.proc import free_port
from tests.support.tcpproxy import TcpProxy
from tests.support.wire import TOKEN_KEY, token

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 20.0

pytestmark = pytest.mark.backends("embedded")


class Chat:
    """An `imgw chat` process and every line it printed so far."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    @classmethod
    async def start(cls, port: int | str, *args: str) -> Chat:
        """`port`: the gateway's TCP port, or a ws:// URL."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
        addr = port if isinstance(port, str) else f"127.0.0.1:{port}"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "chat", *args,
            "--addr", addr, "--key", TOKEN_KEY, cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        return cls(proc)

    async def until(self, text: str) -> str:
        """The first line containing `text`, printed so far or to come; fails with what
        came instead."""
        assert self.proc.stdout is not None
        start = len(self.lines)
        for line in self.lines:
            if text in line:
                return line
        try:
            async with asyncio.timeout(WAIT_S):
                while line := (await self.proc.stdout.readline()).decode():
                    self.lines.append(line.rstrip("\n"))
                    if text in line:
                        return self.lines[-1]
        except TimeoutError:
            pass
        raise AssertionError(f"{text!r} not in output: {self.lines[start:]!r}")

    async def type(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        await self.proc.stdin.drain()

    async def quit(self) -> tuple[int, str]:
        """/quit; the exit status and stderr (the rest of stdout goes to `lines`)."""
        await self.type("/quit")
        out, err = await asyncio.wait_for(self.proc.communicate(), WAIT_S)
        self.lines += out.decode().splitlines()
        assert self.proc.returncode is not None
        return self.proc.returncode, err.decode()

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.communicate()


@asynccontextmanager
async def chats(gw: Server, *argvs: list[str]) -> AsyncIterator[list[Chat]]:
    """`imgw chat` processes, each up (its header printed); killed if still running."""
    started: list[Chat] = []
    try:
        for argv in argvs:
            started.append(await Chat.start(gw.port, *argv))
        for chat in started:
            await chat.until("/quit to exit")
        yield started
    finally:
        for chat in started:
            await chat.kill()


@asynccontextmanager
async def client(gw: Server, uid: int, device: str = "py") -> AsyncIterator[Client]:
    c = Client(f"127.0.0.1:{gw.port}", uid, device, lambda: token(uid, device))
    await c.connect()
    try:
        yield c
    finally:
        await c.close()


async def test_two_windows_of_one_uid_do_not_log_each_other_out(gw: Server) -> None:
    windows = (["--uid", "11", "--peer", "12"], ["--uid", "11", "--peer", "12"])
    async with chats(gw, *windows) as (first, second), client(gw, 12) as peer:
        conv_id = await peer.open_p2p(11)
        await peer.send(conv_id, b"to both windows")
        for window in (first, second):
            await window.until("12: to both windows")
        for window in (first, second):
            assert await window.quit() == (0, "")


async def test_a_group_as_its_creator_and_its_members_see_it(gw: Server) -> None:
    creating = ["--uid", "21", "--create-group", "crew", "--members", "22,23"]
    async with chats(gw, creating) as (creator,):
        header = creator.lines[-1]
        conv_id = int(header.split("conversation ")[1].split()[0])
        await creator.type("/help")  # shows the commands, sends nothing
        await creator.until("/quit     leave")
        await creator.type("/nope")
        await creator.until("! unknown command /nope; /help lists them")
        await creator.type("//slash")  # sends "/slash"
        await creator.type("hi crew")
        async with client(gw, 22) as m22, client(gw, 23) as m23:
            for _ in range(100):
                msgs = (await m22.history(conv_id)).msgs
                if msgs[-1].content == b"hi crew":
                    break
                await asyncio.sleep(0.05)
            assert [m.content for m in msgs[1:]] == [b"/slash", b"hi crew"]
            await m22.read(conv_id, msgs[-1].seq)
            await creator.until('(read by 22: "hi crew")')
            await m23.read(conv_id, msgs[-1].seq)
            await creator.until('(read by 23: "hi crew")')  # each reader once
        async with chats(gw, ["--uid", "22", "--group", str(conv_id)]) as (member,):
            assert f'--- group "crew", conversation {conv_id} ' in member.lines[-1]
            assert await member.quit() == (0, "")
        assert await creator.quit() == (0, "")
    created = [line for line in creator.lines if 'created "crew"' in line]
    assert len(created) == 1, creator.lines
    assert created[0].endswith('* 21 created "crew" with 21, 22, 23')
    assert not any("read up to" in line for line in creator.lines)
    receipts = [line for line in creator.lines if line.startswith("(read by")]
    assert receipts == ['(read by 22: "hi crew")', '(read by 23: "hi crew")'], receipts


async def test_a_window_on_websocket_chats_with_one_on_tcp(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway(ws_listen="127.0.0.1:0")
    on_ws = await Chat.start(f"ws://127.0.0.1:{gw.ws_port}/ws", "--uid", "41", "--peer", "42")
    on_tcp = await Chat.start(gw.port, "--uid", "42", "--peer", "41")
    try:
        for chat in (on_ws, on_tcp):
            await chat.until("/quit to exit")
        await on_ws.type("hello from a websocket")
        await on_tcp.until("41: hello from a websocket")
        await on_tcp.type("and back over tcp")
        await on_ws.until("42: and back over tcp")
        await on_ws.until('(read by 42: "hello from a websocket")')
        for chat in (on_ws, on_tcp):
            assert await chat.quit() == (0, "")
    finally:
        for chat in (on_ws, on_tcp):
            await chat.kill()


async def test_cannot_connect_asks_whether_a_gateway_runs(gw: Server) -> None:
    port = gw.port
    await gw.shutdown()
    chat = await Chat.start(port, "--uid", "31", "--peer", "32")
    try:
        _, err = await asyncio.wait_for(chat.proc.communicate(), WAIT_S)
    finally:
        await chat.kill()
    assert chat.proc.returncode == 1
    assert err.decode().strip().endswith("; is `imgw serve` running there? (--addr says where)"), (
        err
    )


async def test_a_lost_connection_is_shown_and_so_is_its_return(gw: Server) -> None:
    proxy = TcpProxy("127.0.0.1", gw.port)  # cut: as a gateway killed with -9 looks
    await proxy.start()
    chat = await Chat.start(proxy.port, "--uid", "51", "--peer", "52")
    try:
        async with client(gw, 52) as peer:
            conv_id = await peer.open_p2p(51)
            await chat.until("/quit to exit")
            proxy.cut()
            await chat.until("* connection to the gateway lost; reconnecting")
            await chat.type("typed while down")
            await chat.until('(pending) "typed while down": sent once the gateway acks it')
            for text in (b"missed one", b"missed two"):
                await peer.send(conv_id, text)
            proxy.restore()
            await chat.until("* reconnected to test-node; catching up")
            await chat.until("* back: 2 missed messages caught up")
            await chat.until('(sent) "typed while down"')
            history = await peer.history(conv_id)
            assert history.msgs[-1].content == b"typed while down"
        assert await chat.quit() == (0, "")
    finally:
        await chat.kill()
        await proxy.close()
    back = chat.lines.index("* reconnected to test-node; catching up")
    assert chat.lines.index('(sent) "typed while down"') > back, chat.lines
    assert chat.lines.index("* connection to the gateway lost; reconnecting") < chat.lines.index(
        '(pending) "typed while down": sent once the gateway acks it'
    )
    after = chat.lines[back:]
    missed = [line.split("] ", 1)[1] for line in after if line.startswith("[")]
    assert missed == ["52: missed one", "52: missed two"]
    assert after.index("* back: 2 missed messages caught up") > max(
        i for i, line in enumerate(after) if "52: missed two" in line
    )


async def test_send_a_file_and_get_its_download_url(
    start_gateway: StartGateway, tmp_path: Path
) -> None:
    """`/send PATH` uploads the file (MEDIA_UPLOAD, then PUT) and sends its key; the other
    window shows the file and the download URL it asked for (MEDIA_GET), which serves the
    file."""
    import httpx

    gw = await start_gateway(media=(tmp_path / "media").as_uri(), media_listen="127.0.0.1:0")
    photo = tmp_path / "cat.png"
    photo.write_bytes(os.urandom(2000))
    async with chats(gw, ["--uid", "61", "--peer", "62"], ["--uid", "62", "--peer", "61"]) as (
        sender,
        receiver,
    ):
        await sender.type(f"/send {photo}")
        sent = await sender.until("(sent cat.png as media/61/")
        key = sent.split(" as ", 1)[1].rstrip(")")
        await receiver.until(f"61: [image] cat.png ({key})")
        line = await receiver.until(": download http://127.0.0.1:")
        url = line.split(": download ", 1)[1].rstrip(")")
        async with httpx.AsyncClient() as http:
            got = await http.get(url)
        assert (got.status_code, got.content) == (200, photo.read_bytes())
        await sender.type(f"/send {tmp_path / 'missing.png'}")
        await sender.until("! not sent: ")
        assert await sender.quit() == (0, "")


async def test_removed_from_a_group_it_says_so_and_leaves(start_gateway: StartGateway) -> None:
    port = free_port()
    gw = await start_gateway(admin_port=port, admin_token=API_TOKEN)
    api = Api(port)
    group = {"owner_uid": 71, "title": "crew", "uids": [72]}
    conv_id = (await api.ok("POST", "groups", group))["conv_id"]
    async with chats(gw, ["--uid", "72", "--group", str(conv_id)]) as (member,):
        await api.ok("POST", f"conversations/{conv_id}/members", {"remove": [72]})
        await member.until('* you were removed from group "crew" by 71')
        out, err = await asyncio.wait_for(member.proc.communicate(), WAIT_S)  # leaves itself
        member.lines += out.decode().splitlines()
    assert (member.proc.returncode, err.decode()) == (0, "")
    assert not any("server error" in line for line in member.lines), member.lines
