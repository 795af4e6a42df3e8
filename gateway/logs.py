"""structlog setup: JSON lines for machines, colourless console lines for people."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import structlog


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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


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
