"""The URLs of object storage, for the message archive (storage/archive/objects.py) and
media (storage/media/objects.py), read the same way for both:

- `file:///abs/path` (or `file://localhost/abs/path`): a directory on this machine;
- `s3://bucket/prefix?endpoint=http://host:9000&region=us-east-1`: S3 or an
  S3-compatible store. Credentials are never part of the URL: the usual AWS sources
  (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, profiles, instance roles) apply.

No other option is accepted: a misspelt one is an error, not ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit


@dataclass(frozen=True, slots=True)
class FileUrl:
    root: str  # an absolute path


@dataclass(frozen=True, slots=True)
class S3Url:
    bucket: str
    prefix: str  # no slash at either end; "" for the whole bucket
    endpoint: str  # "": AWS's
    region: str  # "": the SDK's default


def parse_object_url(url: str, what: str, error: type[ValueError]) -> FileUrl | S3Url:
    """`url` read; otherwise `error` saying what is wrong with the `what` URL ("archive",
    "media")."""
    parts = urlsplit(url)
    opts = dict(parse_qsl(parts.query))
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise error(f"bad {what} URL {url!r}: use file:///absolute/path")
        if opts:
            raise error(f"unknown file:// options {sorted(opts)} in {url!r}")
        return FileUrl(unquote(parts.path))
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not bucket or "@" in bucket:
            raise error(
                f"bad {what} URL {url!r}: use s3://bucket/prefix?endpoint=http://host:port "
                "(credentials from the environment, never in the URL)"
            )
        endpoint = opts.pop("endpoint", "")
        region = opts.pop("region", "")
        if opts:
            raise error(f"unknown s3:// options {sorted(opts)} in {url!r}")
        return S3Url(bucket, unquote(parts.path).strip("/"), endpoint, region)
    raise error(
        f"unsupported {what} URL {url!r}: use file:///path or s3://bucket/prefix?endpoint=..."
    )
