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
- A push event's badge (`unread_badges`) is bounded, so that building events costs the
  same whatever a user left unread: it sums, over the user's BADGE_CONVS most recently
  active conversations with anything above their read position, the messages that
  count as unread among each one's latest BADGE_SCAN (so a conversation adds at most
  BADGE_SCAN: an app shows "99+"). Messages moved to the archive tier are not counted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from storage.rules import unread_types_sql

PUSH_DEVICES_MAX: Final = 10  # registrations kept per uid (docs/protocol.md)
MUTE_FOREVER_MS: Final = (1 << 63) - 1
UIDS_PER_QUERY: Final = 1_000  # push_devices and unread_badges ask about this many uids a query
PAIRS_PER_QUERY: Final = 500  # muted asks about this many (conv_id, uid) a query
BADGE_CONVS: Final = 100  # a badge counts this many of a user's conversations
BADGE_SCAN: Final = 100  # and, in each, the unread among its latest this many messages


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


def badge_ranges_sql(uids: int, mark: str, *, greatest: str) -> str:
    """For `uids` uids (the parameters), rows (uid, last_active_ms, conv_id, lo, hi) of
    their BADGE_CONVS most recently active conversations with messages above their read
    position: the seqs lo < seq <= hi are those a badge counts in (the latest
    BADGE_SCAN above the read position; no subtraction below zero, for MySQL's unsigned
    columns). `greatest` is the engine's two-argument maximum."""
    return f"""SELECT uid, last_active, conv_id, lo, hi FROM (
  SELECT m.uid AS uid, m.conv_id AS conv_id, s.last_active_ms AS last_active,
    {greatest}(m.read_seq + {BADGE_SCAN}, s.max_seq) - {BADGE_SCAN} AS lo, s.max_seq AS hi,
    ROW_NUMBER() OVER (PARTITION BY m.uid
                       ORDER BY s.last_active_ms DESC, m.conv_id DESC) AS n
  FROM im_conv_member m JOIN im_conv_seq s ON s.conv_id = m.conv_id
  WHERE m.uid IN ({",".join([mark] * uids)}) AND m.left_seq IS NULL
    AND s.max_seq > m.read_seq
) r WHERE n <= {BADGE_CONVS}"""


def badge_sql(uids: int, mark: str, *, greatest: str) -> str:
    """`badge_ranges_sql` counted where the messages are in the same database: rows
    (uid, last_active_ms, conv_id, unread), each count one bounded range of the
    (conv_id, seq) index."""
    ranges = badge_ranges_sql(uids, mark, greatest=greatest)
    return f"""SELECT r.uid, r.last_active, r.conv_id, COUNT(*) FROM ({ranges}) r
JOIN im_message x ON x.conv_id = r.conv_id AND x.seq > r.lo AND x.seq <= r.hi
WHERE x.sender_uid <> r.uid AND {unread_types_sql("x.msg_type")}
GROUP BY r.uid, r.last_active, r.conv_id"""


def badge_totals(rows: Iterable[tuple[int, int, int, int]]) -> dict[int, int]:
    """Each uid's badge from rows (uid, last_active_ms, conv_id, unread) of one server or
    several: the counts of its BADGE_CONVS most recently active conversations, summed."""
    per_uid: dict[int, list[tuple[int, int, int]]] = {}
    for uid, last_active, conv_id, n in rows:
        per_uid.setdefault(uid, []).append((last_active, conv_id, n))
    out: dict[int, int] = {}
    for uid, convs in per_uid.items():
        if len(convs) > BADGE_CONVS:
            convs = sorted(convs, reverse=True)[:BADGE_CONVS]
        out[uid] = sum(n for _, _, n in convs)
    return out
