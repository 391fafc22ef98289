"""The node's presence record on the bus: "the kubelet has our plugin registered".

The publisher publishes ResourceSlices only for nodes with a record, because
the kubelet wipes a driver's slices 30 s after its plugin disconnects. A bus
hiccup must neither fail the kubelet's registration call nor lose the record,
so writes that fail are retried by :meth:`Presence.keep`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import PluginPresence

log = logging.getLogger(__name__)


class Presence:
    def __init__(self, bus: Bus, node: str, driver: str, endpoint: str) -> None:
        self.bus = bus
        self.node = node
        self.driver = driver
        self.endpoint = endpoint
        self.key = subjects.presence_key(node, driver)
        self.wanted = False  # True between a positive registration status and shutdown
        self._lock = asyncio.Lock()

    async def announce(self) -> None:
        """Record the registration (a fresh ``registered_at`` each time)."""
        async with self._lock:
            self.wanted = True
            await self._try(self._put, "announce")

    async def withdraw(self) -> None:
        async with self._lock:
            self.wanted = False
            await self._try(self._delete, "withdraw")

    async def keep(self, interval: float = 10.0) -> None:
        """Re-create the record while wanted if it went missing (failed write, lost bucket)."""
        while True:
            await asyncio.sleep(interval)
            async with self._lock:
                if self.wanted and not await self._try(self._exists, "check"):
                    await self._try(self._put, "restore")

    async def _put(self) -> bool:
        record = PluginPresence(node=self.node, driver=self.driver, endpoint=self.endpoint)
        await self.bus.kv_put(subjects.PRESENCE_BUCKET, self.key, record)
        log.info("presence announced", extra={"key": self.key, "endpoint": self.endpoint})
        return True

    async def _delete(self) -> bool:
        """Delete the record if it is ours: in a rolling update the other pod may own it."""
        found = await self.bus.kv_get(subjects.PRESENCE_BUCKET, self.key, PluginPresence)
        if found is None or found[0].endpoint != self.endpoint:
            return True
        await self.bus.kv_delete(subjects.PRESENCE_BUCKET, self.key)
        log.info("presence withdrawn", extra={"key": self.key})
        return True

    async def _exists(self) -> bool:
        return await self.bus.kv_get(subjects.PRESENCE_BUCKET, self.key, PluginPresence) is not None

    async def _try(self, step: Callable[[], Awaitable[bool]], what: str) -> bool:
        try:
            return await step()
        except Exception as exc:
            log.warning("presence %s failed", what, extra={"key": self.key, "error": str(exc)})
            return False
