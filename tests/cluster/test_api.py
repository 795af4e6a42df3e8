"""The server API on two gateway processes over MariaDB + Redis + RabbitMQ: a send, a
system message, a group change and a broadcast made on one node reach clients on the
other (PUSH and NOTICE cross the bus); a kick made on one node closes a session on the
other; reads on either node see what the other wrote."""

from __future__ import annotations

import asyncio

import msgpack

from protocol.frames import Kick, Notice, Ping, Pong, Push
from protocol.ops import KickReason, MsgType
from tests.cluster.conftest import Cluster
from tests.support.api import TOKEN, Api
from tests.support.proc import free_port
from tests.support.wire import Wire


async def two_with_api(cluster: Cluster) -> list[Api]:
    ports = [free_port(), free_port()]
    await asyncio.gather(
        *(cluster.start_node("--admin-port", str(p), "--admin-token", TOKEN) for p in ports)
    )
    apis = [Api(p) for p in ports]
    for api in apis:
        await api.ready()
    return apis


async def test_api_calls_cross_nodes(cluster: Cluster) -> None:
    api0, api1 = await two_with_api(cluster)
    n1 = cluster.nodes[1]
    # uid 2 and uid 3 are online on node 1 only; the API calls go to node 0
    peer = await Wire.login(n1.port, 2, "phone")
    other = await Wire.login(n1.port, 3, "tablet")

    conv = (await api0.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    body = {"sender_uid": 1, "client_msg_id": "x-1", "text": "from node 0's API"}
    ack = await api0.ok("POST", f"conversations/{conv}/messages", body)
    push = await peer.wait_for(Push, timeout=10)
    assert (push.conv_id, push.seq, push.sender_uid) == (conv, ack["seq"], 1)
    assert push.content == b"from node 0's API"
    # the same key on the other node: the original ack (one idempotency record)
    assert await api1.ok("POST", f"conversations/{conv}/messages", body) == ack

    notice = {"sender_uid": 0, "client_msg_id": "sys-1", "text": "welcome"}
    sys_ack = await api1.ok("POST", f"conversations/{conv}/messages", notice)
    push = await peer.wait_for(Push, timeout=10)
    assert (push.seq, push.sender_uid, push.msg_type) == (sys_ack["seq"], 0, MsgType.SYSTEM)
    assert msgpack.unpackb(push.content)["text"] == "welcome"

    group = await api0.ok("POST", "groups", {"owner_uid": 1, "title": "g", "uids": [2]})
    await peer.wait_for(Push, timeout=10)  # created
    added = await api0.ok("POST", f"conversations/{group['conv_id']}/members", {"add": [3]})
    assert added["members"] == [1, 2, 3]
    push = await other.wait_for(Push, timeout=10)
    assert msgpack.unpackb(push.content)["event"] == "added"
    await api0.ok("PUT", f"conversations/{group['conv_id']}/title", {"title": "renamed"})
    push = await other.wait_for(Push, timeout=10)
    assert msgpack.unpackb(push.content)["title"] == "renamed"

    # reads through node 1 see node 0's writes
    info = await api1.ok("GET", f"conversations/{group['conv_id']}")
    assert (info["title"], info["owner_uid"], info["members"]) == ("renamed", 1, [1, 2, 3])
    page = await api1.ok("GET", f"conversations/{conv}/messages")
    assert [m["seq"] for m in page["messages"]] == [ack["seq"], sys_ack["seq"]]
    rows = (await api1.ok("GET", "users/2/conversations"))["conversations"]
    assert {r["conv_id"]: r["unread"] for r in rows} == {conv: 1, group["conv_id"]: 0}
    presence = await api0.ok("GET", "presence?uids=2,3,4")
    assert presence["presence"] == [
        {"uid": 2, "devices": ["phone"]},
        {"uid": 3, "devices": ["tablet"]},
        {"uid": 4, "devices": []},
    ]

    # a broadcast from node 0 reaches node 1's sessions
    assert await api0.ok("POST", "broadcast", {"uids": [2, 3], "text": "hi all"}) == {"uids": 2}
    for w in (peer, other):
        got = await w.wait_for(Notice, timeout=10)
        assert got.content == b"hi all"

    # a kick from node 0 closes one device on node 1; the other session stays
    kicked = await api0.ok("POST", "kick", {"uid": 3, "reason": "duplicate_login", "text": "x"})
    assert kicked == {"kicked": 1}
    assert await other.closed(timeout=10) == [Kick(KickReason.DUPLICATE_LOGIN, "x", "")]
    await peer.send(Ping())
    assert isinstance(await peer.wait_for(Pong), Pong)
    assert await api0.ok("POST", "revoke", {"uid": 2, "device": "phone"}) == {"kicked": 1}
    *_, kick = await peer.closed(timeout=10)  # after the group's pushes it had not read
    assert isinstance(kick, Kick) and kick.reason == KickReason.AUTH_REVOKED
