"""LOGIN tokens: ``v1.<kid>.<uid>.<device>.<exp>.<sig>`` (docs/protocol.md, Tokens).

``sig = base64url_nopad(HMAC-SHA256(secret[kid], "v1.<kid>.<uid>.<device>.<exp>"))``
where the secret is the UTF-8 bytes of the configured string, `uid` (>= 1) and `exp`
(Unix seconds) are canonical decimal. The business login service mints tokens;
`sign_token` exists for tests and the mint command.

`verify_token` checks, in this order: form, kid known, signature (constant time),
expiry (``now > exp + leeway`` fails), lifetime, a v2 token's minting time (``iat > exp``
fails, and so does ``iat > now + leeway``: a token "minted" later than the clock allows
would escape a revocation made now), then uid and device against the LOGIN's. The
signature is checked before any claim is trusted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from protocol.errors import TokenError, TokenFailure
from protocol.ops import MAX_U64

__all__ = [
    "DEVICE_RE",
    "KID_RE",
    "TOKEN_LEEWAY_S",
    "KeyRing",
    "TokenClaims",
    "TokenError",
    "TokenFailure",
    "sign_token",
    "verify_token",
]

TOKEN_LEEWAY_S: Final = 60
TOKEN_VERSION: Final = "v1"
TOKEN_V2: Final = "v2"  # v1 plus the minting time (iat), before exp

# \A...\Z: safe with match(), fullmatch() and search() alike ($ would accept "\n").
DEVICE_RE: Final = re.compile(r"\A[A-Za-z0-9_-]{1,32}\Z")
KID_RE: Final = re.compile(r"\A[A-Za-z0-9_-]{1,16}\Z")
_UID_RE: Final = re.compile(r"\A[1-9][0-9]{0,19}\Z")
_EXP_RE: Final = re.compile(r"\A(?:0|[1-9][0-9]{0,19})\Z")
_SIG_RE: Final = re.compile(r"\A[A-Za-z0-9_-]{43}\Z")  # 32 bytes, base64url, no padding
_MAX_TOKEN_LEN: Final = 160  # longest well-formed token: 138 chars (v1), 159 (v2)


class KeyRing(Mapping[str, bytes]):
    """kid -> HMAC secret (bytes), in configuration order; the first kid signs."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]]):
        items = keys.items() if isinstance(keys, Mapping) else keys
        self._keys: dict[str, bytes] = {}
        for kid, secret in items:
            if not KID_RE.match(kid):
                raise ValueError(f"bad key id {kid!r}: must match [A-Za-z0-9_-]{{1,16}}")
            if kid in self._keys:
                raise ValueError(f"key id {kid!r} appears twice")
            raw = secret.encode() if isinstance(secret, str) else bytes(secret)
            if not raw:
                raise ValueError(f"key {kid!r} has an empty secret")
            self._keys[kid] = raw
        if not self._keys:
            raise ValueError("key ring is empty: give at least one KID:SECRET")

    @classmethod
    def from_pairs(cls, pairs: Iterable[str]) -> KeyRing:
        """Build from ``"KID:SECRET"`` strings (the secret may contain ':')."""
        items = []
        for i, pair in enumerate(pairs):
            kid, sep, secret = pair.partition(":")
            if not sep:
                # Never echo the entry: it may be a secret pasted without its kid.
                raise ValueError(f"key entry #{i + 1} lacks ':': expected KID:SECRET")
            items.append((kid, secret))
        return cls(items)

    @classmethod
    def parse(cls, spec: str) -> KeyRing:
        """Build from ``"kid:secret,kid2:secret2"``; blanks around entries are ignored.

        A secret cannot contain ',' or begin or end with a blank here; use
        `from_pairs` for such secrets.
        """
        if not spec.strip():
            raise ValueError("key ring spec is empty: expected 'kid:secret[,kid2:secret2...]'")
        return cls.from_pairs(entry.strip() for entry in spec.split(","))

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def __getitem__(self, kid: str) -> bytes:
        return self._keys[kid]

    def __contains__(self, kid: object) -> bool:
        return kid in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"KeyRing(kids={list(self._keys)!r})"  # never the secrets


