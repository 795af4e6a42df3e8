"""A step run every few seconds in the background, until stopped: a failing step is
logged and tried again at the next period (the background loops of route watch, the
outbox and the shared rate budgets)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class Periodic:
    def __init__(
        self, every_s: float, step: Callable[[], Awaitable[None]], *, log: Any, failed: str
    ) -> None:
        self._every_s = every_s
        self._step = step
        self._log = log
        self._failed = failed  # the log message when a step raises
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            try:
                await self._step()
            except Exception as e:
                self._log.warning(self._failed, error=repr(e))
