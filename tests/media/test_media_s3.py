"""Media on an S3-compatible store (moto's standalone server): a presigned upload, a
media SEND, a presigned download by a member, and the orphan sweep deleting from the
bucket what no message references after a day."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest

from gateway.server import Server
from protocol.frames import ConvOk, MediaGet, MediaUrl, OpenP2P
from protocol.ops import ErrorCode
from tests.conftest import StartGateway
from tests.media.common import HOUR_MS, a_file, ask_upload, fetch, put, send_media
from tests.support.s3 import moto_s3
from tests.support.wire import Wire

pytestmark = pytest.mark.backends("embedded")


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with moto_s3(monkeypatch) as endpoint:
        yield endpoint


def bucket_keys(endpoint: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    listed = client.list_objects_v2(Bucket="imgw", Prefix="im/")
    return sorted(o["Key"] for o in listed.get("Contents", []))


async def test_presigned_upload_download_and_the_orphan_sweep(
    start_gateway: StartGateway, s3: str
) -> None:
    gw: Server = await start_gateway(media=f"s3://imgw/im?endpoint={s3}&region=us-east-1")
    assert gw.media_http is None  # S3 serves its own URLs
    a = await Wire.login(gw.port, 1)
    b = await Wire.login(gw.port, 2)
    stranger = await Wire.login(gw.port, 3)
    reply = await a.request(OpenP2P(0, 2))
    assert isinstance(reply, ConvOk)
    conv = reply.conv_id

    data, sha = a_file(5000)
    signed = await ask_upload(a, data)
    assert signed.url.startswith(f"{s3}/imgw/im/media/1/{sha}?")
    assert "Signature=" in signed.url and "Expires=" in signed.url
    assert await put(signed.url, data) == 200
    await send_media(a, conv, signed.key, "m1")

    got = await b.request(MediaGet(0, signed.key))
    assert isinstance(got, MediaUrl)
    status, body, ctype = await fetch(got.url)
    assert (status, body, ctype) == (200, data, "image/png")
    assert await stranger.error(MediaGet(0, signed.key)) == ErrorCode.FORBIDDEN

    orphan_data, orphan_sha = a_file(700)
    orphan = await ask_upload(a, orphan_data)
    assert await put(orphan.url, orphan_data) == 200
    assert bucket_keys(s3) == sorted([f"im/media/1/{sha}", f"im/media/1/{orphan_sha}"])

    media = gw.node.media  # type: ignore[union-attr]
    assert media is not None
    now = media.clock()
    assert await media.sweep(now + 23 * HOUR_MS) == 0
    assert await media.sweep(now + 25 * HOUR_MS) == 1
    assert bucket_keys(s3) == [f"im/media/1/{sha}"]
    assert await media.index.get_upload(orphan.key) is None
    # what a message references stays
    assert await media.sweep(now + 100 * HOUR_MS) == 0
    assert bucket_keys(s3) == [f"im/media/1/{sha}"]


def test_the_upload_url_signs_the_length_and_the_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 checks no size of a presigned PUT of its own: the URL signs Content-Length, so
    that S3 refuses a body of another length than MEDIA_UPLOAD allowed."""
    from urllib.parse import parse_qs, urlsplit

    from storage.media.objects import open_objects

    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(k, v)
    objects = open_objects("s3://imgw/im?endpoint=http://127.0.0.1:9&region=us-east-1", b"")
    url = objects.upload_url("media/1/" + "a" * 64, 5000, "image/png", 2_000_000_000)
    signed = parse_qs(urlsplit(url).query)["X-Amz-SignedHeaders"][0].split(";")
    assert {"content-length", "content-type", "host"} <= set(signed)


async def test_an_unreachable_store_is_unavailable_not_a_bug(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S3 down: HEAD (a media SEND, MEDIA_UPLOAD) and DELETE (the sweep) raise a
    BackendUnavailable, which a request answers `unavailable` (retry), not `internal`."""
    import socket
    import time

    from storage.errors import BackendUnavailable
    from storage.media.objects import open_objects

    for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(k, v)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    objects = open_objects(f"s3://imgw/im?endpoint=http://127.0.0.1:{port}", b"")
    started = time.monotonic()
    with pytest.raises(BackendUnavailable):
        await objects.size_of("media/1/" + "a" * 64)
    with pytest.raises(BackendUnavailable):
        await objects.delete("media/1/" + "a" * 64)
    assert time.monotonic() - started < 20