@dataclass(frozen=True, slots=True)
class TokenClaims:
    kid: str
    uid: int
    device: str
    exp: int
    iat: int | None = None  # v2 tokens: when minted (a revocation refuses those before it)


def _signature(secret: bytes, signed: str) -> str:
    digest = hmac.new(secret, signed.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign_token(
    kid: str, secret: str | bytes, uid: int, device: str, exp: int, *, iat: int | None = None
) -> str:
    """Mint a token (v2, `v2.<kid>.<uid>.<device>.<iat>.<exp>.<sig>`, when `iat` is given;
    else v1); raises ValueError on values no verifier would accept."""
    if not KID_RE.match(kid):
        raise ValueError(f"bad key id {kid!r}: must match [A-Za-z0-9_-]{{1,16}}")
    if not DEVICE_RE.match(device):
        raise ValueError(f"bad device {device!r}: must match [A-Za-z0-9_-]{{1,32}}")
    if type(uid) is not int or not 1 <= uid <= MAX_U64:
        raise ValueError(f"uid must be an int in 1..2^64-1, got {uid!r}")
    if type(exp) is not int or not 0 <= exp <= MAX_U64:
        raise ValueError(f"exp must be an int in 0..2^64-1, got {exp!r}")
    raw = secret.encode() if isinstance(secret, str) else secret
    if iat is None:
        signed = f"{TOKEN_VERSION}.{kid}.{uid}.{device}.{exp}"
    else:
        if type(iat) is not int or not 0 <= iat <= MAX_U64:
            raise ValueError(f"iat must be an int in 0..2^64-1, got {iat!r}")
        if iat > exp:
            raise ValueError(f"iat {iat} is after exp {exp}")
        signed = f"{TOKEN_V2}.{kid}.{uid}.{device}.{iat}.{exp}"
    return f"{signed}.{_signature(raw, signed)}"


def verify_token(
    token: str,
    ring: KeyRing,
    *,
    uid: int,
    device: str,
    now: float,
    leeway: int = TOKEN_LEEWAY_S,
    max_lifetime: int | None = None,
) -> TokenClaims:
    """Check `token` for a LOGIN of (`uid`, `device`) at time `now` (Unix seconds).

    Returns the claims; raises `TokenError` with reason "malformed", "unknown_kid",
    "bad_signature", "expired", "too_long" (exp more than `max_lifetime` seconds ahead,
    plus the leeway), "iat_after_exp", "iat_future" (minted more than the leeway after
    `now`: the same allowance for clock skew as on exp), "uid_mismatch" or
    "device_mismatch".
    """
    parts = token.split(".") if len(token) <= _MAX_TOKEN_LEN else ()
    iat_s = "0"
    if len(parts) == 6 and parts[0] == TOKEN_VERSION:
        version, kid, uid_s, dev, exp_s, sig = parts
    elif len(parts) == 7 and parts[0] == TOKEN_V2:
        version, kid, uid_s, dev, iat_s, exp_s, sig = parts
    else:
        raise TokenError("malformed")
    if (
        not _EXP_RE.match(iat_s)
        or not KID_RE.match(kid)
        or not _UID_RE.match(uid_s)
        or not DEVICE_RE.match(dev)
        or not _EXP_RE.match(exp_s)
        or not _SIG_RE.match(sig)
    ):
        raise TokenError("malformed")
    token_uid = int(uid_s)
    if token_uid > MAX_U64:
        raise TokenError("malformed")
    secret = ring.get(kid)
    if secret is None:
        raise TokenError("unknown_kid")
    expected = _signature(secret, token[: len(token) - len(sig) - 1])
    if not hmac.compare_digest(expected, sig):  # both ASCII (checked above)
        raise TokenError("bad_signature")
    exp = int(exp_s)
    if now > exp + leeway:
        raise TokenError("expired")
    if max_lifetime is not None and exp > now + max_lifetime + leeway:
        raise TokenError("too_long")
    iat = int(iat_s) if version == TOKEN_V2 else None
    if iat is not None:
        if iat > exp:
            raise TokenError("iat_after_exp")
        if iat > now + leeway:
            raise TokenError("iat_future")
    if token_uid != uid:
        raise TokenError("uid_mismatch")
    if dev != device:
        raise TokenError("device_mismatch")
    return TokenClaims(kid, token_uid, dev, exp, iat)
