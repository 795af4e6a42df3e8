"""The rules of offline push registrations and mutes, decided once for every store
(docs/protocol.md, Offline push). Pure: the stores read what a rule needs inside their
transaction, call it, and write what it decided.

- A registration belongs to one (uid, device); a (provider, token) to one registration:
  registering a token another device holds moves it (the other row is deleted in the
  same transaction), so a phone never gets the previous user's notifications.
- A uid keeps at most `max_devices` registrations: a new one replaces the least
  recently registered (`plan_register`), and is never refused. Each registration of a
  uid is stamped later than every other of that uid, so "least recently" is exact even
  within one millisecond or after the clock stepped back.
- A mute lasts until `until_ms`; 0, or a time already past, unmutes (the row goes).
  Times beyond what a signed 64-bit column holds are kept as `MUTE_FOREVER_MS`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

PUSH_DEVICES_MAX: Final = 10  # registrations kept per uid (docs/protocol.md)
MUTE_FOREVER_MS: Final = (1 << 63) - 1
UIDS_PER_QUERY: Final = 1_000  # push_devices and unread_badges ask about this many uids a query
PAIRS_PER_QUERY: Final = 500  # muted asks about this many (conv_id, uid) a query


@dataclass(frozen=True, slots=True)
class RegisterPlan:
    stamp_ms: int  # the registration's updated_ms
    evicted: list[str]  # the uid's devices whose registrations go to make room


def plan_register(
    registered: Sequence[tuple[str, int]], device: str, now_ms: int, *, max_devices: int
) -> RegisterPlan:
    """A registration of `device` by a uid whose registrations are `registered`
    ((device, updated_ms), after any move of the token away from them): its stamp,
    later than every other of the uid, and the least recently registered others that
    go so that at most `max_devices` remain."""
    if max_devices < 1:
        raise ValueError("max_devices must be at least 1")
    stamp = max([now_ms, *(ms + 1 for _, ms in registered)])
    others = sorted((ms, d) for d, ms in registered if d != device)
    excess = len(others) + 1 - max_devices
    return RegisterPlan(stamp, [d for _, d in others[: max(0, excess)]])


def mute_until(until_ms: int, now_ms: int) -> int | None:
    """What a MUTE stores: its end, capped at MUTE_FOREVER_MS; None (delete the row)
    when it unmutes: 0, or a time not after `now_ms`."""
    if until_ms <= now_ms:
        return None
    return min(until_ms, MUTE_FOREVER_MS)


def token_digest(token: str) -> bytes:
    """The SHA-256 of a token's UTF-8 bytes: what MySQL's unique index of (provider,
    token) holds, 32 bytes where tokens run to 2,048."""
    return hashlib.sha256(token.encode()).digest()


def chunks(uids: Sequence[int], size: int = 0) -> list[Sequence[int]]:
    """`uids` without repeats, in queries of at most `size` (0: UIDS_PER_QUERY)."""
    size = size or UIDS_PER_QUERY
    unique = list(dict.fromkeys(uids))
    return [unique[i : i + size] for i in range(0, len(unique), size)]


def pair_chunks(pairs: Iterable[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """(conv_id, uid) pairs without repeats, in queries of at most PAIRS_PER_QUERY."""
    unique = list(dict.fromkeys(pairs))
    return [unique[i : i + PAIRS_PER_QUERY] for i in range(0, len(unique), PAIRS_PER_QUERY)]


def muted_sql(pairs: int, mark: str) -> str:
    """The mutes among `pairs` (conv_id, uid) pairs that last past a time: parameters
    conv_id, uid for each pair, then the time. Each pair is a primary-key lookup."""
    keys = " OR ".join([f"(conv_id={mark} AND uid={mark})"] * pairs)
    return f"SELECT conv_id, uid FROM im_conv_mute WHERE ({keys}) AND until_ms > {mark}"
