"""The group commit of a send batch on MySQL, and the idempotency records it reads.

Seqs are allocated inside the committing transaction, under the row lock of the
conversation's `im_conv_seq` row (`SELECT … FOR UPDATE`, then `max_seq` written back
before the commit). The lock is held until commit, so within a conversation seqs follow
commit order exactly, and a rolled-back transaction gives its seqs back: no seq is
issued twice and a reader that has seen seq n never later finds a committed seq below n
it did not see. Which messages are stored and how each is answered is
`storage.rules.plan_append`'s decision.

An ERROR must never cover a stored message: when a COMMIT goes unanswered, its server
thread is fenced and the records are read back to learn whether it landed; if that
cannot be learnt, `StoreOutcomeUnknown`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from storage.archive.index_sqlite import SENT_SQL
from storage.errors import StoreOutcomeUnknown, StoreUnavailable
from storage.models import AppendResult, NewMessage, StoredMessage
from storage.mysql import sql
from storage.mysql.outbox import MySQLOutbox
from storage.mysql.outbox import insert_row as outbox_sql
from storage.mysql.transactions import (
    CommitWatch,
    Cursor,
    Row,
    Transactions,
    execute_and_commit,
    next_rows,
)
from storage.rules import SendKey, append_results, plan_append, resend_result
from storage.snowflake import Snowflake

TableOf = Callable[[int], str]  # the message table (shard) of a conversation


async def find_sent_in(
    cur: Cursor, keys: Sequence[SendKey], table_of: TableOf
) -> dict[SendKey, StoredMessage]:
    if not keys:
        return {}
    await cur.execute(sql.find_sent(keys))
    return await load_sent(cur, await cur.fetchall(), table_of)


async def load_sent(
    cur: Cursor, rows: Sequence[Row], table_of: TableOf
) -> dict[SendKey, StoredMessage]:
    """The messages of idempotency records (sender, client_msg_id, conv_id, seq):
    one round trip each, which only resends pay."""
    found: dict[SendKey, StoredMessage] = {}
    for sender, cmid, conv_id, seq in rows:
        await cur.execute(
            f"SELECT {sql.MSG_COLS} FROM {table_of(int(conv_id))} "
            f"WHERE conv_id={int(conv_id)} AND seq={int(seq)}"
        )
        row = await cur.fetchone()
        if row is None:  # archived within the idempotency window (storage/archive)
            await cur.execute(SENT_SQL.format(p="%s"), (int(sender), bytes(cmid)))
            row = await cur.fetchone()
        if row is not None:
            found[(int(sender), bytes(cmid).decode())] = sql.message_of(row)
    return found


class GroupCommit:
    """`append` of the MySQL store."""

    def __init__(
        self,
        db: Transactions,
        table_of: TableOf,
        ids: Snowflake,
        clock: Callable[[], int],
        outbox: MySQLOutbox,
    ) -> None:
        self._db = db
        self._table_of = table_of
        self._ids = ids
        self._clock = clock
        self._outbox = outbox
        self.hook_node = ""  # set: each stored message gets a hook row (storage/hooks.py)

    async def append(self, batch: Sequence[NewMessage]) -> list[AppendResult]:
        attempt_ms: list[int] = []  # the commit time of the last attempt
        watch = CommitWatch()  # whether the last attempt's COMMIT went unanswered

        async def body(cur: Cursor) -> list[AppendResult]:
            # Two round trips: [BEGIN; idempotency records; lock the seq rows; current
            # members], [seqs; one INSERT per shard; idempotency records; COMMIT].
            now = self._clock()
            attempt_ms[:] = [now]
            keys = list({(m.sender_uid, m.client_msg_id) for m in batch})
            convs = {m.conv_id for m in batch}
            await cur.execute(
                ";".join(
                    ("BEGIN", sql.find_sent(keys), sql.lock_seqs(convs), sql.current_members(convs))
                )
            )
            sent_rows = await next_rows(cur)
            top = {int(c): int(m) for c, m in await next_rows(cur)}
            members: dict[int, list[int]] = defaultdict(list)
            for c, u in await next_rows(cur):
                members[int(c)].append(int(u))
            prior = await load_sent(cur, sent_rows, self._table_of) if sent_rows else {}
            plan = plan_append(batch, prior, members)
            stored: dict[int, StoredMessage] = {}
            for i in plan.store:
                m = batch[i]
                top[m.conv_id] += 1
                stored[i] = StoredMessage(
                    m.conv_id, top[m.conv_id], self._ids.next_id(now), m.sender_uid,
                    m.msg_type, m.content, now, m.client_msg_id,
                )  # fmt: skip
            outbox_id = 0
            queries: list[str] = []
            if stored:
                msgs = list(stored.values())
                statements = [
                    sql.set_seqs({m.conv_id: top[m.conv_id] for m in msgs}, now),
                    *sql.insert_sharded(msgs, self._table_of),
                ]
                if hook_node := self.hook_node:  # the hooks owed, in the same commit
                    statements.append(sql.insert_hooks(msgs, hook_node))
                statements.append(sql.insert_sent(msgs, now))
                if node := self._outbox.node:  # the fan-out owed, in the same commit
                    outbox_id = self._ids.next_id(now)
                    statements.append(outbox_sql(outbox_id, node, msgs, now))
                queries = sql.queries(statements)  # one, unless the batch is huge
            for query in queries[:-1]:
                await cur.execute(query)
                while await cur.nextset():  # each statement's result; errors raise
                    pass
            await execute_and_commit(cur, queries[-1] if queries else "", watch)
            return append_results(batch, plan, prior, stored, members, outbox_id=outbox_id)

        try:
            return await self._db.run(body, own_tx=True, commits=True, watch=watch)
        except StoreUnavailable as failure:
            # An ERROR must never cover a stored message. A COMMIT sent without an answer
            # may still land (a packet held up in the network reaches the server later):
            # fence its server thread first, then ask what landed.
            try:
                if watch.unanswered and watch.thread_id:
                    await self._db.fence(watch.thread_id)
                landed = await self._landed(batch, attempt_ms[0] if attempt_ms else -1)
            except StoreUnavailable as e:
                if watch.unanswered:
                    raise StoreOutcomeUnknown(
                        f"MySQL did not answer a COMMIT and cannot be asked whether it "
                        f"landed ({failure}; then {e})"
                    ) from failure
                raise failure from None  # no COMMIT was sent: nothing can land
            if landed is None:
                raise failure from None
            return landed

    async def _landed(
        self, batch: Sequence[NewMessage], attempt_ms: int
    ) -> list[AppendResult] | None:
        """After a failure, once no COMMIT of it can land any more, ask what did: the
        results if the commit landed (stored messages answered as DUPLICATE: acked, not
        pushed — receivers pull them), None if it did not. StoreUnavailable if MySQL
        cannot be asked."""
        keys = list({(m.sender_uid, m.client_msg_id) for m in batch})
        found = await self._db.run(lambda cur: find_sent_in(cur, keys, self._table_of), tx=False)
        if not any(m.server_ms == attempt_ms for m in found.values()):
            return None  # nothing carries this attempt's commit time: it did not commit
        # not found: refused in that commit (NOT_MEMBER)
        return [resend_result(m, found.get((m.sender_uid, m.client_msg_id))) for m in batch]
