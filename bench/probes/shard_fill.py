"""Fill message shards of a MySQL store straight through its tables, fast: p2p
conversations of `per_conv` messages each, their conversation, seq and member rows, a
delivered cursor per member, the messages and their idempotency records, in multi-row
INSERTs. Only conversations of the shards named are made (conv_ids above the highest
in use), in the metadata database: the single-server layout, a store's before its
first `imgw db add-server`. Used by bench.probes.shard_move and its test.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import asyncmy

from protocol.ops import ConvKind, MsgType
from storage.mysql import MySQLSettings
from storage.mysql.schema import message_table
from storage.mysql.sql import row

FILL_UID0: Final = 8_000_000_000_000  # far from the bench's and tests' own uids
DEVICE: Final = "phone"
ROWS_PER_INSERT: Final = 1000
CHUNK: Final = 20_000  # messages a transaction


@dataclass(frozen=True)
class Filled:
    convs: list[int]
    messages: int


def _members(j: int) -> tuple[int, int]:
    return FILL_UID0 + 2 * j, FILL_UID0 + 2 * j + 1


async def fill(
    url: str,
    shards: Sequence[int],
    messages: int,
    *,
    per_conv: int = 100,
    size: int = 100,
    log: Callable[[str], None] = print,
) -> Filled:
    """`messages` messages of `size` bytes in new conversations of `shards`."""
    s = MySQLSettings.from_url(url)
    conn = await asyncmy.connect(
        host=s.host, port=s.port, user=s.user, password=s.password, db=s.database,
        autocommit=False, charset="utf8mb4",
    )  # fmt: skip
    try:
        async with conn.cursor() as cur:

            async def insert(head: str, rows: list[str]) -> None:
                for i in range(0, len(rows), ROWS_PER_INSERT):
                    await cur.execute(head + ",".join(rows[i : i + ROWS_PER_INSERT]))

            await cur.execute("SELECT value FROM im_meta WHERE name='shards'")
            total = int((await cur.fetchone())[0])
            await cur.execute("SELECT COALESCE(MAX(conv_id), 0) FROM im_conversation")
            c = int((await cur.fetchone())[0])
            n_convs = -(-messages // per_conv)
            convs: list[int] = []
            while len(convs) < n_convs:
                c += 1
                if c % total in shards:
                    convs.append(c)
            counts = [min(per_conv, messages - j * per_conv) for j in range(n_convs)]
            now = int(time.time() * 1000)
            for lo in range(0, n_convs, CHUNK):
                part = range(lo, min(n_convs, lo + CHUNK))
                await insert(
                    "INSERT INTO im_conversation (conv_id, kind, p2p_lo, p2p_hi, created_ms) "
                    "VALUES ",
                    [row((convs[j], int(ConvKind.P2P), *_members(j), now)) for j in part],
                )
                await insert(
                    "INSERT INTO im_conv_seq (conv_id, reserved_seq, max_seq, last_active_ms) "
                    "VALUES ",
                    [row((convs[j], counts[j], counts[j], now)) for j in part],
                )
                await insert(
                    "INSERT INTO im_conv_member (conv_id, uid, pos, joined_seq, read_seq, "
                    "updated_ms) VALUES ",
                    [
                        row((convs[j], uid, pos, 1, max(0, counts[j] - 3), now))
                        for j in part
                        for pos, uid in enumerate(_members(j))
                    ],
                )
                await insert(
                    "INSERT INTO im_delivered (uid, device, conv_id, seq, updated_ms) VALUES ",
                    [
                        row((uid, DEVICE.encode(), convs[j], counts[j], now))
                        for j in part
                        for uid in _members(j)
                    ],
                )
            await conn.commit()
            pad = b"x" * max(0, size - 24)
            t0 = last = time.monotonic()
            done = 0
            msg_id = 0
            batch_msgs: dict[int, list[str]] = {}
            batch_dedup: list[str] = []

            async def flush() -> None:
                for shard, rows in batch_msgs.items():
                    await insert(
                        f"INSERT INTO {message_table(shard)} (conv_id, seq, id, sender_uid, "
                        "msg_type, content, send_ms, client_msg_id) VALUES ",
                        rows,
                    )
                await insert(
                    "INSERT INTO im_send_dedup (sender_uid, client_msg_id, conv_id, seq, "
                    "created_ms) VALUES ",
                    batch_dedup,
                )
                await conn.commit()
                batch_msgs.clear()
                batch_dedup.clear()

            for j, conv in enumerate(convs):
                a, b = _members(j)
                for seq in range(1, counts[j] + 1):
                    msg_id += 1
                    sender = a if seq % 2 else b
                    cmid = b"fill.%d.%d" % (conv, seq)
                    content = b"fill %d/%d " % (conv, seq) + pad
                    batch_msgs.setdefault(conv % total, []).append(
                        row((conv, seq, msg_id, sender, int(MsgType.TEXT), content, now, cmid))
                    )
                    batch_dedup.append(row((sender, cmid, conv, seq, now)))
                done += counts[j]
                if len(batch_dedup) >= CHUNK:
                    await flush()
                    if time.monotonic() - last >= 5:
                        last = time.monotonic()
                        rate = done / (last - t0)
                        log(f"fill: {done:,}/{messages:,} messages ({rate:,.0f}/s)")
            await flush()
            tables = ["im_conversation", "im_conv_member", "im_conv_seq", "im_delivered",
                      "im_send_dedup", *(message_table(i) for i in shards)]  # fmt: skip
            await cur.execute(f"ANALYZE TABLE {', '.join(tables)}")
            await cur.fetchall()
    finally:
        conn.close()
    return Filled(convs, messages)
