"""Signed media URLs (storage/media/signing.py) and media keys (protocol/mediakeys.py):
pure functions, no I/O."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import msgpack
import pytest

from protocol.mediakeys import key_of_content, media_content, media_key, parse_key, type_allowed
from storage.media.signing import Grant, SignatureError, signed_path, verify

SECRET = b"0123456789abcdef-secret"
KEY = media_key(42, "ab" * 32)
NOW = 1_750_000_000


def _split(path: str) -> tuple[str, str]:
    url = urlsplit(path)
    return url.path, url.query


def test_a_signed_url_verifies_to_its_grant() -> None:
    grant = Grant("PUT", KEY, NOW + 60, 1234, "image/png")
    path, query = _split(signed_path(SECRET, grant))
    assert path == f"/{KEY}"
    assert verify(SECRET, "PUT", path, query, NOW) == grant
    get = Grant("GET", KEY, NOW + 60, 0, "image/png")
    assert verify(SECRET, "GET", *_split(signed_path(SECRET, get)), NOW + 60) == get


def test_a_download_url_carries_no_size() -> None:
    """A GET URL names no size (it has none: the object's is what it is), yet a URL of
    a download that names one, 0, still verifies."""
    grant = Grant("GET", KEY, NOW + 60, 0, "image/png")
    path, query = _split(signed_path(SECRET, grant))
    assert "size" not in dict(parse_qsl(query))
    with_size = urlencode({**dict(parse_qsl(query)), "size": "0"})
    assert verify(SECRET, "GET", path, with_size, NOW) == grant
    put = Grant("PUT", KEY, NOW + 60, 10, "image/png")
    assert dict(parse_qsl(_split(signed_path(SECRET, put))[1]))["size"] == "10"


def test_an_expired_url_is_refused() -> None:
    path, query = _split(signed_path(SECRET, Grant("GET", KEY, NOW, 0, "image/png")))
    with pytest.raises(SignatureError) as e:
        verify(SECRET, "GET", path, query, NOW + 1)
    assert e.value.reason == "expired"


@pytest.mark.parametrize(
    ("field", "value"),
    [("exp", str(NOW + 10**6)), ("size", "99999"), ("type", "text/html"), ("sig", "AAAA")],
)
def test_a_tampered_url_is_refused(field: str, value: str) -> None:
    path, query = _split(signed_path(SECRET, Grant("PUT", KEY, NOW + 60, 10, "image/png")))
    params = dict(parse_qsl(query))
    params[field] = value
    with pytest.raises(SignatureError) as e:
        verify(SECRET, "PUT", path, urlencode(params), NOW)
    assert e.value.reason == "bad_signature"


def test_another_key_method_or_secret_is_refused() -> None:
    path, query = _split(signed_path(SECRET, Grant("GET", KEY, NOW + 60, 0, "image/png")))
    other = "/" + media_key(43, "ab" * 32)
    for method, p, secret in (("PUT", path, SECRET), ("GET", other, SECRET),
                              ("GET", path, b"another-secret-0123")):  # fmt: skip
        with pytest.raises(SignatureError, match="bad_signature"):
            verify(secret, method, p, query, NOW)


@pytest.mark.parametrize("query", ["", "exp=1", "exp=x&size=0&type=a/b&sig=s", "sig=s"])
def test_a_malformed_query_is_refused(query: str) -> None:
    with pytest.raises(SignatureError, match="malformed"):
        verify(SECRET, "GET", f"/{KEY}", query, NOW)


def test_keys_parse_only_in_their_one_form() -> None:
    assert parse_key(KEY) == (42, "ab" * 32)
    h = "ab" * 32
    bad_keys = ("media/0/" + h, "media/42/" + h.upper(), "media/42/" + h[:-2],
                "media/42/../" + h, "x/42/" + h, KEY + "/", "media/-1/ab")  # fmt: skip
    for bad in bad_keys:
        assert parse_key(bad) is None, bad


def test_content_types_match_names_or_major_wildcards() -> None:
    allowed = ("image/*", "application/pdf")
    assert type_allowed("image/png", allowed) and type_allowed("application/pdf", allowed)
    assert not type_allowed("application/zip", allowed)
    assert not type_allowed("image/png; charset=x", allowed)  # parameters are not a type
    assert not type_allowed("Image/PNG", allowed)
    assert type_allowed("application/zip", ("*/*",))


def test_the_key_of_a_media_content() -> None:
    assert key_of_content(media_content(KEY, name="a.png", size=3)) == KEY
    assert key_of_content(b"plain text") is None
    assert key_of_content(b"") is None
    assert key_of_content(msgpack.packb({"key": 5})) is None
    assert key_of_content(msgpack.packb({"url": "x"})) is None
    assert key_of_content(b"\x81\xa3key") is None  # truncated


def test_the_generated_secret_is_made_once_and_kept_in_the_data_dir(tmp_path: Path) -> None:
    from gateway.media import SECRET_FILE, _secret

    first = _secret(str(tmp_path), "")
    assert len(first) >= 32 and _secret(str(tmp_path), "") == first
    assert (tmp_path / SECRET_FILE).stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [SECRET_FILE]  # no leftovers
    assert _secret(str(tmp_path), "given-secret-0123456") == b"given-secret-0123456"
