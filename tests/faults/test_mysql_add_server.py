"""`imgw db add-server` with a gateway running and clients sending: a single-server
store grows to two servers (shards 2-3 move to the second MariaDB). Every acked message
is still there afterwards, once, with seqs that never skipped or repeated; sends to the
moving shards are answered `unavailable` meanwhile and succeed when retried with the
same id."""

from __future__ import annotations

import asyncio
import contextlib
import io
from pathlib import Path

from gateway.cli import main
from gateway.server import Server
from protocol.frames import ConvOk, Error, OpenP2P, Pull, PullResult, Send, SendAck
from protocol.ops import ErrorCode
from storage.mysql import MySQLSettings
from tests.conftest import make_config as config_for
from tests.support.services import MYSQL2_PORT, MYSQL_PORT, drop_mysql, fresh_mysql, second_mysql
from tests.support.wire import Wire

from .test_mysql_shards import rows, tables


async def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(argv))

    rc = await asyncio.to_thread(run)
    return rc, out.getvalue(), err.getvalue()


async def test_add_server_under_traffic_loses_nothing(tmp_path: Path) -> None:
    second_mysql()
    url = await fresh_mysql(4)
    name = MySQLSettings.from_url(url).database
    target = f"mysql://root@127.0.0.1:{MYSQL2_PORT}/{name}"
    server = Server(config_for(tmp_path, store=url, cache="memory://", rate_per_s=1000.0,
                                rate_burst=1000))  # fmt: skip
    await server.start()
    acked: dict[tuple[int, str], int] = {}
    refused = [0]
    stop = asyncio.Event()

    async def sender(uid: int) -> None:
        w = await Wire.login(server.port, uid, "d")
        convs = []
        for peer in range(100 * uid + 1, 100 * uid + 5):  # 4 p2p conversations each
            ok = await w.request(OpenP2P(0, peer))
            assert isinstance(ok, ConvOk)
            convs.append(ok.conv_id)
        i = 0
        while not stop.is_set():
            conv, cmid = convs[i % len(convs)], f"{uid}-{i}"
            while True:  # the same id until acked, as a client does
                reply = await w.request(Send(0, conv, cmid, 1, cmid.encode()), timeout=15)
                if isinstance(reply, SendAck):
                    assert (conv, cmid) not in acked
                    acked[(conv, cmid)] = reply.seq
                    break
                assert isinstance(reply, Error) and reply.code == ErrorCode.UNAVAILABLE, reply
                refused[0] += 1
                await asyncio.sleep(0.05)
            i += 1
        await w.close()

    tasks = [asyncio.create_task(sender(uid)) for uid in (1, 2, 3)]
    try:
        await asyncio.sleep(1.5)
        before = len(acked)
        rc, out, err = await cli("db", "add-server", "--store", url, target, "--grace", "2.5")
        assert rc == 0, err + out
        assert "shard map switched" in out
        moved_at = len(acked)
        await asyncio.sleep(1.5)  # traffic on the new map
        stop.set()
        await asyncio.gather(*tasks)
        assert before > 20 and len(acked) > moved_at + 20  # sends went on before and after
        # ... to the moving shards too: acked on the old server, then on the new one
        order = list(acked)
        assert any(c % 4 >= 2 for c, _ in order[:before])
        assert any(c % 4 >= 2 for c, _ in order[moved_at:])

        # Every acked message once, at its acked seq; every conversation's seqs 1..n.
        reader = await Wire.login(server.port, 1, "reader")
        convs = {c for c, _ in acked}
        for conv in sorted(convs):
            peers = {c: cmid for (c, cmid) in acked if c == conv}
            assert peers
            owner = int(next(iter(peers.values())).split("-")[0])
            w = reader if owner == 1 else await Wire.login(server.port, owner, "reader")
            got: dict[int, str] = {}
            after = 0
            while True:
                page = await w.request(Pull(0, conv, after, 200), timeout=10)
                assert isinstance(page, PullResult), page
                for m in page.msgs:
                    assert m.seq not in got
                    got[m.seq] = m.client_msg_id
                    after = m.seq
                if not page.has_more:
                    break
            assert sorted(got) == list(range(1, len(got) + 1)), conv
            mine = {cmid: seq for (c, cmid), seq in acked.items() if c == conv}
            assert {got[seq]: seq for seq in got} == mine
            if w is not reader:
                await w.close()

        # Shards 2-3 are on the second server now, and only there.
        first, second = await tables(MYSQL_PORT, name), await tables(MYSQL2_PORT, name)
        assert not {t for t in first if t.startswith(("im_message_0002", "im_message_0003"))}
        assert {"im_message_0002", "im_message_0003"} <= second
        moved = {c for c in convs if c % 4 >= 2}
        assert moved
        for conv in moved:
            n = await rows(MYSQL2_PORT, name, f"SELECT COUNT(*) FROM im_message_{conv % 4:04d} "
                           f"WHERE conv_id={conv}")  # fmt: skip
            assert n[0][0] == sum(1 for c, _ in acked if c == conv)
            left = await rows(
                MYSQL_PORT, name, f"SELECT COUNT(*) FROM im_conv_seq WHERE conv_id={conv}"
            )
            assert left == [(0,)]
        rc, out, _ = await cli("db", "status", "--store", url)
        assert rc == 0 and "0002-0003" in out and f":{MYSQL2_PORT}/" in out, out
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.shutdown()
        await drop_mysql(url)
