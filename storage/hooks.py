"""Hook rows: the webhooks and push events each stored message is owed, kept durably.

Once a node turns hooks on (`ChatStore.set_hook_node`), every transaction that stores
a message (a send batch's group commit, a system message of a group's creation, its
membership or title changes, a recall) also writes one `im_hook` row per stored
message, in the same transaction: (conv_id, seq, node, created_ms). So a message in
history is also recorded as owed, and nothing is recorded that was not stored. The node
delivers the rows (`hooks_of`, oldest first) and deletes them once the sink has
acknowledged them (`hooks_done`); what is left when it dies is delivered by the same
node id after its restart, or by a survivor that re-tags the dead node's rows as its own
(`hooks_adopt`). Deliveries may repeat (a node killed between the sink's answer and the
delete delivers again): sinks dedup by (conv_id, seq).

With hooks off (the default, node "") nothing is written and the commit path does no
more than test a string.

On MySQL with several message servers a hook row lives on the server whose transaction
stored the message, beside it; the reads ask every server and merge.

Index: the primary key (conv_id, seq) for `hooks_done`, and (node, created_ms) for
`hooks_of` (its order, created_ms then the primary key, is the index's own) and
`hooks_adopt`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from storage.models import HookRow, StoredMessage

# hooks_backlog counts at most this many rows (a bounded walk of the node index): a
# backlog this large reads as this number. Its oldest created_ms is exact.
HOOK_BACKLOG_CAP: Final = 100_000
DONE_KEYS_PER_QUERY: Final = 1_000  # hooks_done deletes this many keys per statement
ADOPT_ROWS_PER_QUERY: Final = 5_000  # hooks_adopt re-tags this many rows per statement


def hook_values(msgs: Sequence[StoredMessage], node: str) -> list[tuple[int, int, str, int]]:
    """The (conv_id, seq, node, created_ms) rows of `msgs`: created_ms is the message's
    server_ms, the time of the transaction that stores it."""
    return [(m.conv_id, m.seq, node, m.server_ms) for m in msgs]


def oldest_first(rows: Sequence[HookRow], limit: int) -> list[HookRow]:
    """The first `limit` of `rows` (several servers' pages) in `hooks_of` order."""
    return sorted(rows, key=lambda r: (r.created_ms, r.conv_id, r.seq))[:limit]


def batches(keys: Sequence[tuple[int, int]], size: int) -> list[list[tuple[int, int]]]:
    """`keys` deduplicated, in batches of at most `size`."""
    unique = list(dict.fromkeys((int(c), int(s)) for c, s in keys))
    return [unique[i : i + size] for i in range(0, len(unique), size)]
