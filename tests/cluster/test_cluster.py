"""Three gateway nodes as processes on MariaDB + Redis + RabbitMQ: pushes cross nodes, a
login on another node kicks the first, and the history invariants hold through a kill -9
of a node, a bus outage and a drain."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from gateway.client import Client
from protocol.frames import Kick, Push, ReadNotify, TypingNotify
from protocol.ops import KickReason
from tests.cluster.conftest import Cluster
from tests.support.api import TOKEN, Api
from tests.support.history import History, quiesce, read_back
from tests.support.proc import free_port
from tests.support.wire import Wire


async def next_of(client: Client, kind: type, timeout: float = 10.0) -> object:
    while True:
        event = await client.next_event(timeout)
        if isinstance(event, kind):
            return event


async def test_push_read_and_typing_cross_nodes(three: Cluster) -> None:
    users = {uid: three.client(uid, first=uid % 3) for uid in range(1, 7)}
    for c in users.values():
        await c.connect()
    assert {c.login_ok is not None for c in users.values()} == {True}
    p2p = await users[1].open_p2p(2)  # uid 1 on node 1, uid 2 on node 2
    ack = await users[1].send(p2p, b"hello across")
    push = await next_of(users[2], Push)
    assert isinstance(push, Push) and (push.seq, push.content) == (ack.seq, b"hello across")
    await users[2].read(p2p, ack.seq)
    note = await next_of(users[1], ReadNotify)
    assert isinstance(note, ReadNotify) and (note.reader_uid, note.seq) == (2, ack.seq)
    await users[2].typing(p2p)
    typing = await next_of(users[1], TypingNotify)
    assert isinstance(typing, TypingNotify) and typing.uid == 2

    group = await users[3].group_create("all", list(users))  # members on all three nodes
    ack = await users[3].send(group, b"to the group")
    for uid, c in users.items():
        if uid == 3:
            continue
        while True:
            got = await next_of(c, Push)
            assert isinstance(got, Push)
            if got.content == b"to the group":
                assert got.seq == ack.seq
                break


async def test_second_login_on_another_node_kicks_the_first(three: Cluster) -> None:
    first = await Wire.login(three.nodes[0].port, 42, "phone")
    second = await Wire.login(three.nodes[2].port, 42, "phone")
    assert await first.closed() == [Kick(KickReason.DUPLICATE_LOGIN, "logged in elsewhere", "")]
    await second.close()


@dataclass
class Run:
    history: History
    clients: dict[int, Client]
    convs: list[int]  # p2p pairs, then one group of everyone (last)
    receivers: list[asyncio.Task[None]]

    async def traffic(self, per_user: int, gap: float) -> None:
        """Each user sends `per_user` messages one after another, round its convs."""

        async def one(uid: int, c: Client) -> None:
            for k in range(per_user):
                conv = self.convs[(uid + k) % len(self.convs)]
                if uid in self.history.members[conv]:
                    await self.history.send(c, conv, f"u{uid}-m{k}".encode())
                await asyncio.sleep(gap)

        await asyncio.gather(*(one(uid, c) for uid, c in self.clients.items()))

    async def finish(self, *, catch_up: bool = True) -> dict[str, int]:
        if catch_up:
            await quiesce(list(self.clients.values()))
        stored = {}
        for conv in self.convs:
            reader = min(self.history.members[conv])
            stored.update(await read_back(self.clients[reader], [conv]))
        for t in self.receivers:
            t.cancel()
        return self.history.check(stored)


async def start_run(cluster: Cluster, uids: range, first: int | None = None) -> Run:
    history = History()
    clients = {u: cluster.client(u, first=u % 3 if first is None else first) for u in uids}
    for c in clients.values():
        await c.connect()
    receivers = [asyncio.create_task(history.receive(c)) for c in clients.values()]
    convs = []
    ordered = list(uids)
    for a, b in zip(ordered[::2], ordered[1::2], strict=False):
        conv = await clients[a].open_p2p(b)
        history.members[conv] = {a, b}
        convs.append(conv)
    group = await clients[ordered[0]].group_create("all", ordered)
    history.members[group] = set(ordered)
    convs.append(group)
    return Run(history, clients, convs, receivers)


async def test_kill_9_under_traffic_loses_nothing(three: Cluster) -> None:
    run = await start_run(three, range(1, 10))
    traffic = asyncio.create_task(run.traffic(per_user=40, gap=0.05))
    await asyncio.sleep(0.8)
    three.nodes[1].kill()  # SIGKILL, mid-traffic
    await traffic
    counts = await run.finish()
    assert counts["acked"] == counts["sends"], counts  # every send's outcome was learnt
    moved = [c for u, c in run.clients.items() if u % 3 == 1]
    assert all(c.stats.reconnects >= 1 for c in moved)


async def test_kill_9_every_acked_message_reaches_online_members_within_10s(
    three: Cluster,
) -> None:
    """Through a kill -9 of a node mid-traffic, a member that stayed connected (to another
    node) receives every message acked to the others, with no catch-up of its own: what
    the dead node committed but did not fan out is delivered from its outbox."""
    run = await start_run(three, range(1, 10))
    traffic = asyncio.create_task(run.traffic(per_user=40, gap=0.05))
    await asyncio.sleep(0.8)
    three.nodes[1].kill()  # SIGKILL, mid-traffic
    loop = asyncio.get_running_loop()
    killed = loop.time()
    await traffic
    await asyncio.sleep(max(1.0, killed + 10.0 - loop.time()))
    stayed = [u for u, c in run.clients.items() if u % 3 != 1 and c.stats.reconnects == 0]
    assert stayed
    for uid in stayed:
        want = {
            (r.conv_id, r.seq, r.content)
            for r in run.history.acked()
            if r.sender != uid and uid in run.history.members[r.conv_id]
        }
        missing = want - set(run.history.received[uid])
        assert not missing, f"uid {uid} never got {sorted(missing)[:5]} ({len(missing)})"
    counts = await run.finish()
    assert counts["acked"] == counts["sends"], counts


async def test_bus_outage_sends_acked_and_receivers_catch_up(three: Cluster) -> None:
    run = await start_run(three, range(1, 10))
    traffic = asyncio.create_task(run.traffic(per_user=40, gap=0.05))
    await asyncio.sleep(0.5)
    three.rabbit.cut()  # RabbitMQ unreachable for every node
    await asyncio.sleep(2.0)
    during = run.history.acked()
    three.rabbit.restore()
    await traffic
    assert len(during) > 20, "sends kept being acked while the bus was down"
    async with asyncio.timeout(30):  # every node tells its clients to SYNC
        while set(run.history.hints) != set(run.clients):  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.1)
    await asyncio.sleep(2.0)  # the catch-ups the hints started
    counts = await run.finish(catch_up=False)
    assert counts["acked"] == counts["sends"], counts


async def test_drain_moves_every_client_without_loss(three: Cluster) -> None:
    run = await start_run(three, range(1, 9), first=0)
    traffic = asyncio.create_task(run.traffic(per_user=30, gap=0.05))
    await asyncio.sleep(0.5)
    node = three.nodes[0].proc
    assert node is not None
    drain = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "drain", "--pid", str(node.pid)
    )
    assert await drain.wait() == 0  # it waits for the node to exit
    assert node.wait(5) == 0
    await traffic
    counts = await run.finish()
    assert counts["acked"] == counts["sends"], counts
    for c in run.clients.values():
        assert c.connected and c.stats.reconnects >= 1


async def _sender_off_the_bus(
    cluster: Cluster,
) -> tuple[Client, Client, History, int, asyncio.Task[None]]:
    """Node 0 (the sender's, with a bus link of its own) and node 1 (the receiver's); a
    p2p message delivered, then node 0 alone cut off the bus."""
    await cluster.start_node(own_link=True)
    await cluster.start_node()
    sender = cluster.client(1, first=0)
    receiver = cluster.client(2, first=1)
    await sender.connect()
    await receiver.connect()
    history = History(members={})
    listening = asyncio.create_task(history.receive(receiver))
    conv = await sender.open_p2p(2)
    history.members[conv] = {1, 2}
    await history.send(sender, conv, b"before")
    cluster.links[0].cut()  # node 0 alone is off the bus
    await asyncio.sleep(0.5)
    return sender, receiver, history, conv, listening


async def test_receivers_behind_a_publisher_cut_off_the_bus_get_sync_hint(
    cluster: Cluster,
) -> None:
    """Only the sender's node loses its bus link: the receiver's node lost nothing, so
    only the sender's node knows the PUSH never left; once it can publish again it
    sends the receiver SYNC_HINT, and the receiver's catch-up brings the message."""
    sender, _, history, conv, listening = await _sender_off_the_bus(cluster)
    lost = await history.send(sender, conv, b"while node 0 is off the bus")
    assert lost.outcome == "acked"  # durable, though its PUSH cannot leave node 0
    await asyncio.sleep(1.0)
    assert (conv, lost.seq, lost.content) not in history.received[2]
    cluster.links[0].restore()
    async with asyncio.timeout(20):  # node 0 reconnects, then hints node 1's client
        while (conv, lost.seq, lost.content) not in history.received[2]:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    assert history.hints[2] >= 1  # it came by SYNC_HINT and the catch-up it started
    listening.cancel()


