"""GPU health as discovery sees it: XIDs, GPUs lost and recovered, NVML errors.

The tracker turns NVML events and scan results into (a) the ``health`` of each
Gpu in the inventory and (b) one HealthEvent per new fact. It is kept per GPU
index in memory: like the reference driver, a restart of discovery starts
healthy and relearns what NVML still reports (a lost GPU is lost again on the
first scan; past XIDs are not replayed by NVML).
"""

from __future__ import annotations

import logging

import msgspec

from services.core.model import gpuhealth
from services.core.model.schemas import Gpu, GpuHealth, HealthEvent, HealthKind, NodeInventory, Xid
from services.discovery.backend import NvmlEvent
from services.discovery.inventory import Scan, gpu_label

log = logging.getLogger(__name__)
XIDS_KEPT = 16  # most recent XIDs kept per GPU


class HealthTracker:
    def __init__(self, node: str) -> None:
        self.node = node
        self._health: dict[int, GpuHealth] = {}
        self._errors: dict[int, str | None] = {}

    def on_event(self, inventory: NodeInventory | None, event: NvmlEvent) -> HealthEvent | None:
        """Record an XID; None if the GPU is not in the inventory (yet)."""
        gpu = _by_uuid(inventory, event.gpu_uuid)
        if gpu is None:
            log.warning("XID for an unknown GPU", extra={"uuid": event.gpu_uuid, "xid": event.xid})
            return None
        old = self._health.get(gpu.index, GpuHealth())
        xid = Xid(event.xid, event.timestamp, event.gi_id, event.ci_id)
        self._health[gpu.index] = msgspec.structs.replace(old, xids=[*old.xids, xid][-XIDS_KEPT:])
        return HealthEvent(
            node=self.node,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            kind="xid",
            xid=event.xid,
            message=f"{gpu_label(gpu)}: XID {event.xid}{_where(gpu, event)}",
            timestamp=event.timestamp,
            reason=gpuhealth.xid_reason(event.xid),
            gi_id=event.gi_id,
            ci_id=event.ci_id,
        )

    def on_scan(self, scan: Scan) -> tuple[NodeInventory, list[HealthEvent]]:
        """The inventory with health filled in, and the health events the scan implies."""
        events: list[HealthEvent] = []
        gpus: list[Gpu] = []
        for gpu in scan.inventory.gpus:
            health = self._health.get(gpu.index, GpuHealth())
            lost = gpu.index in scan.lost
            if lost and not health.lost:
                health = msgspec.structs.replace(health, lost=True)
                events.append(
                    self._event(
                        gpu, "gpu-lost", gpu.error or "GPU is lost", gpuhealth.GPU_LOST_REASON
                    )
                )
            elif health.lost and not lost:
                health = GpuHealth()  # the GPU answers again: it was reset
                recovered = "GPU answers NVML again"
                events.append(self._event(gpu, "recovered", recovered, recovered))
            if not lost and gpu.error and gpu.error != self._errors.get(gpu.index):
                reason = gpuhealth.nvml_error_reason(gpu.error)
                events.append(self._event(gpu, "nvml-error", gpu.error, reason))
            self._errors[gpu.index] = gpu.error
            unmonitored = gpu.index in scan.unmonitored
            if health.unmonitored != unmonitored:
                health = msgspec.structs.replace(health, unmonitored=unmonitored)
            self._health[gpu.index] = health
            gpus.append(msgspec.structs.replace(gpu, health=health))
        return msgspec.structs.replace(scan.inventory, gpus=gpus), events

    def _event(self, gpu: Gpu, kind: HealthKind, message: str, reason: str) -> HealthEvent:
        return HealthEvent(
            node=self.node,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            kind=kind,
            message=f"{gpu_label(gpu)}: {message}",
            reason=reason,
        )


def _by_uuid(inventory: NodeInventory | None, uuid: str) -> Gpu | None:
    if inventory is None:
        return None
    return next((g for g in inventory.gpus if g.uuid == uuid and uuid), None)


def _where(gpu: Gpu, event: NvmlEvent) -> str:
    if event.gi_id is None:
        return ""
    for m in gpu.mig_devices:
        if m.gi_id == event.gi_id and m.ci_id == event.ci_id:
            return f" on MIG {m.profile} (GI {m.gi_id}/CI {m.ci_id}, {m.uuid})"
    return f" on GI {event.gi_id}/CI {event.ci_id}"
