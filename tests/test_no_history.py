"""What users read speaks of the product as it is, not of how it was made.

The README, docs/*.md, bench/results/README.md, the comments, docstrings and help texts
of the packages, and `imgw --help` with every command's own must not refer to numbered
rounds of work ("session 4", "round 3"), issue numbers ("issue 16", "#12"), the source
articles the product came from ("the seeds"), or how the code was before ("as before",
"used to", "previously", "before this change", "the old default"). A reader has none of
these to look up; git holds the history. Write what is true now, and the reason where
one is needed ("the socket floor is 21-37 µs per message" rather than "round N found").

The patterns are precise so that product words pass, rather than having an allow-list:

- a client's login *session* is product vocabulary: only "session" followed by a number
  ("session 4", "sessions 10-12", "session-2 code") is flagged;
- "round trip" passes, and so does the bench's `--rounds 3` option: only "round N" in
  prose is flagged (write "the first round", "each of the three rounds" for an A/B's);
- "issue" followed by a number, and "#" followed by 1-4 digits standing alone ("(#12)"),
  are flagged; an HTML entity ("&#35;") or a "#" inside a word or path is not;
- "seed" is flagged as a word (the seeds were the source articles; "preloads" says what
  a bench does to a database), except a random seed: "--seed", "seed=", "rng.seed(",
  and any "seed" within 40 characters of "random", "rng", "hypothesis" or "derandomize";
- "used to" is flagged unless a form of *be* or *get* comes before it ("is used to",
  "was used to", "got used to"): those are the passive and the idiom, not the past
  habit. A reduced relative clause ("the key used to sign tokens") is flagged too; write
  "the key that signs tokens", which says the same more plainly;
- "before" alone is ordinary English ("before the commit", "before it is stored") and
  passes; "as before" and "before this change" are flagged.

Run `python tests/test_no_history.py` to list every hit (file:line and the phrase).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = ("protocol", "storage", "gateway", "bench")
HELP_KEYWORDS = frozenset({"help", "description", "epilog", "usage"})


@dataclass(frozen=True)
class Pattern:
    name: str
    regex: re.Pattern[str]
    unless_near: re.Pattern[str] | None = None  # not a hit when found within 40 characters


_BE = "is|are|be|been|being|was|were|get|gets|got|getting"
PATTERNS = (
    Pattern("a numbered session", re.compile(r"\b[Ss]essions?[\s-]+\d+")),
    Pattern("a numbered round", re.compile(r"(?<![-\w])[Rr]ounds?\s+\d+")),
    Pattern("an issue number", re.compile(r"\b[Ii]ssues?\s+#?\d+")),
    Pattern("an issue number", re.compile(r"(?<![&\w#/])#\d{1,4}\b")),
    Pattern(
        "the seeds",
        re.compile(r"(?<![-_.\w])[Ss]eeds?\b(?![_(]|\s*=)"),
        unless_near=re.compile(r"random|\brng\b|hypothesis|derandomi[sz]e", re.IGNORECASE),
    ),
    Pattern("as before", re.compile(r"\b[Aa]s\s+before\b")),
    Pattern("before this change", re.compile(r"\b[Bb]efore\s+(?:this|that|the)\s+change\b")),
    Pattern(
        "used to",
        re.compile("".join(rf"(?<!\b{w} )" for w in _BE.split("|")) + r"\b[Uu]sed\s+to\b"),
    ),
    Pattern("previously", re.compile(r"\b[Pp]reviously\b")),
    Pattern("the old default", re.compile(r"\bold\s+(?:default|way|behaviou?r)\b")),
)


@dataclass(frozen=True)
class Hit:
    where: str  # a path relative to the checkout, or "imgw COMMAND --help"
    line: int
    pattern: str
    phrase: str

    def __str__(self) -> str:
        return f"{self.where}:{self.line}: {self.pattern}: {self.phrase!r}"


def find(text: str, where: str, first_line: int = 1) -> Iterator[Hit]:
    """The hits in `text`, which starts at line `first_line` of `where`. A line break
    counts as a space, so a phrase wrapped over two lines is found too, but not one
    before a blank line or a numbered list's item ("## A session" over "1. Connect")."""
    flat = re.sub(r"\n(?=[ \t]*(?:\n|\d+\.\s))", "\x00", text)
    flat = re.sub(r"\s", " ", flat)
    for pattern in PATTERNS:
        for m in pattern.regex.finditer(flat):
            near = flat[max(0, m.start() - 40) : m.end() + 40]
            if pattern.unless_near is not None and pattern.unless_near.search(near):
                continue
            line = first_line + text.count("\n", 0, m.start())
            yield Hit(where, line, pattern.name, m.group())


def prose_files() -> Iterator[Path]:
    for name in ("README.md", "CONTRIBUTING.md", "bench/results/README.md"):
        if (ROOT / name).exists():
            yield ROOT / name
    yield from sorted((ROOT / "docs").glob("*.md"))


