"""What this node's prepared claims hold, published for the publisher (KV ``prepared``).

The publisher withdraws the twin of every held GPU (a GPU and its VFIO twin
are mutually exclusive). Writes happen in the background after prepares and
unprepares, coalesced, and only when the set changed, so they never add to a
kubelet call's latency.

The key is this node's word: deleted or rewritten by someone else (the admin
identity may), the publisher would offer a held GPU's twin. Every ``CHECK_S`` the
stored value is compared with what was written (node and devices: ``updated_at`` is
when it was written, never the same twice); a different one is put back, logged and
counted (``gpudra_preparer_prepared_key_repairs_total``).
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import Counter

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kit import supervisor
from services.core.model.schemas import HeldDevice, NodePreparedDevices, SchemaError
from services.preparer.checkpoint import GPU_KINDS, PREPARE_COMPLETED
from services.preparer.checkpointstore import CheckpointStore

log = logging.getLogger(__name__)
CHECK_S = 10.0  # how often the stored key is compared with what was written
REPAIRS = Counter(
    "gpudra_preparer_prepared_key_repairs_total",
    "Times this node's prepared key was found deleted, rewritten or unreadable, and put back.",
    ["reason"],
)


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
    def __init__(
        self, bus: Bus, node: str, store: CheckpointStore, check_s: float = CHECK_S
    ) -> None:
        self.bus = bus
        self.node = node
        self.store = store
        self.check_s = check_s
        self.checks = 0  # comparisons made (tests wait on it)
        self._dirty = asyncio.Event()
        self._last: list[HeldDevice] | None = None

    def start(self) -> None:
        self._dirty.set()  # publish what the checkpoint holds at start-up
        # Named by node: a process hosting several nodes (bench/scalenodes.py) runs one each.
        supervisor.current().spawn(f"holdings {self.node}", self._publish_changes)
        supervisor.current().spawn(f"holdings-guard {self.node}", self._guard)

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

    async def _guard(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            last = self._last
            why = await self._wrong(last)
            self.checks += 1
            if why and self._last is last:  # not written again by us meanwhile
                REPAIRS.labels(reason=why).inc()
                log.warning(
                    "the prepared key was %s by someone else; putting it back",
                    why,
                    extra={"node": self.node},
                )
                self._last = None
                self._dirty.set()

    async def _wrong(self, last: list[HeldDevice] | None) -> str:
        """Why the stored value is not ``last``, what we wrote ("" when it is, or nothing is
        written yet, or the bus is away: the next check tries again)."""
        if last is None:
            return ""
        key = subjects.prepared_key(self.node)
        try:
            found = await self.bus.kv_get(subjects.PREPARED_BUCKET, key, NodePreparedDevices)
        except SchemaError:
            return "made unreadable"
        except Exception as exc:
            log.warning("could not check the prepared key", extra={"error": str(exc)})
            return ""
        if found is None:
            return "deleted"
        if (found[0].node, found[0].devices) != (self.node, last):
            return "rewritten"
        return ""

    async def close(self) -> None:
        await supervisor.current().cancel(f"holdings-guard {self.node}")
        await supervisor.current().cancel(f"holdings {self.node}")
