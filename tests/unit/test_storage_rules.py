"""Append, recall and unread rules as pure functions (both stores call them): no services."""

from __future__ import annotations

import sqlite3

import msgpack

from protocol.ops import CLIENT_MSG_TYPES, MsgType, is_client_msg_type
from storage.models import AppendStatus, NewMessage, RecallStatus, StoredMessage
from storage.mysql import sql
from storage.rules import (
    UNREAD_TYPES_SQL,
    RecallTarget,
    append_results,
    counts_as_unread,
    plan_append,
    recall_content,
    recall_refusal,
    resend_result,
    unread_types_sql,
)

CONV, OTHER = 10, 11


def new(sender: int, cmid: str, conv: int = CONV, content: bytes = b"hi") -> NewMessage:
    return NewMessage(conv, sender, cmid, MsgType.TEXT, content)


def stored(m: NewMessage, seq: int) -> StoredMessage:
    return StoredMessage(
        m.conv_id, seq, 1000 + seq, m.sender_uid, m.msg_type, m.content, 5, m.client_msg_id
    )


def run(
    batch: list[NewMessage],
    sent: dict[tuple[int, str], StoredMessage],
    members: dict[int, list[int]],
) -> list[tuple[AppendStatus, int]]:
    """(status, seq of the message answered, 0 for none) per message of `batch`."""
    plan = plan_append(batch, sent, members)
    done = {i: stored(batch[i], n + 1) for n, i in enumerate(plan.store)}
    results = append_results(batch, plan, sent, done, members, outbox_id=7)
    for r in results:
        if r.status is AppendStatus.STORED:
            assert r.message is not None
            assert r.outbox_id == 7 and list(r.members) == members[r.message.conv_id]
        else:
            assert r.outbox_id == 0 and not r.members
    return [(r.status, r.message.seq if r.message else 0) for r in results]


def test_members_store_in_batch_order_and_others_are_refused() -> None:
    batch = [new(1, "a"), new(9, "b"), new(2, "c"), new(1, "d", conv=OTHER)]
    assert run(batch, {}, {CONV: [1, 2]}) == [
        (AppendStatus.STORED, 1),
        (AppendStatus.NOT_MEMBER, 0),
        (AppendStatus.STORED, 2),
        (AppendStatus.NOT_MEMBER, 0),  # no such conversation: no members
    ]


def test_a_send_stored_before_is_a_duplicate_or_a_conflict() -> None:
    before = stored(new(1, "a"), 40)
    sent = {(1, "a"): before}
    batch = [new(1, "a"), new(1, "a", content=b"other"), new(1, "a", conv=OTHER)]
    assert run(batch, sent, {CONV: [1]}) == [
        (AppendStatus.DUPLICATE, 40),
        (AppendStatus.CONFLICT, 0),
        (AppendStatus.CONFLICT, 0),
    ]
    # a resend is answered even if its sender has left since
    assert run([new(1, "a")], sent, {CONV: [2]}) == [(AppendStatus.DUPLICATE, 40)]


def test_a_key_twice_in_one_batch_is_stored_once() -> None:
    batch = [new(1, "a"), new(1, "a"), new(1, "a", content=b"x")]
    assert run(batch, {}, {CONV: [1]}) == [
        (AppendStatus.STORED, 1),
        (AppendStatus.DUPLICATE, 1),
        (AppendStatus.CONFLICT, 0),
    ]


def test_the_first_send_of_a_key_decides_for_the_batch() -> None:
    """A later send of a refused key is refused too, even to a conversation the sender
    is a member of (the first send of a key in a batch is the send it names)."""
    batch = [new(1, "a", conv=OTHER), new(1, "a"), new(1, "b")]
    assert run(batch, {}, {CONV: [1]}) == [
        (AppendStatus.NOT_MEMBER, 0),
        (AppendStatus.NOT_MEMBER, 0),
        (AppendStatus.STORED, 1),
    ]


