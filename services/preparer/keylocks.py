"""One holder at a time per key: a claim, a GPU, a shared MPS daemon (both drivers' engines).

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


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> (lock, users)

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

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
