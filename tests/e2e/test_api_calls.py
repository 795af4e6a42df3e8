"""The server API calls a backend acts with as a user: recall, read and delivered (the
TCP ops' own handlers and rules), client tokens a device logs in with, cursor paging of
members, conversations and history, media messages with their key decoded, and push
registrations (listed, forgotten when their service calls them invalid) and mutes."""

from __future__ import annotations

import base64
import time
from typing import Any

import msgpack
import pytest

from gateway.ratelimit import Bucket
from gateway.server import Server
from protocol.frames import (
    Login,
    LoginOk,
    Push,
    PushRegister,
    PushRegisterOk,
    ReadNotify,
    Sync,
    SyncResult,
)
from protocol.mediakeys import media_content
from protocol.ops import MsgType
from tests.conftest import StartGateway
from tests.support.api import TOKEN, Api
from tests.support.proc import free_port
from tests.support.stores import muted_uids
from tests.support.wire import Wire

pytestmark = pytest.mark.backends("embedded", "production")


async def started(start_gateway: StartGateway, **overrides: Any) -> tuple[Server, Api]:
    port = free_port()
    gw = await start_gateway(admin_port=port, admin_token=TOKEN, **overrides)
    return gw, Api(port)


async def send(api: Api, conv: int, uid: int, key: str, **body: Any) -> dict[str, Any]:
    body = {"sender_uid": uid, "client_msg_id": key, **body}
    answer: dict[str, Any] = await api.ok("POST", f"conversations/{conv}/messages", body)
    return answer


async def test_recall_read_and_delivered_as_a_user(start_gateway: StartGateway) -> None:
    gw, api = await started(start_gateway)
    conv = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    peer = await Wire.login(gw.port, 2, "d")
    for i in range(3):
        await send(api, conv, 1, f"m{i}", text=f"hello {i}")
    # READ as 2: its position moves, the sender is told (READ_NOTIFY)
    sender = await Wire.login(gw.port, 1, "phone")
    assert (await api.ok("POST", f"conversations/{conv}/read", {"uid": 2, "seq": 2}))["seq"] == 2
    notify = await sender.wait_for(ReadNotify)
    assert (notify.conv_id, notify.reader_uid, notify.seq) == (conv, 2, 2)
    # DELIVERED as 2 on device d: that device's position, as SYNC shows it
    body = {"uid": 2, "device": "d", "seq": 3}
    assert (await api.ok("POST", f"conversations/{conv}/delivered", body))["seq"] == 3
    page = await peer.request(Sync(0, 0, 0, 0))
    assert isinstance(page, SyncResult)
    (row,) = page.convs
    assert (row.read_seq, row.delivered_seq, row.unread) == (2, 3, 1)
    # RECALL as the sender: a recall event is stored and pushed; as the peer: refused
    assert await api.error("POST", f"conversations/{conv}/recall", {"uid": 2, "seq": 1}) == (
        403,
        "recall_denied",
    )
    done = await api.ok("POST", f"conversations/{conv}/recall", {"uid": 1, "seq": 1})
    assert (done["seq"], done["recall_seq"]) == (1, 4)
    await peer.wait_for(Push, seq=4)
    # a non-member is refused as over TCP
    assert await api.error("POST", f"conversations/{conv}/read", {"uid": 9, "seq": 1}) == (
        403,
        "not_member",
    )
    assert await api.error("POST", f"conversations/{conv}/delivered", {"uid": 2, "seq": 1}) == (
        400,
        "bad_request",  # device is required: positions are per device
    )


async def test_a_minted_token_logs_in_and_minting_is_rate_limited(
    start_gateway: StartGateway,
) -> None:
    gw, api = await started(start_gateway)
    minted = await api.ok("POST", "tokens", {"uid": 77, "device": "tablet", "ttl_s": 600})
    assert (minted["uid"], minted["device"]) == (77, "tablet")
    w = await Wire.login(gw.port, 77, "tablet", tok=minted["token"])
    assert w is not None
    # for another device it is no token
    wrong = await Wire.open(gw.port)
    answer = await wrong.request(Login(0, 1, 77, "phone", minted["token"]))
    assert not isinstance(answer, LoginOk)
    assert await api.error("POST", "tokens", {"uid": 77, "device": "x", "ttl_s": 10}) == (
        400,
        "bad_request",
    )
    assert gw._admin is not None
    gw._admin.api.token_budget = Bucket(1, 0.001, gw.node.loop.time)  # type: ignore[union-attr]
    assert (await api.ok("POST", "tokens", {"uid": 1, "device": "d"}))["token"]
    assert await api.error("POST", "tokens", {"uid": 1, "device": "d"}) == (429, "rate_limited")


