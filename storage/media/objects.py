"""The media objects and their signed URLs, by media URL (the archive's two schemes,
read by storage/objecturl.py):

- `file:///abs/path`: a directory on the gateway's machine; its URLs point at the
  gateway's media listener (gateway/http/media.py) and are signed with the media secret
  (storage/media/signing.py);
- `s3://bucket/prefix?endpoint=http://host:9000&region=us-east-1`: S3 or an
  S3-compatible store, presigned with botocore (SigV4). Credentials come from the usual
  AWS sources, never from the URL.

An object's path is `<root>/<key>`. Signing is local computation; the calls that touch
the objects (`size_of`, `delete`) run in a thread, and on S3 each has S3_CALL_TIMEOUT_S
in all (botocore's timeouts are per connect and per read: a store that answers a byte
at a time would hold a media SEND for as long as it likes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from storage.errors import ObjectsUnavailable
from storage.media.signing import Grant, signed_path
from storage.objecturl import FileUrl, parse_object_url

S3_CALL_TIMEOUT_S: Final = 10.0  # one S3 call, its attempts included
T = TypeVar("T")


class MediaUrlError(ValueError):
    """A media URL this build cannot open."""


class MediaObjects(Protocol):
    url: str

    def upload_url(self, key: str, size: int, content_type: str, exp_s: int) -> str:
        """A URL to PUT exactly `size` bytes of `content_type` to, until `exp_s`."""
        ...

    def download_url(self, key: str, content_type: str, exp_s: int) -> str:
        """A URL to GET the object from, until `exp_s` (Unix seconds)."""
        ...

    async def size_of(self, key: str) -> int | None:
        """The stored object's size; None when there is none."""
        ...

    async def delete(self, key: str) -> None:
        """Delete the object (no error if it is gone already)."""
        ...


class FileObjects:
    """A media root on local disk, served by the gateway's media listener."""

    def __init__(self, url: str, root: str, secret: bytes) -> None:
        self.url = url
        self.root = root
        self.secret = secret
        # the listener's base URL (http://host:port), known once it is bound
        self.base_url: Callable[[], str] = lambda: ""

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def upload_url(self, key: str, size: int, content_type: str, exp_s: int) -> str:
        grant = Grant("PUT", key, exp_s, size, content_type)
        return self.base_url() + signed_path(self.secret, grant)

    def download_url(self, key: str, content_type: str, exp_s: int) -> str:
        grant = Grant("GET", key, exp_s, 0, content_type)
        return self.base_url() + signed_path(self.secret, grant)

    async def size_of(self, key: str) -> int | None:
        def stat() -> int | None:
            try:
                return os.stat(self.path(key)).st_size
            except FileNotFoundError:
                return None

        return await asyncio.to_thread(stat)

    async def delete(self, key: str) -> None:
        def unlink() -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(key))

        await asyncio.to_thread(unlink)


class S3Objects:
    """A bucket (and prefix) of S3 or an S3-compatible store, through boto3."""

    def __init__(self, url: str, bucket: str, prefix: str, endpoint: str, region: str) -> None:
        import boto3
        from botocore.config import Config as BotoConfig

        self.url = url
        self.bucket = bucket
        self.prefix = prefix
        style = "path" if endpoint else "auto"  # S3-compatible stores: path-style
        self._s3: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint or None,
            region_name=region or None,
            config=BotoConfig(
                signature_version="s3v4",
                s3={"addressing_style": style},
                # a media SEND waits for a HEAD: an unreachable store must not hold it
                # for botocore's default 60 s connect timeout times 5 attempts
                connect_timeout=5,
                read_timeout=20,
                retries={"mode": "standard", "max_attempts": 3},
            ),
        )

    def object_key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _expires_in(self, exp_s: int) -> int:
        import time

        return max(1, exp_s - int(time.time()))

    def upload_url(self, key: str, size: int, content_type: str, exp_s: int) -> str:
        # Content-Length signed too: S3 then refuses a body of another length (it checks
        # no size of its own on a presigned PUT, which takes up to 5 GiB)
        params = {
            "Bucket": self.bucket,
            "Key": self.object_key(key),
            "ContentType": content_type,
            "ContentLength": size,
        }
        url: str = self._s3.generate_presigned_url(
            "put_object", Params=params, ExpiresIn=self._expires_in(exp_s), HttpMethod="PUT"
        )
        return url

    def download_url(self, key: str, content_type: str, exp_s: int) -> str:
        params = {
            "Bucket": self.bucket,
            "Key": self.object_key(key),
            "ResponseContentType": content_type,
        }
        url: str = self._s3.generate_presigned_url(
            "get_object", Params=params, ExpiresIn=self._expires_in(exp_s)
        )
        return url

    async def size_of(self, key: str) -> int | None:
        from botocore.exceptions import BotoCoreError, ClientError

        def head() -> int | None:
            try:
                meta = self._s3.head_object(Bucket=self.bucket, Key=self.object_key(key))
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise ObjectsUnavailable(f"s3 HEAD {key}: {e}") from e
            except BotoCoreError as e:  # unreachable, timed out
                raise ObjectsUnavailable(f"s3 HEAD {key}: {e}") from e
            return int(meta["ContentLength"])

        return await _deadline(head, f"s3 HEAD {key}")

    async def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        def delete() -> None:
            try:
                self._s3.delete_object(Bucket=self.bucket, Key=self.object_key(key))
            except (BotoCoreError, ClientError) as e:
                raise ObjectsUnavailable(f"s3 DELETE {key}: {e}") from e

        await _deadline(delete, f"s3 DELETE {key}")


async def _deadline(call: Callable[[], T], what: str) -> T:
    """`call()` in a thread, waited for S3_CALL_TIMEOUT_S at most (ObjectsUnavailable
    after that; the thread ends at botocore's own timeouts)."""
    try:
        async with asyncio.timeout(S3_CALL_TIMEOUT_S):
            return await asyncio.to_thread(call)
    except TimeoutError:
        raise ObjectsUnavailable(f"{what}: no answer in {S3_CALL_TIMEOUT_S:g} s") from None


def open_objects(url: str, secret: bytes) -> FileObjects | S3Objects:
    """The objects of a media URL; `secret` signs the URLs of a `file://` root."""
    where = parse_object_url(url, "media", MediaUrlError)
    if isinstance(where, FileUrl):
        return FileObjects(url, where.root, secret)
    return S3Objects(url, where.bucket, where.prefix, where.endpoint, where.region)