def test_resend_result_after_an_unknown_commit() -> None:
    m = new(1, "a")
    assert resend_result(m, None).status is AppendStatus.NOT_MEMBER
    assert resend_result(m, stored(m, 3)).status is AppendStatus.DUPLICATE
    assert resend_result(m, stored(new(1, "a", content=b"z"), 3)).status is AppendStatus.CONFLICT


def test_a_recalled_original_compares_by_conversation_only() -> None:
    m = new(1, "a")
    recalled = StoredMessage(CONV, 3, 1003, 1, MsgType.RECALL, b"", 5, "a")
    assert resend_result(m, recalled).status is AppendStatus.DUPLICATE
    assert resend_result(new(1, "a", conv=OTHER), recalled).status is AppendStatus.CONFLICT


# -- recall ------------------------------------------------------------------------------

NOW, WINDOW = 1_000_000, 120_000


def refusal(target: RecallTarget | None, seq: int = 5, by: int = 1, min_seq: int = 1) -> object:
    r = recall_refusal(target, seq, by, now_ms=NOW, window_ms=WINDOW, min_seq=min_seq)
    return None if r is None else (r.status, r.recall_seq)


def test_recall_rule() -> None:
    mine = RecallTarget(1, MsgType.TEXT, NOW - WINDOW, 0)
    assert refusal(mine) is None  # at the window's edge: still allowed
    assert refusal(None) == (RecallStatus.NO_SUCH_MESSAGE, 0)
    assert refusal(mine, min_seq=6) == (RecallStatus.NO_SUCH_MESSAGE, 0)  # joined after it
    assert refusal(mine, by=2) == (RecallStatus.DENIED, 0)
    assert refusal(RecallTarget(1, MsgType.RECALL, NOW, 9)) == (RecallStatus.ALREADY, 9)
    assert refusal(RecallTarget(1, MsgType.TEXT, NOW - WINDOW - 1, 0)) == (RecallStatus.DENIED, 0)
    assert refusal(RecallTarget(1, MsgType.SYSTEM, NOW, 0)) == (RecallStatus.DENIED, 0)
    assert refusal(RecallTarget(1, 100, NOW, 0)) is None
    # another sender's recalled message: denied, not "already"
    assert refusal(RecallTarget(2, MsgType.RECALL, NOW, 9)) == (RecallStatus.DENIED, 0)


def test_recall_content_names_the_recalled_seq() -> None:
    assert msgpack.unpackb(recall_content(12345)) == [12345]


# -- unread ------------------------------------------------------------------------------


def test_unread_types_come_from_the_protocol() -> None:
    assert CLIENT_MSG_TYPES == ((1, 4), (100, 127))
    assert UNREAD_TYPES_SQL == "(msg_type BETWEEN 1 AND 4 OR msg_type BETWEEN 100 AND 127)"
    assert sql.UNREAD_TYPES == UNREAD_TYPES_SQL
    assert unread_types_sql("x.msg_type").startswith("(x.msg_type BETWEEN 1 AND 4")


def test_the_sql_condition_agrees_with_the_python_rule() -> None:
    db = sqlite3.connect(":memory:")
    try:
        rows = db.execute(
            "WITH RECURSIVE t(msg_type) AS (SELECT 0 UNION ALL SELECT msg_type + 1 FROM t "
            f"WHERE msg_type < 255) SELECT msg_type, {UNREAD_TYPES_SQL} FROM t"
        ).fetchall()
    finally:
        db.close()
    assert len(rows) == 256
    for msg_type, hit in rows:
        assert bool(hit) == counts_as_unread(msg_type) == is_client_msg_type(msg_type), msg_type


def test_the_server_writes_into_any_conversation_with_members_idempotently() -> None:
    batch = [new(0, "api-1"), new(0, "api-2", conv=OTHER), new(0, "api-1")]
    assert run(batch, {}, {CONV: [1, 2]}) == [
        (AppendStatus.STORED, 1),
        (AppendStatus.NOT_MEMBER, 0),  # no conversation (or nobody in it): refused
        (AppendStatus.DUPLICATE, 1),
    ]
