"""What a prepared claim holds, as span attributes: searchable in a trace backend.

Read from the claim's checkpoint entry (the record of what preparing did), so
the span says what the node actually set up, not what was asked for.
"""

from __future__ import annotations

from opentelemetry.util.types import AttributeValue

from services.core.telemetry import tracing
from services.preparer.checkpoint import ClaimEntry, GroupState

EXCLUSIVE = "Exclusive"
PASSTHROUGH = "Passthrough"
ADMIN = "AdminAccess"


def claim_facts(entry: ClaimEntry | None) -> dict[str, AttributeValue]:
    """Devices, GPU UUIDs (MIG devices add their own), CDI ids and sharing mode."""
    if entry is None or not entry.devices:
        return {}
    uuids: list[str] = []
    for d in entry.devices:
        for uuid in (d.gpu_uuid, d.mig.uuid if d.mig else ""):
            if uuid and uuid not in uuids:
                uuids.append(uuid)
    modes = sorted({_sharing(g) for g in entry.groups} or {EXCLUSIVE})
    if any(d.admin_access for d in entry.devices):
        modes.append(ADMIN)
    return {
        tracing.ATTR_DEVICES: [d.name for d in entry.devices],
        tracing.ATTR_GPU_UUIDS: uuids,
        tracing.ATTR_CDI_IDS: [i for d in entry.devices for i in d.cdi_device_ids],
        tracing.ATTR_SHARING: ",".join(modes),
    }


def _sharing(group: GroupState) -> str:
    if group.kind == "VfioDeviceConfig":
        return PASSTHROUGH
    sharing = group.config.get("sharing")
    strategy = sharing.get("strategy") if isinstance(sharing, dict) else None
    return str(strategy) if strategy else EXCLUSIVE
