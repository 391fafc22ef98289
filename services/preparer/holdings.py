"""What this node's prepared claims hold, published for the publisher (KV ``prepared``).

The publisher withdraws the twin of every held GPU (a GPU and its VFIO twin
are mutually exclusive). Writes happen in the background after prepares and
unprepares, coalesced, and only when the set changed, so they never add to a
kubelet call's latency.
"""

from __future__ import annotations

import asyncio
import logging

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kit import supervisor
from services.core.model.schemas import HeldDevice, NodePreparedDevices
from services.preparer.checkpoint import GPU_KINDS, PREPARE_COMPLETED
from services.preparer.checkpointstore import CheckpointStore

log = logging.getLogger(__name__)


def held_devices(store: CheckpointStore) -> list[HeldDevice]:
    return sorted(
        (
            HeldDevice(device=d.name, kind=d.kind, pci_bus_id=d.pci_bus_id, claim_uid=uid)
            for uid, entry in store.claims.items()
            if entry.state == PREPARE_COMPLETED
            for d in entry.devices
            if d.kind in GPU_KINDS  # GPUs only: the publisher withdraws their twins
        ),
        key=lambda h: (h.device, h.claim_uid),
    )


class HoldingsPublisher:
    def __init__(self, bus: Bus, node: str, store: CheckpointStore) -> None:
        self.bus = bus
        self.node = node
        self.store = store
        self._dirty = asyncio.Event()
        self._last: list[HeldDevice] | None = None

    def start(self) -> None:
        self._dirty.set()  # publish what the checkpoint holds at start-up
        supervisor.current().spawn("holdings", self._publish_changes)

    def changed(self) -> None:
        self._dirty.set()

    async def _publish_changes(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            held = held_devices(self.store)
            if held == self._last:
                continue
            try:
                await self.bus.kv_put(
                    subjects.PREPARED_BUCKET,
                    subjects.prepared_key(self.node),
                    NodePreparedDevices(node=self.node, devices=held),
                )
            except Exception as exc:
                log.warning("could not publish prepared devices", extra={"error": str(exc)})
                await asyncio.sleep(1)
                self._dirty.set()
                continue
            self._last = held

    async def close(self) -> None:
        await supervisor.current().cancel("holdings")
