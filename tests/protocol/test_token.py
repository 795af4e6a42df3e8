"""LOGIN tokens (docs/protocol.md, Tokens)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from protocol.errors import ProtocolError
from protocol.ops import MAX_U64, ErrorCode
from protocol.token import (
    DEVICE_RE,
    KID_RE,
    TOKEN_LEEWAY_S,
    KeyRing,
    TokenClaims,
    TokenError,
    sign_token,
    verify_token,
)

SECRET = "s3cret-ü"
RING = KeyRing.parse(f"k1:{SECRET}")
EXP = 1_700_000_000
NOW = EXP - 100


def verify(
    token: str, ring: KeyRing = RING, *, uid: int = 42, device: str = "ios-1", now: float = NOW
) -> TokenClaims:
    return verify_token(token, ring, uid=uid, device=device, now=now)


def reason(token: str, **kwargs: object) -> str:
    with pytest.raises(TokenError) as info:
        verify(token, **kwargs)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.AUTH_FAILED
    assert isinstance(info.value, ProtocolError)
    return info.value.reason


GOOD = sign_token("k1", SECRET, 42, "ios-1", EXP)


def test_known_answer() -> None:
    signed = f"v1.k1.42.ios-1.{EXP}"
    mac = hmac.new(SECRET.encode("utf-8"), signed.encode(), hashlib.sha256).digest()
    expected = signed + "." + base64.urlsafe_b64encode(mac).decode().rstrip("=")
    assert expected == GOOD
    assert "=" not in GOOD


def test_roundtrip() -> None:
    assert verify(GOOD) == TokenClaims("k1", 42, "ios-1", EXP)
    assert sign_token("k1", SECRET.encode(), 42, "ios-1", EXP) == GOOD
    big = sign_token("k1", SECRET, MAX_U64, "d" * 32, 0)
    assert verify(big, uid=MAX_U64, device="d" * 32, now=0).uid == MAX_U64


def _resign(body: str, secret: str = SECRET) -> str:
    mac = hmac.new(secret.encode(), body.encode(), hashlib.sha256).digest()
    return body + "." + base64.urlsafe_b64encode(mac).decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        "",
        "v1",
        GOOD + ".extra",
        GOOD.rsplit(".", 1)[0],
        GOOD.replace("v1.", "v2.", 1),
        _resign("v1.k1.042.ios-1.1700000000"),
        _resign("v1.k1.+42.ios-1.1700000000"),
        _resign("v1.k1.-42.ios-1.1700000000"),
        _resign("v1.k1.0.ios-1.1700000000"),
        _resign("v1.k1. 42.ios-1.1700000000"),
        _resign("v1.k1.٤٢.ios-1.1700000000"),  # non-ASCII digits
        _resign(f"v1.k1.{2**64}.ios-1.1700000000"),
        _resign("v1.k1.42.ios-1.01700000000"),
        _resign("v1.k1.42.ios-1.-1"),
        _resign("v1.k1.42.ios 1.1700000000"),
        _resign("v1.k1.42..1700000000"),
        _resign(f"v1.k1.42.{'d' * 33}.1700000000"),
        _resign("v1.k1.42.ios-1\n.1700000000"),
        _resign(f"v1.{'k' * 17}.42.ios-1.1700000000"),
        _resign("v1..42.ios-1.1700000000"),
        GOOD[:-1],
        GOOD + "A",
        GOOD[:-1] + "=",
        GOOD[:-1] + "é",
        GOOD[:-1] + "\n",
        "v1.k1.42.ios-1.1700000000." + "A" * 500,
    ],
)
def test_malformed(token: str) -> None:
    assert reason(token) == "malformed"


def test_unknown_kid() -> None:
    other = sign_token("k9", SECRET, 42, "ios-1", EXP)
    assert reason(other) == "unknown_kid"


def test_bad_signature() -> None:
    assert reason(sign_token("k1", "other", 42, "ios-1", EXP)) == "bad_signature"
    flipped = GOOD[:-2] + ("A" if GOOD[-2] != "A" else "B") + GOOD[-1]
    assert reason(flipped) == "bad_signature"
    # Claims changed under the original signature.
    sig = GOOD.rsplit(".", 1)[1]
    assert reason(f"v1.k1.43.ios-1.{EXP}.{sig}", uid=43) == "bad_signature"
    assert reason(f"v1.k1.42.ios-1.{EXP + 1}.{sig}") == "bad_signature"


def test_signature_is_checked_before_expiry_and_claims() -> None:
    forged = sign_token("k1", "other", 7, "web", 0)
    assert reason(forged, uid=42) == "bad_signature"


def test_expiry_leeway_edge() -> None:
    assert TOKEN_LEEWAY_S == 60
    assert verify(GOOD, now=EXP).exp == EXP
    assert verify(GOOD, now=EXP + 60).exp == EXP
    assert reason(GOOD, now=EXP + 60.001) == "expired"
    assert reason(GOOD, now=EXP + 10_000) == "expired"
    assert verify_token(GOOD, RING, uid=42, device="ios-1", now=EXP, leeway=0).exp == EXP
    with pytest.raises(TokenError, match="expired"):
        verify_token(GOOD, RING, uid=42, device="ios-1", now=EXP + 0.5, leeway=0)


def test_lifetime_ceiling() -> None:
    month = 30 * 86_400

    def at(now: float, ceiling: int | None = month) -> TokenClaims:
        return verify_token(GOOD, RING, uid=42, device="ios-1", now=now, max_lifetime=ceiling)

    assert at(EXP - month).exp == EXP
    assert at(EXP - month - 60).exp == EXP  # the leeway
    with pytest.raises(TokenError, match="too_long"):
        at(EXP - month - 61)
    assert at(EXP - 100 * 12 * month, None).exp == EXP  # no ceiling asked for


def test_uid_and_device_mismatch() -> None:
    assert reason(GOOD, uid=43) == "uid_mismatch"
    assert reason(GOOD, device="ios-2") == "device_mismatch"
    assert reason(GOOD, device="IOS-1") == "device_mismatch"


def test_key_rotation() -> None:
    ring = KeyRing.parse("k2:new-secret,k1:old-secret")
    old = sign_token("k1", "old-secret", 42, "ios-1", EXP)
    new = sign_token("k2", "new-secret", 42, "ios-1", EXP)
    assert verify(old, ring).kid == "k1"
    assert verify(new, ring).kid == "k2"
    assert reason(sign_token("k2", "old-secret", 42, "ios-1", EXP), ring=ring) == "bad_signature"
    retired = KeyRing.parse("k2:new-secret")
    assert reason(old, ring=retired) == "unknown_kid"
    assert verify(new, retired).kid == "k2"


def test_keyring_api() -> None:
    ring = KeyRing.parse(" a:x , b:y:z ")
    assert len(ring) == 2
    assert ring.kids == ("a", "b")
    assert "a" in ring and "c" not in ring and 1 not in ring
    assert ring.get("b") == b"y:z"
    assert ring["a"] == b"x"
    assert ring.get("c") is None
    assert dict(ring) == {"a": b"x", "b": b"y:z"}
    assert KeyRing.from_pairs(["a:x", "b:y:z"]) == ring
    assert KeyRing({"a": "x", "b": b"y:z"}) == ring
    assert KeyRing.parse("k:ü").get("k") == "ü".encode()
    assert "x" not in repr(KeyRing.parse("k:supersecret").kids) and "supersecret" not in repr(
        KeyRing.parse("k:supersecret")
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("hunter2", "lacks ':'"),
        ("a:hunter2,", "lacks ':'"),
        ("a:hunter2,,b:y", "lacks ':'"),
        (":hunter2", "bad key id"),
        ("bad kid:hunter2", "bad key id"),
        ("k/1:hunter2", "bad key id"),
        (f"{'k' * 17}:hunter2", "bad key id"),
        ("k:", "empty secret"),
        ("k:hunter2,k:b", "twice"),
    ],
)
def test_keyring_parse_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        KeyRing.parse(spec)
    assert "hunter2" not in str(info.value)


def test_keyring_errors_do_not_echo_secrets() -> None:
    with pytest.raises(ValueError) as info:
        KeyRing.from_pairs(["hunter2"])
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError):
        KeyRing.from_pairs([])


@pytest.mark.parametrize(
    ("kid", "uid", "device", "exp"),
    [
        ("bad kid", 42, "ios", EXP),
        ("k1", 0, "ios", EXP),
        ("k1", -1, "ios", EXP),
        ("k1", True, "ios", EXP),
        ("k1", 2**64, "ios", EXP),
        ("k1", 42, "", EXP),
        ("k1", 42, "a.b", EXP),
        ("k1", 42, "ios", -1),
    ],
)
def test_sign_token_refuses_unverifiable_values(kid: str, uid: int, device: str, exp: int) -> None:
    with pytest.raises(ValueError):
        sign_token(kid, SECRET, uid, device, exp)


def test_patterns() -> None:
    for ok in ("a", "A-z_0", "d" * 32):
        assert DEVICE_RE.match(ok) and DEVICE_RE.fullmatch(ok)
    for bad in ("", "d" * 33, "a b", "a.b", "é", "ios\n", "ios\r"):
        assert not DEVICE_RE.match(bad) and not DEVICE_RE.search(bad)
    assert KID_RE.match("k" * 16) and not KID_RE.match("k" * 17) and not KID_RE.match("k\n")


def test_v2_tokens_carry_when_they_were_minted() -> None:
    tok = sign_token("k1", SECRET, 42, "ios-1", EXP, iat=EXP - 3600)
    assert tok.startswith("v2.k1.42.ios-1.")
    claims = verify_token(tok, RING, uid=42, device="ios-1", now=NOW)
    assert (claims.exp, claims.iat) == (EXP, EXP - 3600)
    assert verify(GOOD).iat is None  # v1: unknown
    forged = tok.replace(f".{EXP - 3600}.", f".{EXP - 60}.")  # a later iat, same signature
    assert reason(forged) == "bad_signature"
    longest = sign_token("k" * 16, SECRET, MAX_U64, "d" * 32, MAX_U64, iat=MAX_U64)
    assert verify_token(longest, KeyRing({"k" * 16: SECRET}), uid=MAX_U64, device="d" * 32,
                        now=MAX_U64).iat == MAX_U64  # fmt: skip
    with pytest.raises(ValueError, match="iat"):
        sign_token("k1", SECRET, 42, "ios-1", EXP, iat=-1)


def test_a_v2_token_minted_later_than_the_clock_allows_is_refused() -> None:
    """An iat in the future would escape a revocation made now: only the clock leeway is
    allowed, as on exp."""
    at_edge = sign_token("k1", SECRET, 42, "ios-1", EXP, iat=NOW + TOKEN_LEEWAY_S)
    assert verify(at_edge).iat == NOW + TOKEN_LEEWAY_S
    past_it = sign_token("k1", SECRET, 42, "ios-1", EXP, iat=NOW + TOKEN_LEEWAY_S + 1)
    assert reason(past_it) == "iat_future"
    fifty_minutes = sign_token("k1", SECRET, 42, "ios-1", EXP + 3600, iat=NOW + 3000)
    assert reason(fifty_minutes) == "iat_future"
    assert verify_token(fifty_minutes, RING, uid=42, device="ios-1", now=NOW + 3000).iat
    with pytest.raises(TokenError, match="iat_future"):  # the leeway given is the one used
        verify_token(at_edge, RING, uid=42, device="ios-1", now=NOW, leeway=0)


def test_a_v2_token_minted_after_its_expiry_is_refused() -> None:
    after = _resign(f"v2.k1.42.ios-1.{NOW}.{NOW - 1}")  # still within exp's leeway
    assert reason(after) == "iat_after_exp"
    assert verify(_resign(f"v2.k1.42.ios-1.{NOW}.{NOW}")).iat == NOW  # iat == exp: fine
    with pytest.raises(ValueError, match="after exp"):
        sign_token("k1", SECRET, 42, "ios-1", NOW - 1, iat=NOW)
