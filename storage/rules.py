"""The rules of sending, recalling and counting unread, decided once for every store.

Pure: no I/O. The stores read what a rule needs inside their transaction, call it, and
write what it decided (as they do with `storage.membership.plan_change`).

- Append: which messages of a batch are stored and how each is answered
  (`plan_append`, then `append_results`; `resend_result` for a send found stored;
  `reused_elsewhere` for keys reused across servers).
- Recall: whether a message may be recalled (`recall_refusal`) and the recall
  message's content (`recall_content`).
- Unread: which messages count as unread (`counts_as_unread`), and the same as a SQL
  condition (`UNREAD_TYPES_SQL`), both from `protocol.ops.CLIENT_MSG_TYPES`. Archived
  messages keep counting: an archived batch leaves, per sender, the seqs of its
  messages that count (`unread_runs`), and SYNC counts them above a reader's position
  (`count_in_runs`), so moving messages between tiers changes no unread count.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgpack

from protocol.ops import CLIENT_MSG_TYPES, is_client_msg_type
from storage.models import (
    AppendResult,
    AppendStatus,
    NewMessage,
    RecallResult,
    RecallStatus,
    StoredMessage,
)

SendKey = tuple[int, str]  # (sender_uid, client_msg_id): the idempotency key of a send
SERVER_UID: Final = 0  # the sender of system messages: a member of every live conversation

# -- append ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """What a batch does. `store`: the indexes of the messages to store, in batch order:
    the first send of its key in the batch, not sent before, from a current member of
    its conversation. `refused`: first sends whose sender is not a current member.
    `first`: the index of the first send of each key not sent before. The server
    (`SERVER_UID`, the server API's system messages) may write into any conversation
    that has a current member."""

    store: list[int]
    refused: frozenset[int]
    first: dict[SendKey, int]


def plan_append(
    batch: Sequence[NewMessage],
    sent: Mapping[SendKey, StoredMessage],
    members: Mapping[int, Sequence[int]],
) -> AppendPlan:
    """`sent`: the messages already stored under keys of the batch; `members`: the
    current members of the batch's conversations. A later send of a key in the same
    batch is a resend of its first send, whatever that first send's fate."""
    first: dict[SendKey, int] = {}
    store: list[int] = []
    refused: set[int] = set()
    for i, m in enumerate(batch):
        key = (m.sender_uid, m.client_msg_id)
        if key in sent or key in first:
            continue
        first[key] = i
        current = members.get(m.conv_id, ())
        if m.sender_uid in current or (m.sender_uid == SERVER_UID and current):
            store.append(i)
        else:
            refused.add(i)
    return AppendPlan(store, frozenset(refused), first)


def reused_elsewhere(
    batch: Sequence[NewMessage],
    recorded: Mapping[SendKey, set[int]],
    server_of: Callable[[int], object],
) -> list[int]:
    """With message shards over several servers: the positions of `batch` whose key
    was used before for another conversation (`recorded`: the conversations of the
    idempotency records found on any server), or earlier in the batch for a
    conversation on another server; each is answered CONFLICT. A record of the same
    conversation (a copy left by a move) is not a reuse; an earlier send of the batch on
    the same server is left to that server's commit, as with one server."""
    out: list[int] = []
    first: dict[SendKey, int] = {}  # the conversation of each key's first send
    for i, m in enumerate(batch):
        key = (m.sender_uid, m.client_msg_id)
        if any(c != m.conv_id for c in recorded.get(key, ())):
            out.append(i)
            continue
        prior = first.setdefault(key, m.conv_id)
        if prior != m.conv_id and server_of(prior) is not server_of(m.conv_id):
            out.append(i)
    return out


def resend_result(m: NewMessage, original: StoredMessage | None) -> AppendResult:
    """The answer to a send whose key was used before: DUPLICATE (with the original)
    when it is the same send, CONFLICT when it is another; NOT_MEMBER when the first
    send was refused (`original` None)."""
    if original is None:
        return AppendResult(AppendStatus.NOT_MEMBER)
    if original.same_send(m.conv_id, m.msg_type, m.content):
        return AppendResult(AppendStatus.DUPLICATE, original)
    return AppendResult(AppendStatus.CONFLICT)


def append_results(
    batch: Sequence[NewMessage],
    plan: AppendPlan,
    sent: Mapping[SendKey, StoredMessage],
    stored: Mapping[int, StoredMessage],
    members: Mapping[int, Sequence[int]],
    *,
    outbox_id: int = 0,
) -> list[AppendResult]:
    """One result per message of `batch`, in order. `stored`: the message stored for
    each index of `plan.store`; STORED results carry the conversation's current members
    (for fan-out) and `outbox_id`."""
    results: list[AppendResult] = []
    for i, m in enumerate(batch):
        msg = stored.get(i)
        if msg is not None:
            results.append(AppendResult(AppendStatus.STORED, msg, members[m.conv_id], outbox_id))
        elif i in plan.refused:
            results.append(AppendResult(AppendStatus.NOT_MEMBER))
        else:
            key = (m.sender_uid, m.client_msg_id)
            results.append(resend_result(m, sent.get(key) or stored.get(plan.first.get(key, -1))))
    return results


# -- recall ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecallTarget:
    """What the recall rule needs of the message to recall, as stored."""

    sender_uid: int
    msg_type: int
    server_ms: int
    recall_seq: int  # the seq of the recall message that recalled it; 0 if not recalled


def recall_refusal(
    target: RecallTarget | None,
    seq: int,
    by: int,
    *,
    now_ms: int,
    window_ms: int,
    min_seq: int,
) -> RecallResult | None:
    """The answer when `by` may not recall message `seq` (`target`, None when there is
    no such message): below the reader's `min_seq` or absent, NO_SUCH_MESSAGE; another
    sender's, DENIED; recalled before, ALREADY with that recall's seq; not a client
    message type or older than `window_ms`, DENIED. None: recall it."""
    if target is None or seq < min_seq:
        return RecallResult(RecallStatus.NO_SUCH_MESSAGE)
    if target.sender_uid != by:
        return RecallResult(RecallStatus.DENIED)
    if target.recall_seq:
        return RecallResult(RecallStatus.ALREADY, target.recall_seq)
    if not is_client_msg_type(target.msg_type) or now_ms - target.server_ms > window_ms:
        return RecallResult(RecallStatus.DENIED)
    return None


def recall_content(seq: int) -> bytes:
    """The content of the RECALL message that recalls message `seq`."""
    content: bytes = msgpack.packb([seq])
    return content


# -- unread ------------------------------------------------------------------------------


def counts_as_unread(msg_type: int) -> bool:
    """Whether a message of this type from someone else counts as unread."""
    return is_client_msg_type(msg_type)


def unread_types_sql(column: str = "msg_type") -> str:
    """`counts_as_unread` as a SQL condition on `column` (MySQL and SQLite alike)."""
    ranges = " OR ".join(f"{column} BETWEEN {lo:d} AND {hi:d}" for lo, hi in CLIENT_MSG_TYPES)
    return f"({ranges})"


UNREAD_TYPES_SQL: Final = unread_types_sql()


@dataclass(frozen=True, slots=True)
class UnreadRun:
    """The messages of one sender in one archived batch that count as unread: `n` of
    them, seqs `first`..`last`, every one of them in `seqs` (`pack_seqs`)."""

    sender_uid: int
    n: int
    first: int
    last: int
    seqs: bytes


def pack_seqs(seqs: Sequence[int]) -> bytes:
    """Ascending seqs as msgpack: the first, then each one's distance from the one
    before (one byte each while a sender's messages are under 128 apart)."""
    packed: bytes = msgpack.packb([seqs[0], *(b - a for a, b in itertools.pairwise(seqs))])
    return packed


def unpack_seqs(packed: bytes) -> list[int]:
    out: list[int] = []
    seq = 0
    for step in msgpack.unpackb(packed):
        seq += step
        out.append(seq)
    return out


def unread_runs(msgs: Iterable[StoredMessage]) -> list[UnreadRun]:
    """What an archived batch leaves for unread counts: one run per sender of the
    messages that count (`counts_as_unread`, as archived: a recalled one is a RECALL and
    does not), by sender uid."""
    by_sender: dict[int, list[int]] = {}
    for m in msgs:
        if counts_as_unread(m.msg_type):
            by_sender.setdefault(m.sender_uid, []).append(m.seq)
    runs = []
    for sender, seqs in sorted(by_sender.items()):
        seqs.sort()
        runs.append(UnreadRun(sender, len(seqs), seqs[0], seqs[-1], pack_seqs(seqs)))
    return runs


def count_in_runs(runs: Iterable[tuple[int, int, int, bytes]], after: int, upto: int) -> int:
    """How many messages of the runs `(n, first, last, seqs)` lie in (after, upto]: the
    caller gives the runs of the senders that count (not the reader). A run wholly
    inside counts without unpacking its seqs."""
    total = 0
    for n, first, last, seqs in runs:
        if first > after and last <= upto:
            total += n
        elif last > after and first <= upto:
            total += sum(after < s <= upto for s in unpack_seqs(seqs))
    return total
