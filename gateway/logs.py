"""structlog setup: JSON lines for machines, colourless console lines for people.

Every event goes through gateway.redact's REDACTOR last, before it is rendered: known
secrets and URL passwords never reach the log, whoever put them in an event. The
records of the standard library's logging (asyncio, the drivers), warnings and up, are
rendered the same way, in the same format, through the same redaction, and so is the
traceback of an exception nothing caught.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import TextIO, cast

import structlog

from gateway.redact import REDACTOR


def configure(fmt: str = "console", level: str = "info") -> None:
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            REDACTOR,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _CurrentStderr())),
        cache_logger_on_first_use=True,
    )
    _route_stdlib(renderer, max(lvl, logging.WARNING))
    sys.excepthook = _print_redacted
    threading.excepthook = lambda a: _print_redacted(a.exc_type, a.exc_value, a.exc_traceback)


def _print_redacted(
    kind: type[BaseException], error: BaseException | None, tb: TracebackType | None
) -> None:
    """What Python prints of an exception nothing caught, with its secrets masked."""
    text = "".join(traceback.format_exception(kind, error, tb))
    sys.stderr.write(REDACTOR.text(text))


class _CurrentStderr:
    """sys.stderr as it is when written to, not when the logging was configured (pytest
    swaps it for each test)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _StderrHandler(logging.Handler):
    """The standard library's records, to the sys.stderr of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _route_stdlib(renderer: structlog.typing.Processor, level: int) -> None:
    """The standard library's log records, `level` and up, rendered like the gateway's
    own events (one handler on the root logger, replaced by each configure)."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_logger_name,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            REDACTOR,
        ],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    handler = _StderrHandler(level)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    if root.level > level or root.level == logging.NOTSET:
        root.setLevel(level)


class Throttle:
    """At most one log record per key per `every_s`: under a storm (a backend down while
    thousands of clients retry) a warning per failed request would cost the gateway more
    CPU than the requests. `allow(key)` says whether to log now, and how many records of
    that key were held back since the last one."""

    __slots__ = ("_clock", "_every", "_held", "_last")

    def __init__(self, clock: Callable[[], float], every_s: float = 1.0) -> None:
        self._clock = clock
        self._every = every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str) -> int | None:
        """None: hold this one back; else the number held back before it."""
        now = self._clock()
        if now - self._last.get(key, -1e18) < self._every:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)