def python_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def python_prose(source: str) -> Iterator[tuple[str, int]]:
    """The prose of a module, each piece with its first line: runs of comments on
    consecutive lines (one piece, so a wrapped phrase is found), docstrings and other
    bare strings, and the help, description, epilog and usage strings of calls."""
    block: list[str] = []
    start = last = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        row = tok.start[0]
        if block and row != last + 1:
            yield "\n".join(block), start
            block = []
        if not block:
            start = row
        block.append(tok.string.lstrip("#"))
        last = row
    if block:
        yield "\n".join(block), start
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):
                yield node.value.value, node.lineno
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in HELP_KEYWORDS:
                    text = _literal_text(kw.value)
                    if text:
                        yield text, kw.value.lineno


def _literal_text(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = (_literal_text(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
        return "".join(parts)
    return ""


def help_pages() -> Iterator[tuple[str, str]]:
    """What `imgw` prints bare and for `--help`, for itself and for every command and
    subcommand, the plugin commands' own parsers included (run in-process, as
    tests/unit/test_cli_usage.py runs `imgw`)."""
    from gateway import cli

    yield "imgw", cli.command_list()
    parsers = [("imgw", cli.build_parser())]
    for name, ep in sorted(cli.plugin_commands().items()):
        build = getattr(importlib.import_module(ep.module), "build_parser", None)
        if build is not None:
            parsers.append((f"imgw {name}", build()))
    for prog, parser in parsers:
        yield from _pages(prog, parser)


def _pages(prog: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    yield f"{prog} --help", parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _pages(f"{prog} {name}", sub)


def all_hits() -> list[Hit]:
    hits: list[Hit] = []
    for path in prose_files():
        hits += find(path.read_text(), path.relative_to(ROOT).as_posix())
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        for text, line in python_prose(path.read_text()):
            hits += find(text, rel, line)
    for where, text in help_pages():
        hits += find(text, where)
    return sorted(set(hits), key=lambda h: (h.where, h.line, h.phrase))


@pytest.mark.parametrize(
    "line",
    [
        "the default since session 13",
        "## Session 4: the write path",
        "measured in sessions 10-12",
        "the session-2 code measured",
        "round 3 found the floor",
        "Rounds 2 and 3 agreed",
        "what users asked for (issue 16, items 5 and 7)",
        "Issue #12 asks for under 200 ms",
        "the pool fix (#12)",
        "The first seed's rule, as imgw keeps it",
        "the seeds' write path",
        "content, as before.",
        "batches grow as\nbefore, up to batch_max",
        "the store lost it before this change",
        "A node used to keep reading SENDs",
        "which used\nto stall a reader",
        "it was previously 2 ms",
        "`--batch-wait-ms 2` gives the old default back",
    ],
)
def test_the_patterns_flag_history(line: str) -> None:
    assert list(find(line, "example")), line


@pytest.mark.parametrize(
    "line",
    [
        "kick the uid's sessions on every node",
        "a session of 30 s",
        "the session's 2 tokens",
        "## A session\n\n1. Connect, then send LOGIN first",
        "in its session\n1. the first step",
        "one round trip per batch, 3 round trips in all",
        "python -m bench.probes.lifecycle prune-ab --rows 200000 --rounds 3",
        "rounded to 2 decimals",
        "issue a token to uid 5",
        "@settings(derandomize=True): the same seed every run",
        "a random seed of 42",
        "random.Random(seed)",
        "rng.seed(7)",
        "--seed 5",
        "Random(seed=1)",
        "the key is used to sign tokens",
        "what was used to compute it",
        "stored before the commit",
        "refused before its body arrives",
        "&#35; an HTML entity",
        "the move drops the old copy; the old connection closes",
    ],
)
def test_the_patterns_spare_product_words(line: str) -> None:
    assert not list(find(line, "example")), line


def test_prose_is_found_where_users_read_it() -> None:
    source = (
        "def f() -> None:\n"
        '    """First line.\n\n    As before, it runs."""\n'
        "    x = 1  # kept from\n"
        "    # session 4\n"
        '    p.add_argument("--x", help="the send path " "before this change")\n'
        '    y = "as before"  # a plain string is code, not prose\n'
    )
    found = [h for text, line in python_prose(source) for h in find(text, "m.py", line)]
    assert sorted((h.line, h.pattern) for h in found) == [
        (4, "as before"),
        (6, "a numbered session"),
        (7, "before this change"),
    ]


def test_what_users_read_speaks_only_of_the_product() -> None:
    failing = all_hits()
    assert not failing, (
        f"{len(failing)} references to the development history; state what is true now "
        "(tests/test_no_history.py says what is looked for and why):\n"
        + "\n".join(map(str, failing))
    )


if __name__ == "__main__":
    found = all_hits()
    for hit in found:
        print(hit)
    sys.exit(1 if found else 0)
