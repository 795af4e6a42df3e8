"""file:// and s3:// URLs, read once for the archive and for media (storage/objecturl.py):
what each part becomes, and the same refusals, naming whose URL it was."""

from __future__ import annotations

import pytest

from storage.archive.objects import ArchiveUrlError, open_location
from storage.media.objects import MediaUrlError, open_objects
from storage.objecturl import FileUrl, S3Url, parse_object_url


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("file:///var/lib/imgw/media", FileUrl("/var/lib/imgw/media")),
        ("file://localhost/a%20b", FileUrl("/a b")),
        ("s3://bucket", S3Url("bucket", "", "", "")),
        (
            "s3://b/cold/msgs/?endpoint=http://127.0.0.1:9000&region=eu-west-1",
            S3Url("b", "cold/msgs", "http://127.0.0.1:9000", "eu-west-1"),
        ),
        ("s3://b/p?endpoint=", S3Url("b", "p", "", "")),  # a blank option is no option
    ],
)
def test_what_a_url_says(url: str, parsed: FileUrl | S3Url) -> None:
    assert parse_object_url(url, "media", MediaUrlError) == parsed


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("file://host/abs", "bad {what} URL 'file://host/abs': use file:///absolute/path"),
        ("file:relative", "bad {what} URL 'file:relative': use file:///absolute/path"),
        ("file:///a?x=1", "unknown file:// options ['x'] in 'file:///a?x=1'"),
        ("s3://key:secret@b/p", "bad {what} URL 's3://key:secret@b/p': use s3://bucket/prefix"),
        ("s3:///p", "bad {what} URL 's3:///p': use s3://bucket/prefix"),
        ("s3://b/p?acl=public", "unknown s3:// options ['acl'] in 's3://b/p?acl=public'"),
        ("http://b/p", "unsupported {what} URL 'http://b/p': use file:///path or s3://"),
    ],
)
def test_archive_and_media_refuse_alike(url: str, said: str) -> None:
    with pytest.raises(ArchiveUrlError) as archive:
        open_location(url)
    with pytest.raises(MediaUrlError) as media:
        open_objects(url, b"secret")
    assert str(archive.value).startswith(said.format(what="archive"))
    assert str(media.value).startswith(said.format(what="media"))
