"""One prepare or unprepare at a time per claim (or per GPU), for both drivers' engines.

The kubelet may retry a call while the first is still running; the second
waits for the first instead of racing it over the checkpoint and the CDI spec.
A lock lives only while somebody holds or awaits it, so a node that sees
millions of claims keeps no lock per claim it has ever seen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class ClaimLocks:
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # uid -> (lock, users)

    @asynccontextmanager
    async def hold(self, uid: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(uid, (asyncio.Lock(), 0))
        self._locks[uid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[uid]
            if users == 1:
                del self._locks[uid]
            else:
                self._locks[uid] = (lock, users - 1)

    @asynccontextmanager
    async def hold_all(self, keys: set[str]) -> AsyncIterator[None]:
        """Every one of ``keys``, taken in sorted order (two holders never wait on each
        other's second key)."""
        async with contextlib.AsyncExitStack() as stack:
            for key in sorted(keys):
                await stack.enter_async_context(self.hold(key))
            yield

    def __len__(self) -> int:
        return len(self._locks)
