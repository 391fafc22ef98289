"""The discovery service: scan NVML, keep the node's inventory in KV, emit changes and health.

It re-scans every ``rescan_interval`` seconds, at once after an NVML event
(XID), and - on a simulated node - whenever the shared simulated state
changes (another process created a MIG device, injected an XID, lost a GPU).
The inventory is written to KV ``inventory`` only when its digest changed, and
each write is followed by one ``InventoryChanged`` naming what changed, so a
restart that finds the same GPUs writes nothing.

Nothing here ends the service: a failed scan keeps the last inventory and is
retried, a bad simulated state is skipped, a bus error is logged and retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from opentelemetry import trace

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kit import supervisor
from services.core.model.schemas import HealthEvent, InventoryChanged, NodeInventory, SchemaError
from services.core.telemetry import tracing
from services.discovery import inventory, metrics
from services.discovery.backend import Backend, GpuLost, NvmlError, NvmlEvent
from services.discovery.health import HealthTracker
from services.discovery.sim import SimNvml, SimStateError, check_state
from services.discovery.simstate import SimNodeState
from services.discovery.simstore import sim_key

log = logging.getLogger(__name__)
_tracer = tracing.tracer("gpudra.discovery")
EVENT_WAIT_S = 0.5  # how long one NVML wait blocks the event thread
RETRY_S = 1.0  # pause before retrying a failed inventory write


class Discovery:
    def __init__(
        self, bus: Bus, node: str, backend: Backend, *, rescan_interval: float = 30.0
    ) -> None:
        self.bus = bus
        self.node = node
        self.backend = backend
        self.rescan_interval = rescan_interval
        self.health = HealthTracker(node)
        self.inventory: NodeInventory | None = None  # last scan, health included
        self.stored: NodeInventory | None = None  # what KV holds
        self._wake = asyncio.Event()
        self._events: asyncio.Queue[NvmlEvent] = asyncio.Queue()
        self._pending_state: SimNodeState | None = None
        self._stop_thread = threading.Event()
        self._pump: threading.Thread | None = None
        self._tasks: list[str] = []
        self._span_attributes = {tracing.ATTR_NODE: node}

    @property
    def simulated(self) -> SimNvml | None:
        return self.backend if isinstance(self.backend, SimNvml) else None

    def wake(self) -> None:
        """Ask for a re-scan as soon as the current one (if any) is done."""
        self._wake.set()

    async def start(self) -> None:
        """NVML up, the first inventory written, then events, guards and rescans running."""
        await asyncio.to_thread(self.backend.init)
        self.stored = await self._load_stored()
        await self._rescan()  # the first inventory before anything else
        self._pump = threading.Thread(
            target=self._pump_events, args=(asyncio.get_running_loop(),), daemon=True
        )
        self._pump.start()
        tasks = supervisor.current()
        self._tasks = ["nvml-events", "inventory-guard", "rescans"]
        tasks.spawn("nvml-events", self._handle_events)
        tasks.spawn("inventory-guard", self._guard_inventory)
        tasks.spawn("rescans", self._rescans, fatal=True)  # a scan that raises stops discovery
        if self.simulated is not None:
            self._tasks.append("sim-state")
            tasks.spawn("sim-state", self._watch_sim_state)

    async def close(self) -> None:
        """Stop the tasks and the event thread, shut NVML down."""
        self._stop_thread.set()
        tasks = supervisor.current()
        for name in self._tasks:
            await tasks.cancel(name)
        if self._pump is not None:
            await asyncio.to_thread(self._pump.join, 5)
        with contextlib.suppress(NvmlError):
            await asyncio.to_thread(self.backend.shutdown)

    async def run(self, stop: asyncio.Event) -> None:
        """:meth:`start`, serve until ``stop``, :meth:`close` (for tests that drive one)."""
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.close()

    async def _rescans(self) -> None:
        """A scan every ``rescan_interval``, or at once when woken (an event, a change)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.rescan_interval)
            await self._rescan()

    # ------------------------------------------------------------ scanning

    async def _rescan(self) -> None:
        """One scan cycle, one trace (``discovery.scan``): scan, health events, KV write."""
        with _tracer.start_as_current_span("discovery.scan", attributes=self._span_attributes):
            await self._scan_cycle()

    async def _scan_cycle(self) -> None:
        self._wake.clear()
        if self._pending_state is not None and self.simulated is not None:
            self.simulated.load(self._pending_state)
            self._pending_state = None
        started = time.perf_counter()
        try:
            # The stored inventory stands in for the last scan after a restart, so a
            # GPU that is lost by then still carries its identity.
            previous = self.inventory or self.stored
            result = await asyncio.to_thread(inventory.scan, self.backend, self.node, previous)
        except Exception as exc:  # keep the last inventory; the next scan retries
            metrics.SCANS.labels(outcome="error").inc()
            log.error("scan failed", extra={"node": self.node, "error": str(exc)})
            tracing.finish(trace.get_current_span(), f"scan failed: {exc}")
            return
        metrics.SCANS.labels(outcome="ok").inc()
        metrics.SCAN_SECONDS.observe(time.perf_counter() - started)
        self.inventory, events = self.health.on_scan(result)
        trace.get_current_span().set_attributes(
            {"gpudra.gpus": len(self.inventory.gpus), "gpudra.health_events": len(events)}
        )
        for event in events:
            await self._publish_health(event)
        await self._store(self.inventory)

    async def _store(self, inv: NodeInventory) -> None:
        if self.stored is not None and self.stored.digest() == inv.digest():
            if await self._still_stored(inv):
                return
            metrics.INVENTORY_REPAIRS.inc()
            log.warning(
                "the inventory key was gone or changed at the rescan; putting the scan back",
                extra={"node": self.node},
            )
        try:
            revision = await self.bus.kv_put(
                subjects.INVENTORY_BUCKET, subjects.inventory_key(self.node), inv
            )
            changes = inventory.describe_changes(self.stored, inv)
            await self.bus.publish(
                subjects.inventory_changed(self.node),
                InventoryChanged(
                    node=self.node, digest=inv.digest(), revision=revision, changes=changes
                ),
            )
        except Exception as exc:  # the bus is down: scan and try again shortly
            log.error("storing inventory failed", extra={"node": self.node, "error": str(exc)})
            asyncio.get_running_loop().call_later(RETRY_S, self.wake)
            return
        metrics.INVENTORY_UPDATES.inc()
        log.info("inventory updated", extra={"node": self.node, "changes": changes})
        self.stored = inv

    async def _guard_inventory(self) -> None:
        """Put our scan back when someone else rewrites or deletes this node's inventory key.

        Nothing but this node's discovery may say what GPUs it has; a forged or
        emptied inventory would publish fake devices or withdraw real ones.
        """
        key = subjects.inventory_key(self.node)
        async for update in self.bus.watch_kv(subjects.INVENTORY_BUCKET, NodeInventory, key):
            ours = self.inventory
            if ours is None:
                continue
            if update.value is not None and update.value.digest() == ours.digest():
                continue
            metrics.INVENTORY_REPAIRS.inc()
            log.warning(
                "the inventory key was changed by someone else; putting the scan back",
                extra={"node": self.node, "revision": update.revision},
            )
            self.stored = None  # the next store writes whatever the scan says
            self.wake()

    async def _still_stored(self, inv: NodeInventory) -> bool:
        """Whether KV still holds ``inv``. The guard's watch sees a deletion or a rewrite;
        this catches one it could not see (made while it was down, its marker expired)."""
        try:
            found = await self._load_stored()
        except Exception as exc:  # the bus is away: the next rescan looks again
            log.warning("could not read the inventory key", extra={"error": str(exc)})
            return True
        return found is not None and found.digest() == inv.digest()

    async def _load_stored(self) -> NodeInventory | None:
        try:
            found = await self.bus.kv_get(
                subjects.INVENTORY_BUCKET, subjects.inventory_key(self.node), NodeInventory
            )
        except SchemaError as exc:
            log.warning("stored inventory unreadable; replacing it", extra={"error": str(exc)})
            return None
        return found[0] if found else None

    # ------------------------------------------------------------ NVML events

    def _pump_events(self, loop: asyncio.AbstractEventLoop) -> None:
        """Thread: block in NVML's event wait and hand events to the loop."""
        while not self._stop_thread.is_set():
            try:
                event = self.backend.wait_event(EVENT_WAIT_S)
            except GpuLost:
                loop.call_soon_threadsafe(self.wake)  # the scan finds out which one
                time.sleep(EVENT_WAIT_S)
                continue
            except Exception as exc:
                log.warning("NVML event wait failed", extra={"error": str(exc)})
                time.sleep(EVENT_WAIT_S)
                continue
            if event is not None:
                loop.call_soon_threadsafe(self._events.put_nowait, event)

    async def _handle_events(self) -> None:
        while True:
            event = await self._events.get()
            try:
                health = self.health.on_event(self.inventory, event)
                if health is not None:
                    await self._publish_health(health)
                    self.wake()
            except Exception:
                log.exception("handling NVML event failed", extra={"xid": event.xid})

    async def _publish_health(self, event: HealthEvent) -> None:
        try:
            await self.bus.publish(subjects.health(self.node), event)
        except Exception as exc:
            log.error("publishing health event failed", extra={"error": str(exc)})
            return
        metrics.HEALTH_EVENTS.labels(kind=event.kind).inc()
        log.info(
            "health event",
            extra={"kind": event.kind, "health": event.message, "reason": event.reason},
        )

    # ------------------------------------------------------------ simulated NVML

    async def _watch_sim_state(self) -> None:
        """Follow the shared simulated state; every usable change triggers a re-scan."""
        while True:
            try:
                async for update in self.bus.watch_kv(
                    subjects.SIM_BUCKET, SimNodeState, keys=sim_key(self.node)
                ):
                    self._take_sim_state(update.value)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("simulated state watch failed; retrying", extra={"error": str(exc)})
                await asyncio.sleep(1)

    def _take_sim_state(self, state: SimNodeState | None) -> None:
        if state is None:
            log.warning("simulated state deleted; keeping the last one", extra={"node": self.node})
            return
        try:
            check_state(state)
        except SimStateError as exc:
            metrics.SIM_REJECTED.inc()
            log.warning("skipping unusable simulated state", extra={"error": str(exc)})
            return
        self._pending_state = state
        self.wake()
