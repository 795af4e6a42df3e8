"""Who calls the admin listener: the admin token, or a scoped API key.

A key is configured as `NAME:SECRET:SCOPES` (`--api-key`, repeatable; `api-key` in the
TOML file; `IMGW_API_KEYS`), SCOPES being one or more of `send`, `read`, `manage`,
`moderate` and `push`, separated by commas. Two keys under one name rotate it: both are
accepted until the old one is removed. The admin token holds every scope and `drain`.

Both are presented as `Authorization: Bearer <secret>`. Every configured secret is
compared in constant time (hmac.compare_digest), all of them on every call, so that
neither a match nor its position shows in the time taken. A key's name, never its secret,
is what logs and `/metrics` show.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

SEND: Final = "send"  # messages, recalls, read and delivered positions, as a uid
READ: Final = "read"  # history, conversations, members, presence
MANAGE: Final = "manage"  # p2p and groups, members, titles, client tokens
MODERATE: Final = "moderate"  # kicks, revocations, broadcast notices
PUSH: Final = "push"  # push registrations
DRAIN: Final = "drain"  # the node's drain: the admin token's alone

KEY_SCOPES: Final = frozenset({SEND, READ, MANAGE, MODERATE, PUSH})
ADMIN_SCOPES: Final = KEY_SCOPES | {DRAIN}
NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,32}")
SECRET_MIN: Final = 16  # characters: a key is a credential on a network port
ADMIN: Final = "admin"  # the name the admin token's calls are counted under


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    secret: bytes
    scopes: frozenset[str]


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    scopes: frozenset[str]


class Unauthorized(Exception):
    """No usable credential: the message says which."""


def parse_api_keys(entries: Iterable[str]) -> tuple[ApiKey, ...]:
    """The keys of `NAME:SECRET:SCOPES` entries; ValueError naming the bad one (by name,
    never by secret). An environment value split at every comma leaves the scopes after
    the first as entries of their own: an entry without a ':' continues the one before."""
    joined: list[str] = []
    for entry in entries:
        entry = entry.strip()
        if not entry:
            continue
        if ":" not in entry and joined:
            joined[-1] += "," + entry
        else:
            joined.append(entry)
    keys: list[ApiKey] = []
    for entry in joined:
        name, _, rest = entry.partition(":")
        secret, sep, scope_list = rest.rpartition(":")
        if not NAME_RE.fullmatch(name):
            raise ValueError(f"api key name {name!r} must match [A-Za-z0-9_-]{{1,32}}")
        if not sep or len(secret) < SECRET_MIN:
            raise ValueError(
                f"api key {name}: give NAME:SECRET:SCOPES with a secret of at least "
                f"{SECRET_MIN} characters"
            )
        scopes = frozenset(s.strip() for s in scope_list.split(",") if s.strip())
        unknown = scopes - KEY_SCOPES
        if not scopes or unknown:
            raise ValueError(
                f"api key {name}: scopes must be some of {', '.join(sorted(KEY_SCOPES))}"
                + (f" (not {', '.join(sorted(unknown))})" if unknown else "")
            )
        keys.append(ApiKey(name, secret.encode(), scopes))
    return tuple(keys)


class Credentials:
    """The admin token and the API keys of one listener."""

    def __init__(self, admin_token: str, keys: Iterable[ApiKey] = ()) -> None:
        self._admin = admin_token.encode()
        self._keys = tuple(keys)

    def caller(self, authorization: str | None) -> Caller:
        """The caller presenting `authorization` (the header's value); Unauthorized when
        it is missing (and an admin token is set) or matches no credential. Without an
        admin token (a loopback-only listener), a request without credentials is the
        admin's."""
        if authorization is None or not authorization.strip():
            if not self._admin:
                return Caller(ADMIN, ADMIN_SCOPES)
            raise Unauthorized("Authorization: Bearer <token> needed")
        scheme, _, presented = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Unauthorized("Authorization: Bearer <token> needed")
        given = presented.strip().encode()
        found: Caller | None = None
        if self._admin and hmac.compare_digest(given, self._admin):
            found = Caller(ADMIN, ADMIN_SCOPES)
        for key in self._keys:  # every one, whatever matched
            if hmac.compare_digest(given, key.secret) and found is None:
                found = Caller(key.name, key.scopes)
        if found is None:
            raise Unauthorized("invalid token")
        return found
