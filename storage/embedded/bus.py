"""In-process Bus: one node, so every publish is to ourselves."""

from __future__ import annotations

import inspect

from storage.ports import BusHandler, Delivery, ResumeHandler


class LocalBus:
    def __init__(self) -> None:
        self._node: str | None = None
        self._handler: BusHandler | None = None
        self.published = self.lost = self.unroutable = self.dead_lettered = self.outages = 0

    async def start(self, node: str, handler: BusHandler, on_resume: ResumeHandler) -> None:
        self._node, self._handler = node, handler

    async def publish(self, node: str, payload: bytes) -> Delivery:
        if node != self._node or self._handler is None:
            self.unroutable += 1
            return Delivery.UNROUTABLE
        self.published += 1
        try:
            result = self._handler(payload)
            if inspect.isawaitable(result):
                await result
        except Exception:
            self.dead_lettered += 1
        return Delivery.OK

    async def close(self) -> None:
        self._handler = None
