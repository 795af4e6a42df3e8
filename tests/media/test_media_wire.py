"""Media by object key over the real TCP protocol (docs/media.md): MEDIA_UPLOAD, the
upload over HTTP to the gateway's media listener, a media SEND carrying the key, and
MEDIA_GET for members only; the refusals; the orphan sweep. On the embedded store and
the MySQL ones."""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import pytest

from gateway.server import Server
from protocol.frames import ConvOk, MediaGet, MediaUpload, MediaUrl, OpenP2P, Push, Send, SendAck
from protocol.mediakeys import media_content, media_key
from protocol.ops import ErrorCode, MsgType
from tests.conftest import StartGateway
from tests.media.common import (
    HOUR_MS,
    a_file,
    ask_upload,
    fetch,
    put,
    send_media,
    upload,
)
from tests.support.wire import Wire

pytestmark = pytest.mark.backends("embedded", "mysql", "production", "sharded")


@pytest.fixture
async def mgw(start_gateway: StartGateway, tmp_path: Path) -> Server:
    return await start_gateway(
        media=(tmp_path / "media").as_uri(),
        media_listen="127.0.0.1:0",
        media_max_size=100_000,
        media_types=("image/*", "application/pdf"),
    )


async def p2p(w: Wire, peer: int) -> int:
    reply = await w.request(OpenP2P(0, peer))
    assert isinstance(reply, ConvOk), reply
    return reply.conv_id


async def test_upload_send_and_download_by_members_only(mgw: Server, tmp_path: Path) -> None:
    a = await Wire.login(mgw.port, 1)
    b = await Wire.login(mgw.port, 2)
    stranger = await Wire.login(mgw.port, 3)
    conv = await p2p(a, 2)
    data, sha = a_file()
    signed = await ask_upload(a, data)
    assert signed.key == media_key(1, sha)
    assert signed.url.startswith(f"http://127.0.0.1:{mgw.media_http.port}/media/1/")  # type: ignore[union-attr]
    assert await put(signed.url, data) == 201
    assert (tmp_path / "media" / "media" / "1" / sha).read_bytes() == data

    ack = await send_media(a, conv, signed.key, "m1")
    push = await b.wait_for(Push, conv_id=conv, seq=ack.seq)
    assert push.msg_type == MsgType.IMAGE
    assert msgpack.unpackb(push.content)["key"] == signed.key  # the key, never a URL

    got = await b.request(MediaGet(0, signed.key))
    assert isinstance(got, MediaUrl) and got.key == signed.key
    assert await fetch(got.url) == (200, data, "image/png")
    assert await stranger.error(MediaGet(0, signed.key)) == ErrorCode.FORBIDDEN
    # a key that exists nowhere is answered the same
    assert await b.error(MediaGet(0, media_key(1, "0" * 64))) == ErrorCode.FORBIDDEN
    assert await b.error(MediaGet(0, "media/../etc/passwd")) == ErrorCode.BAD_REQUEST

    # the same file again: stored and referenced, nothing to upload; a resend is acked
    again = await ask_upload(a, data)
    assert (again.key, again.url) == (signed.key, "")
    assert (await send_media(a, conv, signed.key, "m1")).seq == ack.seq
    sample = mgw.node.metrics.registry.get_sample_value  # type: ignore[union-attr]
    assert sample("imgw_media_total", {"op": "get", "result": "forbidden"}) == 2
    assert sample("imgw_media_total", {"op": "get", "result": "ok"}) == 1
    assert sample("imgw_media_total", {"op": "send", "result": "ok"}) == 2


