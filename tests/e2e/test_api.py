"""The server API (/api/v1/ on the admin port, docs/api.md), on every backend: each call,
its errors (the protocol's error names, as JSON), and that it runs the TCP path's rules:
a send is acked after the commit, pushed like a SEND, idempotent by its key, refused
for non-members, rate limited per uid; group changes follow the owner rule."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import msgpack
import pytest

from gateway.client import Client
from gateway.server import Server
from protocol.frames import Kick, Notice, Ping, Pong, Push, Send, SendAck
from protocol.ops import KickReason, MsgType
from tests.conftest import StartGateway
from tests.support.api import TOKEN, Api
from tests.support.proc import free_port
from tests.support.wire import Wire, token


async def started(start_gateway: StartGateway, **overrides: Any) -> tuple[Server, Api]:
    port = free_port()
    gw = await start_gateway(admin_port=port, admin_token=TOKEN, **overrides)
    return gw, Api(port)


async def test_send_is_acked_after_the_commit_pushed_and_idempotent(
    start_gateway: StartGateway,
) -> None:
    gw, api = await started(start_gateway)
    sender_phone = await Wire.login(gw.port, 1, "phone")  # the sender's own device
    peer = await Wire.login(gw.port, 2, "d")
    conv = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    assert (await api.ok("POST", "p2p", {"uid": 2, "peer_uid": 1}))["conv_id"] == conv

    body = {"sender_uid": 1, "client_msg_id": "order-1", "text": "hello from the backend"}
    ack = await api.ok("POST", f"conversations/{conv}/messages", body)
    assert ack["conv_id"] == conv and ack["seq"] == 1
    assert isinstance(ack["msg_id"], str) and int(ack["msg_id"]) > 0
    for w in (peer, sender_phone):  # every device of every member: the API is no device
        push = await w.wait_for(Push)
        assert (push.conv_id, push.seq, push.sender_uid) == (conv, 1, 1)
        assert (push.content, push.client_msg_id) == (b"hello from the backend", "order-1")
    # stored when acked: the history has it
    page = await api.ok("GET", f"conversations/{conv}/messages")
    assert [m["text"] for m in page["messages"]] == ["hello from the backend"]

    # the same key again: the original ack, nothing new stored or pushed
    assert await api.ok("POST", f"conversations/{conv}/messages", body) == ack
    assert not [f for f in await peer.quiet(0.2) if isinstance(f, Push)]
    changed = {**body, "text": "another"}
    assert await api.error("POST", f"conversations/{conv}/messages", changed) == (
        409,
        "idempotency_conflict",
    )
    # binary content, an app msg_type
    raw = {"sender_uid": 2, "client_msg_id": "b-1", "msg_type": 100, "content_b64": "AAEC"}
    assert (await api.ok("POST", f"conversations/{conv}/messages", raw))["seq"] == 2
    push = await sender_phone.wait_for(Push)
    assert (push.msg_type, push.content) == (100, b"\x00\x01\x02")


async def test_send_runs_the_send_rules(start_gateway: StartGateway) -> None:
    gw, api = await started(start_gateway, rate_burst=3, rate_per_s=0.01)
    conv = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    path = f"conversations/{conv}/messages"

    def send(uid: int, key: str, **kw: Any) -> dict[str, Any]:
        return {"sender_uid": uid, "client_msg_id": key, "text": "x", **kw}

    assert await api.error("POST", path, send(3, "a")) == (403, "not_member")
    assert await api.error("POST", "conversations/999999/messages", send(1, "a")) == (
        404,
        "no_such_conversation",
    )
    assert await api.error("POST", path, send(1, "a", msg_type=6)) == (400, "bad_msg_type")
    big = send(1, "a", text="x" * 2049)
    assert await api.error("POST", path, big) == (413, "content_too_large")
    both = send(1, "a", content_b64="AA==")
    assert await api.error("POST", path, both) == (400, "bad_request")
    assert await api.error("POST", path, send(1, "")) == (400, "bad_request")
    assert await api.error("POST", path, {"client_msg_id": "a", "text": "x"}) == (
        400,
        "bad_request",
    )
    # the uid's send budget (3 here): the API spends the same tokens as its devices
    for key in ("r1", "r2"):
        await api.ok("POST", path, send(1, key))
    w = await Wire.login(gw.port, 1, "d")
    assert isinstance(await w.request(Send(0, conv, "r3", 1, b"x")), SendAck)
    assert await api.error("POST", path, send(1, "r4")) == (429, "rate_limited")
    # a retry of an acked send is acked again while rate limited (as over TCP)
    assert (await api.ok("POST", path, send(1, "r1")))["seq"] == 1


async def test_a_system_message_comes_from_the_server(start_gateway: StartGateway) -> None:
    gw, api = await started(start_gateway)
    conv = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    peer = await Wire.login(gw.port, 2, "d")
    body = {"sender_uid": 0, "client_msg_id": "notice-1", "text": "maintenance at 02:00"}
    body["data"] = {"link": "https://status.example", "level": 2}
    ack = await api.ok("POST", f"conversations/{conv}/messages", body)
    push = await peer.wait_for(Push)
    assert (push.seq, push.sender_uid, push.msg_type) == (ack["seq"], 0, MsgType.SYSTEM)
    event = msgpack.unpackb(push.content)
    assert event == {
        "event": "notice",
        "by": 0,
        "uids": [],
        "text": "maintenance at 02:00",
        "data": {"link": "https://status.example", "level": 2},
    }
    assert await api.ok("POST", f"conversations/{conv}/messages", body) == ack  # idempotent
    page = await api.ok("GET", f"conversations/{conv}/messages")
    assert page["messages"][-1]["event"]["text"] == "maintenance at 02:00"
    # system messages do not count as unread
    [row] = (await api.ok("GET", "users/2/conversations"))["conversations"]
    assert row["unread"] == 0 and row["max_seq"] == ack["seq"]
    missing = {**body, "client_msg_id": "n-2"}
    assert await api.error("POST", "conversations/999999/messages", missing) == (
        404,
        "no_such_conversation",
    )
    with_type = {**body, "client_msg_id": "n-3", "msg_type": 1}
    assert (await api.error("POST", f"conversations/{conv}/messages", with_type))[0] == 400


async def test_groups_members_and_title(start_gateway: StartGateway) -> None:
    gw, api = await started(start_gateway)
    member = await Wire.login(gw.port, 3, "d")
    created = await api.ok("POST", "groups", {"owner_uid": 1, "title": "team", "uids": [2, 3]})
    conv = created["conv_id"]
    push = await member.wait_for(Push)  # the "created" system message
    assert msgpack.unpackb(push.content)["event"] == "created"
    info = await api.ok("GET", f"conversations/{conv}")
    assert info == {
        "conv_id": conv,
        "kind": "group",
        "title": "team",
        "owner_uid": 1,
        "created_ms": info["created_ms"],
        "members": [1, 2, 3],
    }
    # by the owner (the default), then as a member who is not the owner
    changed = await api.ok("POST", f"conversations/{conv}/members", {"add": [4], "remove": [2]})
    assert changed["members"] == [1, 3, 4]
    events = [msgpack.unpackb((await member.wait_for(Push)).content)["event"] for _ in "ab"]
    assert events == ["added", "removed"]
    not_owner = {"by_uid": 3, "add": [5]}
    assert await api.error("POST", f"conversations/{conv}/members", not_owner) == (
        403,
        "forbidden",
    )
    left = await api.ok("POST", f"conversations/{conv}/members", {"by_uid": 4, "remove": [4]})
    assert left["members"] == [1, 3]
    assert msgpack.unpackb((await member.wait_for(Push)).content)["event"] == "left"
    # the title: the owner only, within 256 bytes, pushed as a "titled" system message
    titled = await api.ok("PUT", f"conversations/{conv}/title", {"title": "core team"})
    push = await member.wait_for(Push)
    assert push.seq == titled["seq"] and push.sender_uid == 0
    assert msgpack.unpackb(push.content) == {
        "event": "titled",
        "by": 1,
        "uids": [],
        "title": "core team",
    }
    assert (await api.ok("GET", f"conversations/{conv}"))["title"] == "core team"
    for n in range(3):  # conversations on every shard (sharded: both servers)
        other = await api.ok("POST", "groups", {"owner_uid": 5, "title": "g", "uids": [6]})
        await api.ok("PUT", f"conversations/{other['conv_id']}/title", {"title": f"g{n}"})
        assert (await api.ok("GET", f"conversations/{other['conv_id']}"))["title"] == f"g{n}"
        page = await api.ok("GET", f"conversations/{other['conv_id']}/messages")
        assert [m["event"]["event"] for m in page["messages"]] == ["created", "titled"]
    by_member = {"by_uid": 3, "title": "mine"}
    assert await api.error("PUT", f"conversations/{conv}/title", by_member) == (403, "forbidden")
    too_long = {"title": "x" * 257}
    assert await api.error("PUT", f"conversations/{conv}/title", too_long) == (400, "bad_request")
    p2p = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    assert await api.error("PUT", f"conversations/{p2p}/title", {"title": "t"}) == (
        400,
        "bad_request",
    )
    assert await api.error("GET", "conversations/999999") == (404, "no_such_conversation")
    assert await api.error("POST", "p2p", {"uid": 1, "peer_uid": 1}) == (400, "bad_request")
    big = {"owner_uid": 1, "uids": list(range(2, 1002))}
    assert await api.error("POST", "groups", big) == (400, "bad_request")


async def test_history_pages_and_conversations_with_unread(start_gateway: StartGateway) -> None:
    _, api = await started(start_gateway)
    conv = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    for i in range(5):
        body = {"sender_uid": 1, "client_msg_id": f"m{i}", "text": f"message {i}"}
        await api.ok("POST", f"conversations/{conv}/messages", body)
    page = await api.ok("GET", f"conversations/{conv}/messages?limit=2")
    assert [m["seq"] for m in page["messages"]] == [4, 5] and page["has_more"]
    older = await api.ok("GET", f"conversations/{conv}/messages?limit=2&before_seq=4")
    assert [m["text"] for m in older["messages"]] == ["message 1", "message 2"]
    after = await api.ok("GET", f"conversations/{conv}/messages?after_seq=3")
    assert [m["seq"] for m in after["messages"]] == [4, 5] and not after["has_more"]
    m = page["messages"][0]
    assert m["sender_uid"] == 1 and m["client_msg_id"] == "m3" and m["msg_type"] == 1
    assert base64.b64decode(m["content_b64"]) == b"message 3"
    # as a member reads it over TCP (HISTORY / PULL): membership applies
    as_peer = await api.ok("GET", f"conversations/{conv}/messages?as_uid=2&limit=1")
    assert [m["seq"] for m in as_peer["messages"]] == [5]
    assert await api.error("GET", f"conversations/{conv}/messages?as_uid=3") == (
        403,
        "not_member",
    )
    assert await api.error("GET", "conversations/999999/messages") == (
        404,
        "no_such_conversation",
    )
    # the peer's conversations: 5 unread; the sender's own messages are not unread
    [row] = (await api.ok("GET", "users/2/conversations"))["conversations"]
    assert (row["conv_id"], row["kind"], row["unread"], row["max_seq"]) == (conv, "p2p", 5, 5)
    assert row["is_member"] is True
    [mine] = (await api.ok("GET", "users/1/conversations"))["conversations"]
    assert mine["unread"] == 0
    # paging through many conversations
    for peer in range(3, 6):
        await api.ok("POST", "p2p", {"uid": 2, "peer_uid": peer})
        body = {"sender_uid": peer, "client_msg_id": "hi", "text": "hi"}
        await api.ok("POST", f"conversations/{conv + peer - 2}/messages", body)
    first = await api.ok("GET", "users/2/conversations?limit=3")
    assert len(first["conversations"]) == 3 and first["next_cursor"]
    rest = await api.ok("GET", f"users/2/conversations?limit=3&cursor={first['next_cursor']}")
    assert len(rest["conversations"]) == 1 and rest["next_cursor"] is None
    seen = {r["conv_id"] for r in first["conversations"] + rest["conversations"]}
    assert len(seen) == 4
    assert (await api.error("GET", "users/2/conversations?cursor=zz"))[0] == 400


async def test_presence_kick_and_revoke(start_gateway: StartGateway) -> None:
    gw, api = await started(start_gateway)
    phone = await Wire.login(gw.port, 7, "phone")
    laptop = await Wire.login(gw.port, 7, "laptop")
    answer = await api.ok("GET", "presence?uids=7,8")
    assert answer == {
        "presence": [{"uid": 7, "devices": ["laptop", "phone"]}, {"uid": 8, "devices": []}]
    }
    assert (await api.error("GET", "presence"))[0] == 400
    many = ",".join(str(u) for u in range(1, 1002))
    assert await api.error("GET", f"presence?uids={many}") == (400, "bad_request")

    kicked = await api.ok("POST", "kick", {"uid": 7, "device": "phone", "reason": "shutdown"})
    assert kicked == {"kicked": 1}
    assert await phone.closed() == [Kick(KickReason.SHUTDOWN, "kicked by the server", "")]
    await laptop.send(Ping())
    assert isinstance(await laptop.wait_for(Pong), Pong)  # the other device stays
    assert await api.ok("POST", "kick", {"uid": 7, "text": "bye"}) == {"kicked": 1}
    assert await laptop.closed() == [Kick(KickReason.AUTH_REVOKED, "bye", "")]
    assert await api.ok("POST", "kick", {"uid": 7}) == {"kicked": 0}
    assert (await api.error("POST", "kick", {"uid": 7, "reason": "nope"}))[0] == 400
    assert (await api.error("POST", "kick", {"uid": 7, "device": "a b"}))[0] == 400

    again = await Wire.login(gw.port, 7, "phone")
    assert await api.ok("POST", "revoke", {"uid": 7}) == {"kicked": 1}
    [kick] = await again.closed()
    assert isinstance(kick, Kick) and kick.reason == KickReason.AUTH_REVOKED


async def test_broadcast_is_bounded(start_gateway: StartGateway) -> None:
    gw, api = await started(start_gateway, api_broadcast_burst=6, api_broadcast_per_s=0.01)
    a = await Wire.login(gw.port, 1, "d")
    b = await Wire.login(gw.port, 2, "d")
    body = {"uids": [1, 2, 3], "text": "the service restarts in 5 minutes"}
    assert await api.ok("POST", "broadcast", body) == {"uids": 3}
    for w in (a, b):
        notice = await w.wait_for(Notice)
        assert notice.content == b"the service restarts in 5 minutes" and notice.msg_type == 1
    # the client library hands it to the app with the pushes
    c = Client(f"127.0.0.1:{gw.port}", 4, "lib", token(4, "lib"), request_timeout=5)
    try:
        await c.connect()
        await api.ok("POST", "broadcast", {"uids": [4], "text": "for the app", "msg_type": 101})
        event = await c.next_event(5)
        assert isinstance(event, Notice) and (event.msg_type, event.content) == (
            101,
            b"for the app",
        )
    finally:
        await c.close()
    # not stored: nobody has a conversation
    assert (await api.ok("GET", "users/1/conversations"))["conversations"] == []
    # the budget: 6 recipients, 4 spent; a call that does not fit takes nothing
    assert await api.error("POST", "broadcast", body) == (429, "rate_limited")
    assert await api.ok("POST", "broadcast", {"uids": [1, 2], "content_b64": "AA=="}) == {"uids": 2}
    assert await api.error("POST", "broadcast", {"uids": list(range(1, 1002)), "text": "x"}) == (
        400,
        "bad_request",
    )
    assert await api.error("POST", "broadcast", {"uids": [1], "text": "x" * 2049}) == (
        413,
        "content_too_large",
    )
    assert await api.error("POST", "broadcast", {"uids": [1], "text": "x", "msg_type": 6}) == (
        400,
        "bad_msg_type",
    )


@pytest.mark.backends("embedded")
async def test_every_call_needs_the_token_and_json(start_gateway: StartGateway) -> None:
    _, api = await started(start_gateway)
    for method, path in (
        ("GET", "presence?uids=1"),
        ("POST", "p2p"),
        ("GET", "users/1/conversations"),
    ):
        for bad in ("", "wrong"):
            status, answer = await api.call(method, path, {}, token=bad)
            assert (status, answer["error"]["code"]) == (401, "auth_failed")
    assert await api.error("GET", "nothing/here") == (404, "unknown_op")
    metrics = await api.metrics()
    assert 'imgw_api_calls_total{call="presence",code="auth_failed"}' not in metrics  # 401s
    assert 'imgw_api_calls_total{call="unknown",code="unknown_op",key="admin"} 1.0' in metrics
    assert await api.error("DELETE", "p2p") == (405, "bad_request")
    async with httpx.AsyncClient() as client:
        r = await client.post(
            api.base + "p2p", content=b"{not json", headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    # ids above 2^53 travel as decimal strings, both ways
    big = 2**60 + 1
    answer = await api.ok("GET", f"presence?uids={big}")
    assert answer == {"presence": [{"uid": str(big), "devices": []}]}
    opened = await api.ok("POST", "p2p", {"uid": str(big), "peer_uid": "2"})
    info = await api.ok("GET", f"conversations/{opened['conv_id']}")
    assert set(info["members"]) == {str(big), 2}


@pytest.mark.backends("embedded")
async def test_a_draining_node_refuses_changes_and_still_reads(
    start_gateway: StartGateway,
) -> None:
    gw, api = await started(start_gateway)
    conv = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    assert gw.node is not None
    gw.node.accepting = False  # what a drain sets first, before the batcher drains
    body = {"sender_uid": 1, "client_msg_id": "late", "text": "x"}
    assert await api.error("POST", f"conversations/{conv}/messages", body) == (
        503,
        "unavailable",
    )
    assert (await api.ok("GET", f"conversations/{conv}"))["members"] == [1, 2]
    gw.node.accepting = True


@pytest.mark.backends("embedded")
async def test_input_the_encoders_would_choke_on_is_refused_and_history_stays_strict(
    start_gateway: StartGateway,
) -> None:
    """Each was a 500 (or, NaN, stored and given back as a literal NaN): now a 400, and
    what is stored reads back as strict JSON."""
    _, api = await started(start_gateway)
    conv = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    notice = '{"sender_uid": 0, "client_msg_id": "n1", "text": "t", "data": %s}'
    bad = [
        (f"conversations/{conv}/messages", '{"sender_uid": 1, "client_msg_id": "m", '
         '"content_b64": "aGk\u00e9"}'),
        ("broadcast", '{"uids": [1], "content_b64": "\u00b2"}'),
        ("groups", '{"owner_uid": 1, "uids": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        (f"conversations/{conv}/messages", notice % ("[" * 990 + "]" * 990)),
        (f"conversations/{conv}/messages", notice % '{"x": NaN}'),
        (f"conversations/{conv}/messages", notice % "[Infinity, -Infinity]"),
    ]  # fmt: skip
    async with httpx.AsyncClient(timeout=10) as client:
        for path, raw in bad:
            r = await client.post(
                api.base + path, content=raw.encode(), headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert r.status_code == 400, (raw[:60], r.status_code, r.text[:200])
            assert r.json()["error"]["code"] == "bad_request"
    deep = json.loads("[" * 31 + "]" * 31)  # in its map, at the limit (32): stored
    body = {"sender_uid": 0, "client_msg_id": "n2", "text": "t", "data": {"x": 1.5, "d": deep}}
    await api.ok("POST", f"conversations/{conv}/messages", body)
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(
            api.base + f"conversations/{conv}/messages",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )

    def strict(name: str) -> None:
        raise AssertionError(f"history carries {name}")

    page = json.loads(r.text, parse_constant=strict)
    assert [m["event"]["data"]["x"] for m in page["messages"]] == [1.5]