async def test_fanout_owed_by_a_killed_node_is_delivered_by_a_survivor(
    cluster: Cluster,
) -> None:
    """The sender's node commits and acks, cannot publish the PUSH (its bus link is
    down), and is killed before it could tell anyone: the receiver, connected to a
    healthy node all along, must still get the message, with no reconnect and no
    catch-up of its own. The surviving node finds the dead node's outbox rows once its
    lease (5 s) lapsed and delivers them."""
    sender, receiver, history, conv, listening = await _sender_off_the_bus(cluster)
    owed = [await history.send(sender, conv, f"owed {i}".encode()) for i in range(3)]
    assert all(r.outcome == "acked" for r in owed)  # durable, though no PUSH left node 0
    cluster.nodes[0].kill()  # SIGKILL: its pending SYNC_HINTs die with it
    killed = asyncio.get_running_loop().time()
    want = {(conv, r.seq, r.content) for r in owed}
    async with asyncio.timeout(15):
        while not want <= set(history.received[2]):  # noqa: ASYNC110 - bounded
            await asyncio.sleep(0.1)
    took = asyncio.get_running_loop().time() - killed
    assert took < 10.0, f"delivered {took:.1f} s after the kill (lease 5 s + sweep)"
    assert receiver.stats.reconnects == 0 and history.hints[2] == 0  # pushed, not pulled
    listening.cancel()