async def test_what_a_media_send_and_upload_refuse(mgw: Server) -> None:
    a = await Wire.login(mgw.port, 11)
    b = await Wire.login(mgw.port, 12)
    conv = await p2p(a, 12)
    data, sha = a_file()
    # limits: size, type, hash
    assert await a.error(MediaUpload(0, sha, 100_001, "image/png")) == ErrorCode.CONTENT_TOO_LARGE
    assert await a.error(MediaUpload(0, sha, 10, "text/html")) == ErrorCode.FORBIDDEN
    assert await a.error(MediaUpload(0, "XYZ", 10, "image/png")) == ErrorCode.BAD_REQUEST
    # a key never uploaded, another user's key, a key whose file was not PUT yet
    unknown = media_content(media_key(11, "1" * 64))
    assert await a.error(Send(0, conv, "u1", MsgType.IMAGE, unknown)) == ErrorCode.FORBIDDEN
    key_of_b = await upload(b, data)
    theirs = media_content(key_of_b)
    assert await a.error(Send(0, conv, "u2", MsgType.IMAGE, theirs)) == ErrorCode.FORBIDDEN
    signed = await ask_upload(a, data)
    not_put = media_content(signed.key)
    assert await a.error(Send(0, conv, "u3", MsgType.FILE, not_put)) == ErrorCode.BAD_REQUEST
    # the listener checks length, type and hash
    assert await put(signed.url, data[:-1]) == 413
    assert await put(signed.url, data, "image/gif") == 400
    assert await put(signed.url, os.urandom(len(data))) == 400
    tampered = signed.url.replace("size=", "size=1")
    assert await put(tampered, data) == 403
    # a non-member cannot attach its upload to a conversation
    c = await Wire.login(mgw.port, 13)
    key_of_c = await upload(c, data)
    assert await c.error(Send(0, conv, "u4", MsgType.IMAGE, media_content(key_of_c))) == (
        ErrorCode.NOT_MEMBER
    )
    # content of a media type that carries no key is stored as it came (v1 clients)
    ack = await a.request(Send(0, conv, "plain", MsgType.IMAGE, b"https://example.com/x.png"))
    assert isinstance(ack, SendAck)


@pytest.mark.backends("embedded", "mysql")
async def test_media_disabled_answers_forbidden_and_changes_nothing_else(gw: Server) -> None:
    a = await Wire.login(gw.port, 21)
    conv = await p2p(a, 22)
    _, sha = a_file()
    assert await a.error(MediaUpload(0, sha, 10, "image/png")) == ErrorCode.FORBIDDEN
    assert await a.error(MediaGet(0, media_key(21, sha))) == ErrorCode.FORBIDDEN
    content = media_content(media_key(21, sha))
    ack = await a.request(Send(0, conv, "m", MsgType.IMAGE, content))
    assert isinstance(ack, SendAck)  # not checked: no media here


async def test_orphans_are_swept_after_a_day_and_referenced_uploads_stay(
    mgw: Server, tmp_path: Path
) -> None:
    a = await Wire.login(mgw.port, 31)
    conv = await p2p(a, 32)
    kept_data, kept_sha = a_file()
    orphan_data, orphan_sha = a_file()
    kept = await upload(a, kept_data)
    orphan = await upload(a, orphan_data)
    await send_media(a, conv, kept, "k")
    media = mgw.node.media  # type: ignore[union-attr]
    assert media is not None
    root = tmp_path / "media" / "media" / "31"
    now = media.clock()
    assert await media.sweep(now + 23 * HOUR_MS) == 0  # not a day old yet
    assert await media.sweep(now + 25 * HOUR_MS) == 1
    assert not (root / orphan_sha).exists() and (root / kept_sha).exists()
    assert await media.index.get_upload(orphan) is None
    assert await media.sweep(now + 50 * HOUR_MS) == 0  # referenced: kept for good
    # the swept key can be uploaded and sent again
    assert (await upload(a, orphan_data)) == orphan
    await send_media(a, conv, orphan, "o")


async def test_an_embedded_store_of_schema_2_gets_the_media_tables(tmp_path: Path) -> None:
    """Upgrading in place: the store's migration adds the media tables to a database of
    schema 2 (before media) and records the current schema."""
    import sqlite3

    from storage.embedded import EmbeddedStore
    from storage.embedded.schema import SCHEMA_VERSION

    path = str(tmp_path / "old.db")
    store = EmbeddedStore(path)
    await store.start()
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        "DROP TABLE im_media_upload; DROP TABLE im_media_ref; PRAGMA user_version=2;"
    )
    conn.close()
    store = EmbeddedStore(path)
    await store.start()
    await store.close()
    conn = sqlite3.connect(path)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"im_media_upload", "im_media_ref"} <= names
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 4
    finally:
        conn.close()


async def test_a_removed_member_loses_the_download(mgw: Server) -> None:
    from protocol.frames import GroupCreate, GroupMembers, Ok

    owner = await Wire.login(mgw.port, 41)
    member = await Wire.login(mgw.port, 42)
    leaving = await Wire.login(mgw.port, 43)
    reply = await owner.request(GroupCreate(0, "g", (42, 43)))
    assert isinstance(reply, ConvOk)
    data, _ = a_file()
    key = await upload(owner, data)
    await send_media(owner, reply.conv_id, key, "g1")
    assert isinstance(await leaving.request(MediaGet(0, key)), MediaUrl)
    assert isinstance(await owner.request(GroupMembers(0, reply.conv_id, (), (43,))), Ok)
    assert await leaving.error(MediaGet(0, key)) == ErrorCode.FORBIDDEN
    assert isinstance(await member.request(MediaGet(0, key)), MediaUrl)
