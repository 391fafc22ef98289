"""Exponential delays between retries: the one backoff every loop that retries uses."""

from __future__ import annotations

import asyncio

MAX_BACKOFF_S = 30.0


class Backoff:
    """Doubling delays from ``first`` up to ``limit``; :meth:`reset` after a success."""

    def __init__(self, first: float = 0.1, limit: float = MAX_BACKOFF_S) -> None:
        self.first = first
        self.limit = limit
        self.delay = first

    def reset(self) -> None:
        self.delay = self.first

    def next(self) -> float:
        """The delay to wait now; the one after it doubles."""
        delay = self.delay
        self.delay = min(self.delay * 2, self.limit)
        return delay

    async def sleep(self) -> None:
        await asyncio.sleep(self.next())
