"""A client-side request budget: at most ``qps`` requests a second, bursts of ``burst``.

What client-go calls QPS and Burst: a process that writes to the API server
at full speed (the publisher's first publish of a fleet) must stay inside what
the operators give it, whatever its concurrency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class TokenBucket:
    """``acquire`` waits for a token; tokens refill at ``qps`` up to ``burst`` (qps <= 0: none)."""

    def __init__(
        self,
        qps: float,
        burst: int = 1,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._clock, self._sleep = clock, sleep
        self._tokens = float(self.burst)
        self._at = clock()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if self.qps <= 0:
            return
        async with self._lock:  # first come, first served
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            if self._tokens < 1:
                await self._sleep((1 - self._tokens) / self.qps)
                self._tokens, self._at = 1.0, self._clock()
            self._tokens -= 1