async def test_cursor_paging(start_gateway: StartGateway) -> None:
    _, api = await started(start_gateway)
    group = {"owner_uid": 1, "title": "g", "uids": list(range(2, 13))}
    conv = (await api.ok("POST", "groups", group))["conv_id"]
    members: list[int] = []
    cursor = None
    while True:
        q = f"conversations/{conv}/members?limit=5" + (f"&cursor={cursor}" if cursor else "")
        page = await api.ok("GET", q)
        members += page["members"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert members == list(range(1, 13))
    for i in range(7):
        await send(api, conv, 1, f"h{i}", text=str(i))
    seen: list[int] = []
    q = f"conversations/{conv}/messages?limit=3"
    while True:
        page = await api.ok("GET", q)
        seen = [m["seq"] for m in page["messages"]] + seen
        if page["next_cursor"] is None:
            assert not page["has_more"]
            break
        q = f"conversations/{conv}/messages?limit=3&cursor={page['next_cursor']}"
    assert seen == list(range(1, 9))  # the title event (seq 1) and the seven messages
    forward: list[int] = []
    q = f"conversations/{conv}/messages?limit=3&after_seq=0&as_uid=2"
    while True:
        page = await api.ok("GET", q)
        forward += [m["seq"] for m in page["messages"]]
        if page["next_cursor"] is None:
            break
        q = f"conversations/{conv}/messages?limit=3&cursor={page['next_cursor']}&as_uid=2"
    assert forward == seen
    for uid in (2, 3):
        await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 100 + uid})
    convs: list[int] = []
    q = "users/1/conversations?limit=1"
    while True:
        page = await api.ok("GET", q)
        convs += [c["conv_id"] for c in page["conversations"]]
        if page["next_cursor"] is None:
            break
        q = f"users/1/conversations?limit=1&cursor={page['next_cursor']}"
    assert len(convs) == len(set(convs)) == 3
    assert await api.error("GET", f"conversations/{conv}/messages?cursor=zz") == (
        400,
        "bad_request",
    )


async def test_media_messages_come_back_with_their_key_decoded(
    start_gateway: StartGateway,
) -> None:
    _, api = await started(start_gateway)
    conv = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    key = "media/1/" + "ab" * 32
    content = media_content(key, size=1234, type="image/png", name="cat.png")
    body = {"msg_type": int(MsgType.IMAGE), "content_b64": base64.b64encode(content).decode()}
    await send(api, conv, 1, "img", **body)
    (msg,) = (await api.ok("GET", f"conversations/{conv}/messages"))["messages"]
    assert msg["media"] == {"key": key, "size": 1234, "content_type": "image/png"}
    assert msgpack.unpackb(base64.b64decode(msg["content_b64"]))["name"] == "cat.png"
    assert "text" not in msg


async def test_push_devices_invalid_tokens_and_mutes(start_gateway: StartGateway) -> None:
    gw, api = await started(start_gateway)
    phone = await Wire.login(gw.port, 5, "phone")
    tablet = await Wire.login(gw.port, 5, "tablet")
    assert isinstance(
        await phone.request(PushRegister(0, "apns", "tok-phone", True, "de")), PushRegisterOk
    )
    assert isinstance(await tablet.request(PushRegister(0, "fcm", "tok-tablet")), PushRegisterOk)
    listed = (await api.ok("GET", "users/5/push-devices"))["devices"]
    assert [
        (d["device"], d["provider"], d["token"], d["preview"], d["locale"]) for d in listed
    ] == [
        ("tablet", "fcm", "tok-tablet", False, ""),
        ("phone", "apns", "tok-phone", True, "de"),
    ]
    # the push service says the tablet's token is invalid: that registration goes
    body = {"provider": "fcm", "token": "tok-tablet"}
    assert (await api.ok("POST", "push-tokens/invalid", body))["deleted"] is True
    assert (await api.ok("POST", "push-tokens/invalid", body))["deleted"] is False
    listed = (await api.ok("GET", "users/5/push-devices"))["devices"]
    assert [d["device"] for d in listed] == ["phone"]
    # MUTE as a member, until a time; a non-member is refused
    conv = (await api.ok("POST", "p2p", {"uid": 5, "peer_uid": 6}))["conv_id"]
    until = int(time.time() * 1000) + 60_000
    muted = await api.ok("POST", f"conversations/{conv}/mute", {"uid": 5, "until_ms": until})
    assert muted["until_ms"] == until
    assert gw.node is not None
    now = int(time.time() * 1000)
    assert await muted_uids(gw.node.store, conv, [5, 6], now) == {5}
    await api.ok("POST", f"conversations/{conv}/mute", {"uid": 5, "until_ms": 0})
    assert await muted_uids(gw.node.store, conv, [5, 6], now) == set()
    assert await api.error("POST", f"conversations/{conv}/mute", {"uid": 7, "until_ms": 0}) == (
        403,
        "not_member",
    )


async def test_history_takes_one_position(start_gateway: StartGateway) -> None:
    _, api = await started(start_gateway)
    conv = (await api.ok("POST", "p2p", {"uid": 1, "peer_uid": 2}))["conv_id"]
    for query in (
        "before_seq=false&after_seq=3",
        "before_seq=1&after_seq=3",
        "cursor=b5&after_seq=1",
    ):
        status, answer = await api.call("GET", f"conversations/{conv}/messages?{query}")
        assert (status, answer["error"]["code"]) == (400, "bad_request"), query
        assert "give one of" in answer["error"]["message"]
