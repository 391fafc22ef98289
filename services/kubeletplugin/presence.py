"""The node's presence record on the bus: "the kubelet has our plugin registered".

The publisher publishes ResourceSlices only for nodes with a record, because
the kubelet wipes a driver's slices 30 s after its plugin disconnects. A bus
hiccup must neither fail the kubelet's registration call nor lose the record,
so writes that fail are retried by :meth:`Presence.keep`; and a record someone
else deleted or rewrote (the admin identity may) would withdraw the node's
devices, so :meth:`Presence.keep` puts it back within ``CHECK_S``, logged and
counted (``gpudra_kubeletplugin_presence_repairs_total``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import PluginPresence, SchemaError
from services.kubeletplugin import metrics

log = logging.getLogger(__name__)
CHECK_S = 10.0  # how often a wanted record is checked (and put back when wrong)


class Presence:
    def __init__(self, bus: Bus, node: str, driver: str, endpoint: str) -> None:
        self.bus = bus
        self.node = node
        self.driver = driver
        self.endpoint = endpoint
        self.key = subjects.presence_key(node, driver)
        self.wanted = False  # True between a positive registration status and shutdown
        self.record: PluginPresence | None = None  # what we last wrote
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

    async def keep(self, interval: float = CHECK_S) -> None:
        """While wanted, put the record back when it is not ours: a write of ours that
        failed, or a record someone deleted, rewrote or left unreadable."""
        while True:
            await asyncio.sleep(interval)
            async with self._lock:
                if self.wanted:
                    await self._check()

    async def _check(self) -> None:
        try:
            why = await self._wrong()
        except Exception as exc:  # the bus is away: the next check tries again
            log.warning("presence check failed", extra={"key": self.key, "error": str(exc)})
            return
        if not why:
            return
        if why != "unwritten":
            metrics.PRESENCE_REPAIRS.labels(reason=why).inc()
            log.warning(
                "presence record %s by someone else; putting it back", why, extra={"key": self.key}
            )
        await self._try(self._put, "restore")

    async def _wrong(self) -> str:
        """Why the stored record is not ours ("" when it is)."""
        if self.record is None:
            return "unwritten"
        try:
            found = await self.bus.kv_get(subjects.PRESENCE_BUCKET, self.key, PluginPresence)
        except SchemaError:
            return "made unreadable"
        if found is None:
            return "deleted"
        if found[0] == self.record or self._newer_sibling(found[0]):
            return ""
        return "rewritten"

    def _newer_sibling(self, record: PluginPresence) -> bool:
        """A newer front of this node (a rolling update: sockets named after its pod)."""
        assert self.record is not None
        return (
            (record.node, record.driver) == (self.node, self.driver)
            and record.endpoint != self.endpoint
            and record.registered_at > self.record.registered_at
        )

    async def _put(self) -> bool:
        record = PluginPresence(node=self.node, driver=self.driver, endpoint=self.endpoint)
        self.record = None  # until stored: a check meanwhile finds it unwritten
        await self.bus.kv_put(subjects.PRESENCE_BUCKET, self.key, record)
        self.record = record
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

    async def _try(self, step: Callable[[], Awaitable[bool]], what: str) -> bool:
        try:
            return await step()
        except Exception as exc:
            log.warning("presence %s failed", what, extra={"key": self.key, "error": str(exc)})
            return False
