"""The change log of a shard move (`imgw db add-server`, storage/mysql/move.py).

While shards move off server S, triggers on S's tables write one `im_shard_change` row
for every row of a moving shard that a transaction inserts, updates or deletes: the
row's table and primary key, in that transaction (a trigger runs inside the statement
that fired it), so a change commits exactly when its log row does. `apply` takes a
batch of log rows in id order, reads each logged row's current version on S, writes it
to the new server N (deletes it there when S has it no more) and deletes the log rows it
applied. Log ids are auto-increment, allocated at insert and so committed out of order:
`apply` never keeps a high-water mark, it deletes exactly the rows it read, and a row
that commits later with a lower id is simply in a later batch. The current version is
read after the log row, so whatever it misses (a change committed in between) left a
log row of its own that a later batch applies.

The triggers exist only while a move runs: created when the move starts, dropped once
the shards are frozen and the log drained. `CREATE TRIGGER` waits for every transaction
that already used the table (it takes the table's metadata lock), so from the moment it
returns, every commit that writes the table fires it: no gateway has to learn that a
move is under way, and the send path costs nothing when none is. During a move each
write to one of S's shard tables pays the trigger: an INSERT of a small row when the
row is of a moving shard, a `MOD` test otherwise. Creating triggers needs the TRIGGER
privilege (and with binary logging on, SUPER or `log_bin_trust_function_creators=1`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from asyncmy.cursors import Cursor

CHANGES_DDL: Final = """CREATE TABLE IF NOT EXISTS im_shard_change (
    id  BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    tbl VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    k1  BIGINT UNSIGNED NOT NULL,
    k2  BIGINT UNSIGNED NOT NULL DEFAULT 0,
    k3  BIGINT UNSIGNED NOT NULL DEFAULT 0,
    ks  VARBINARY(64) NOT NULL DEFAULT ''
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

# A table's primary key columns and the log columns (slots) that hold them.
Key = tuple[tuple[str, str], ...]
MESSAGE_KEY: Final[Key] = (("id", "k1"),)
# The tables whose rows of a conversation live on the server of its shard, besides its
# messages; each has a conv_id column (which shard a row is of).
COLOCATED_KEYS: Final[dict[str, Key]] = {
    "im_conversation": (("conv_id", "k1"),),
    "im_conv_seq": (("conv_id", "k1"),),
    "im_conv_member": (("conv_id", "k1"), ("uid", "k2")),
    "im_send_dedup": (("sender_uid", "k1"), ("client_msg_id", "ks")),
    "im_delivered": (("uid", "k1"), ("device", "ks"), ("conv_id", "k2")),
    "im_archive": (("conv_id", "k1"), ("seq_lo", "k2")),  # the archive index travels too
    "im_archive_sent": (("sender_uid", "k1"), ("client_msg_id", "ks")),
    "im_archive_unread": (("conv_id", "k1"), ("seq_hi", "k2"), ("sender_uid", "k3")),
}
COLOCATED: Final = tuple(COLOCATED_KEYS)
# Keys a statement looks up: an IN list this short stays a primary key lookup per key
# (MariaDB turns a list of 1,000 values or more into a join with a table of them, which
# its planner may read against the whole table).
KEYS_PER_QUERY: Final = 100
_EVENTS: Final = (("INSERT", "NEW", "ins"), ("UPDATE", "NEW", "upd"), ("DELETE", "OLD", "del"))


def key_of(table: str) -> Key:
    return MESSAGE_KEY if table.startswith("im_message_") else COLOCATED_KEYS[table]


def shard_filter(shards: Sequence[int], total: int, row: str = "") -> str:
    """SQL true for a row of one of `shards` (of `total`); `row`: `NEW.`, `OLD.`."""
    return f"MOD({row}conv_id, {int(total):d}) IN ({','.join(str(int(i)) for i in shards)})"


def trigger_names(table: str) -> list[str]:
    return [f"imgw_move_{table}_{tag}" for _, _, tag in _EVENTS]


def triggers(table: str, shards: Sequence[int], total: int) -> list[str]:
    """The CREATE TRIGGER statements logging `table`'s changes of rows of `shards`
    (a message table: all of its rows). Primary keys are never updated by the store
    (a REPLACE is a delete and an insert), so an update logs the new row's key."""
    key = key_of(table)
    slots = ", ".join(slot for _, slot in key)
    out = []
    for (event, row, _), name in zip(_EVENTS, trigger_names(table), strict=True):
        values = ", ".join(f"{row}.{col}" for col, _ in key)
        where = "" if key is MESSAGE_KEY else " WHERE " + shard_filter(shards, total, f"{row}.")
        out.append(
            f"CREATE TRIGGER {name} AFTER {event} ON {table} FOR EACH ROW "
            f"INSERT INTO im_shard_change (tbl, {slots}) SELECT '{table}', {values} "
            f"FROM DUAL{where}"
        )
    return out


def keyed(cols: Sequence[str], n: int) -> str:
    """`(a, b) IN ((%s,%s),...)` for `n` keys of columns `cols`."""
    one = "(" + ",".join(["%s"] * len(cols)) + ")"
    if len(cols) == 1:
        return f"{cols[0]} IN ({','.join(['%s'] * n)})"
    return f"({', '.join(cols)}) IN ({','.join([one] * n)})"


def _norm(value: object) -> object:
    """A key value as both sides compare it: the log keeps strings as bytes."""
    return value.encode() if isinstance(value, str) else value


class ChangeLog:
    """Applies S's change log to N."""

    def __init__(self, src: Cursor, dst: Cursor) -> None:
        self._src = src
        self._dst = dst
        # the name a table has on S now, where not its own (a message table is renamed
        # when its shard freezes)
        self.source: dict[str, str] = {}
        self._columns: dict[str, list[str]] = {}
        self.applied = 0  # log rows applied

    async def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            await self._src.execute(f"SELECT * FROM {self.source.get(table, table)} LIMIT 0")
            self._columns[table] = [d[0] for d in self._src.description or ()]
            await self._src.fetchall()
        return self._columns[table]

    async def lag(self, cap: int) -> int:
        """Log rows not applied yet, up to `cap` (a bounded count)."""
        await self._src.execute(
            f"SELECT COUNT(*) FROM (SELECT 1 FROM im_shard_change LIMIT {int(cap):d}) AS behind"
        )
        row = await self._src.fetchone()
        return int(row[0]) if row else 0

    async def apply(self, limit: int) -> int:
        """Apply the oldest `limit` log rows at most; how many there were."""
        await self._src.execute(
            "SELECT id, tbl, k1, k2, k3, ks FROM im_shard_change ORDER BY id LIMIT %s", (limit,)
        )
        logged = list(await self._src.fetchall())
        if not logged:
            return 0
        by_table: dict[str, dict[tuple[object, ...], None]] = {}
        for _, tbl, k1, k2, k3, ks in logged:
            slot = {"k1": int(k1), "k2": int(k2), "k3": int(k3), "ks": bytes(ks)}
            by_table.setdefault(str(tbl), {})[tuple(slot[s] for _, s in key_of(str(tbl)))] = None
        for table, keys in by_table.items():
            await self._copy_keys(table, list(keys))
        for i in range(0, len(logged), KEYS_PER_QUERY):
            ids = ",".join(str(int(r[0])) for r in logged[i : i + KEYS_PER_QUERY])
            await self._src.execute(f"DELETE FROM im_shard_change WHERE id IN ({ids})")
        self.applied += len(logged)
        return len(logged)

    async def _copy_keys(self, table: str, keys: Sequence[tuple[object, ...]]) -> None:
        """Make N's rows of `keys` what S's are now."""
        for i in range(0, len(keys), KEYS_PER_QUERY):
            await self._copy_some(table, keys[i : i + KEYS_PER_QUERY])

    async def _copy_some(self, table: str, keys: Sequence[tuple[object, ...]]) -> None:
        pk = [col for col, _ in key_of(table)]
        cols = await self.columns(table)
        at = [cols.index(c) for c in pk]
        params = [v for k in keys for v in k]
        # forced: on a small table MariaDB would rather read it all
        await self._src.execute(
            f"SELECT {', '.join(cols)} FROM {self.source.get(table, table)} "
            f"FORCE INDEX (PRIMARY) WHERE {keyed(pk, len(keys))}",
            params,
        )
        rows = list(await self._src.fetchall())
        if rows:
            await self._dst.executemany(
                f"REPLACE INTO {table} ({', '.join(cols)}) "
                f"VALUES ({', '.join(['%s'] * len(cols))})",
                rows,
            )
        found = {tuple(_norm(r[i]) for i in at) for r in rows}
        await delete_keys(self._dst, table, [k for k in keys if k not in found])


async def delete_keys(cur: Cursor, table: str, keys: Sequence[Sequence[object]]) -> None:
    """Delete `table`'s rows of primary keys `keys`: a statement each (a DELETE takes no
    index hint, and of a list of keys MariaDB may read a small table whole; rows go
    only when S deleted them, e.g. by archiving or pruning, or when a move clears N)."""
    pk = [col for col, _ in key_of(table)]
    cond = " AND ".join(f"{col} = %s" for col in pk)
    for key in keys:
        await cur.execute(f"DELETE FROM {table} WHERE {cond}", list(key))
