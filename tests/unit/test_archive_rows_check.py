"""An archive file is believed only when its rows are what its index row says
(storage/archive/objects.py: `check_rows`), and a file that is not is logged, a line
per problem a minute (storage/archive/tiered.py)."""

from __future__ import annotations

from typing import Any

import pytest

from storage.archive import objects, tiered
from storage.archive.index_sqlite import ArchivedMessage, ArchiveFile
from storage.models import StoredMessage


def rows(conv_id: int, seqs: range | list[int]) -> list[ArchivedMessage]:
    return [
        ArchivedMessage(StoredMessage(conv_id, s, 1000 + s, 7, 1, b"x", 1, f"m{s}"), 0)
        for s in seqs
    ]


FILE = ArchiveFile(1, 300, "file:///a", "conv_id=5/1-300.parquet", conv_id=5, n_rows=300)


def test_the_rows_the_index_names_pass() -> None:
    objects.check_rows(FILE, rows(5, range(1, 301)))


@pytest.mark.parametrize(
    ("found", "problem"),
    [
        (rows(6, range(1, 301)), "holds rows of conversation 6"),  # another conversation's
        (rows(5, range(1, 151)), "150 rows, the index says 300"),  # truncated
        (rows(5, range(151, 301)), "150 rows, the index says 300"),
        (rows(5, range(2, 302)), "holds seqs 2-301"),  # another range of the same one
        (rows(5, [1, 1, *range(3, 301)]), "a seq appears twice"),
        (rows(5, range(1, 300)) + rows(9, [300]), "holds rows of conversation 9"),
        ([], "0 rows, the index says 300"),
    ],
)
def test_anything_else_is_a_mismatch(found: list[ArchivedMessage], problem: str) -> None:
    found.sort(key=lambda a: a.msg.seq)
    with pytest.raises(objects.ArchiveMismatch, match=problem):
        objects.check_rows(FILE, found)


class Log:
    def __init__(self) -> None:
        self.errors: list[tuple[str, dict[str, Any]]] = []

    def error(self, event: str, **kw: Any) -> None:
        self.errors.append((event, kw))


def test_a_mismatch_is_logged_once_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    log = Log()
    monkeypatch.setattr(tiered, "log", log)
    monkeypatch.setattr(tiered, "_mismatch_logged", {})
    clock = [100.0]
    monkeypatch.setattr(tiered.time, "monotonic", lambda: clock[0])
    for _ in range(5):
        tiered._log_mismatch("file k: 150 rows, the index says 300")
    tiered._log_mismatch("file j: holds rows of conversation 6")
    assert [kw["problem"] for _, kw in log.errors] == [
        "file k: 150 rows, the index says 300",
        "file j: holds rows of conversation 6",
    ]
    clock[0] += 61
    tiered._log_mismatch("file k: 150 rows, the index says 300")
    assert len(log.errors) == 3
    assert log.errors[0][0] == "archive file does not match its index row; not served"
