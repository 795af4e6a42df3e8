"""A history checker for runs with faults (node kills, bus outages, drains).

Every send is recorded as invoked and then as acked (with its seq), failed (a definite
ERROR: it must never become visible) or unknown (the outcome was never learnt). Every
message an app received on `Client.incoming()` is recorded per receiver. After
quiescence, `check` verifies the invariants of docs/architecture.md against the
receipts and against the store as read back with PULL:

- no acked message lost: each is stored at its acked seq with its content;
- no message visible twice to a receiver;
- no failed send visible (stored, or received by anyone);
- per conversation, seqs are never reused (one message per (conv, seq)) and one
  sender's sends, made one after another, got strictly increasing seqs;
- every acked message reached every member of its conversation, by push or pull.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Literal

from gateway.client import Client, ClientError
from protocol.frames import MsgRecord, Push, SyncHint

Outcome = Literal["pending", "acked", "failed", "unknown"]


@dataclass
class SendRecord:
    sender: int
    conv_id: int
    content: bytes
    outcome: Outcome = "pending"
    seq: int = 0
    error: str = ""


@dataclass
class History:
    members: dict[int, set[int]] = field(default_factory=dict)  # conv_id -> uids
    sends: list[SendRecord] = field(default_factory=list)
    received: dict[int, list[tuple[int, int, bytes]]] = field(
        default_factory=lambda: defaultdict(list)
    )  # uid -> [(conv_id, seq, content)]
    hints: Counter[int] = field(default_factory=Counter)  # uid -> SYNC_HINTs received

    async def send(self, client: Client, conv_id: int, content: bytes) -> SendRecord:
        rec = SendRecord(client.uid, conv_id, content)
        self.sends.append(rec)
        try:
            ack = await client.send(conv_id, content)
        except ClientError as e:
            # Code 0 (connection lost, timeout after every retry) leaves the outcome
            # unknown; an ERROR from the server is a definite failure.
            rec.outcome = "failed" if e.code else "unknown"
            rec.error = str(e)
        else:
            rec.outcome, rec.seq = "acked", ack.seq
        return rec

    async def receive(self, client: Client) -> None:
        """Record what `client`'s app receives, until cancelled or the session ends."""
        with contextlib.suppress(ClientError):
            async for event in client.incoming():
                if isinstance(event, Push):
                    self.received[client.uid].append((event.conv_id, event.seq, event.content))
                elif isinstance(event, SyncHint):
                    self.hints[client.uid] += 1

    def acked(self) -> list[SendRecord]:
        return [s for s in self.sends if s.outcome == "acked"]

    def check(self, stored: dict[int, list[MsgRecord]]) -> dict[str, int]:
        """Assert every invariant; `stored` is every conversation read back with PULL.
        Returns counts for the test's report."""
        ours = {s.content for s in self.sends}
        by_content = {m.content: (conv, m.seq) for conv, msgs in stored.items() for m in msgs}
        # Seqs are never reused: one message per (conv, seq), and increasing in storage.
        for conv, msgs in stored.items():
            seqs = [m.seq for m in msgs]
            assert seqs == sorted(set(seqs)), f"conv {conv}: seqs reused or out of order"
        # No acked message lost.
        for s in self.acked():
            assert by_content.get(s.content) == (s.conv_id, s.seq), f"acked send lost: {s}"
        # No failed send visible.
        failed = {s.content for s in self.sends if s.outcome == "failed"}
        assert not failed & by_content.keys(), "a failed send was stored"
        # One sender's sequential sends to one conversation: strictly increasing seqs.
        per_sender: dict[tuple[int, int], list[int]] = defaultdict(list)
        for s in self.acked():
            per_sender[(s.sender, s.conv_id)].append(s.seq)
        for key, seqs in per_sender.items():
            assert seqs == sorted(set(seqs)), f"sender/conv {key}: seqs not increasing"
        # Receivers: nothing twice, nothing failed, the right seq, and everything acked.
        for uid, got in self.received.items():
            mine = [(c, q, b) for c, q, b in got if b in ours]
            dupes = [k for k, n in Counter((c, q) for c, q, _ in mine).items() if n > 1]
            assert not dupes, f"uid {uid} saw {dupes[:5]} more than once"
            for conv, seq, content in mine:
                assert content not in failed, f"uid {uid} saw a failed send"
                assert by_content.get(content) == (conv, seq), f"uid {uid}: wrong seq"
        for s in self.acked():
            for uid in self.members[s.conv_id]:
                if uid == s.sender:
                    continue  # its own connection got the ack, not a PUSH
                have = {(c, q) for c, q, _ in self.received.get(uid, ())}
                assert (s.conv_id, s.seq) in have, f"uid {uid} never got {s}"
        outcomes = Counter(s.outcome for s in self.sends)
        return {"sends": len(self.sends), **outcomes}


async def read_back(client: Client, conv_ids: list[int]) -> dict[int, list[MsgRecord]]:
    """Every stored message of `conv_ids`, read with PULL by a member."""
    out = {}
    for conv in conv_ids:
        out[conv] = await client.pull_all(conv)
    return out


async def quiesce(clients: list[Client], *, settle_s: float = 1.0) -> None:
    """Let pushes in flight land, then have every client run a catch-up pass (what its
    next reconnect or SYNC_HINT would do), then let those land."""
    await asyncio.sleep(settle_s)
    await asyncio.gather(*(c.wait_connected() for c in clients))
    await asyncio.gather(*(c.catch_up() for c in clients))
    await asyncio.sleep(0.2)
