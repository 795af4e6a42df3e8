"""Waiting in tests for a condition that no event announces."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `pred` every 20 ms; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
