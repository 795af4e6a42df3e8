"""`imgw archive status` shows the last run for people: times as UTC times, ages as
`--older-than` takes them, never a raw millisecond count."""

from __future__ import annotations

import re

import pytest

from gateway.cli.archive import age_text, last_run_text, parse_age

RUN = {
    "started_ms": "1796195256591",
    "finished_ms": "1796195258791",
    "to": "file:///var/lib/imgw/archive",
    "older_than_ms": str(30 * 86_400_000),
    "retention_ms": str(180 * 86_400_000),
    "rows": "300",
    "files": "3",
    "failures": "0",
}


def test_the_last_run_shows_times_and_ages() -> None:
    text = last_run_text(RUN)
    assert text.startswith(
        "started 2026-12-02 07:07:36 UTC, finished 2026-12-02 07:07:38 UTC (took 2.2 s), "
    )
    assert "older_than=30d" in text and "retention=180d" in text and "rows=300" in text
    assert not re.search(r"_ms=|\d{10,}", text), text


def test_a_run_cut_short_or_without_an_age_still_reads() -> None:
    text = last_run_text({"started_ms": "1796195256591", "older_than_ms": "None"})
    assert text == "started 2026-12-02 07:07:36 UTC, older_than_ms=None"


@pytest.mark.parametrize("age", ["0s", "500ms", "90s", "30m", "12h", "180d"])
def test_ages_read_back_as_written(age: str) -> None:
    assert age_text(parse_age(age)) == age