async def test_no_kick_is_published_to_a_node_whose_lease_lapsed(cluster: Cluster) -> None:
    """After a kill -9 every client of the dead node logs in elsewhere, naming it: once
    its outbox lease lapsed (5 s) the survivors publish no duplicate-login kick to it (in
    a 100,000-client storm that was a publish per batch of logins, for connections that
    died with the node). Kicks to live nodes: test_second_login_on_another_node_kicks_the_first."""
    admin = free_port()
    await cluster.start_node()
    await cluster.start_node("--admin-port", str(admin), "--admin-token", TOKEN)
    api = Api(admin)
    wires = [await Wire.login(cluster.nodes[0].port, uid, "phone") for uid in (41, 42)]
    first = await Wire.login(cluster.nodes[1].port, 41, "phone")  # node 0 alive: kicked
    assert await wires[0].closed() == [Kick(KickReason.DUPLICATE_LOGIN, "logged in elsewhere", "")]
    assert "imgw_kicks_to_dead_nodes_total 0.0" in await api.metrics()
    cluster.nodes[0].kill()
    await asyncio.sleep(7.0)  # the lease (5 s) lapses; node 1 reads the leases each second
    second = await Wire.login(cluster.nodes[1].port, 42, "phone")
    metrics = await api.metrics()
    assert "imgw_kicks_to_dead_nodes_total 1.0" in metrics
    await first.close()
    await second.close()


async def test_no_kick_is_published_to_a_connection_of_a_restarted_node(
    cluster: Cluster,
) -> None:
    """A node restarted with the same node id (as a supervisor's workers and configured
    node ids are) is alive again at once, but the connections its clients name when they
    log in elsewhere belonged to the killed process: no kick is published for them."""
    admin = free_port()
    await cluster.start_node("--node-id", "same-id")
    await cluster.start_node("--admin-port", str(admin), "--admin-token", TOKEN)
    api = Api(admin)
    old = await Wire.login(cluster.nodes[0].port, 43, "phone")
    cluster.nodes[0].kill()
    await cluster.start_node("--node-id", "same-id")  # before the old lease lapsed
    await asyncio.sleep(1.5)  # node 1 reads the leases each second
    again = await Wire.login(cluster.nodes[1].port, 43, "phone")
    assert "imgw_kicks_to_dead_nodes_total 1.0" in await api.metrics()
    mine = await Wire.login(cluster.nodes[2].port, 44, "phone")  # the new process's own
    elsewhere = await Wire.login(cluster.nodes[1].port, 44, "phone")
    assert await mine.closed() == [Kick(KickReason.DUPLICATE_LOGIN, "logged in elsewhere", "")]
    for w in (old, again, elsewhere):
        await w.close()


async def test_revoke_on_one_node_kicks_sessions_on_another(cluster: Cluster) -> None:
    admin = free_port()
    await cluster.start_node("--admin-port", str(admin), "--admin-token", "t0k")
    await cluster.start_node()
    far = await Wire.login(cluster.nodes[1].port, 7, "d")
    drain = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "revoke", "--admin", f"127.0.0.1:{admin}",
        "--uid", "7", "--admin-token", "t0k", stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await drain.communicate()
    assert drain.returncode == 0 and b"1 session(s) kicked" in out, out
    [kick] = await far.closed(timeout=10)
    assert isinstance(kick, Kick) and kick.reason == KickReason.AUTH_REVOKED
