"""GPU health as the reference publishes it: what an XID means, the device it lands on,
and the taints (NVMLDeviceHealthCheck) a GPU's health puts on its devices."""

from __future__ import annotations

from collections.abc import Iterable

from services.core.kube.resource import DeviceTaint
from services.core.model.nvidia import (
    DRIVER_NAME,
    gpu_device_name,
    is_vfio_device_name,
    mig_device_name,
)
from services.core.model.schemas import Gpu, Xid

# ------------------------------------------------------------------ taints
TAINT_XID = f"{DRIVER_NAME}/xid"
TAINT_GPU_LOST = f"{DRIVER_NAME}/gpu-lost"
# A GPU whose health cannot be watched (its event registration failed or is unsupported).
TAINT_UNMONITORED = f"{DRIVER_NAME}/unmonitored"
# Application errors after which the GPU is still healthy: their taint has effect None.
NON_FATAL_XIDS = frozenset({13, 31, 43, 45, 68, 109})


# What an XID means, in the words of NVIDIA's Xid catalog (docs.nvidia.com/deploy/
# xid-errors), for the XIDs datacenter GPUs (Ampere and later) report. People
# read these: the kubelet's device health message (pod status), discovery's
# health events. An XID not listed is named by its number alone.
XID_DESCRIPTIONS: dict[int, str] = {
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "Video processor exception",
    69: "Graphics Engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    137: "NVLink FLA privilege error",
    140: "Unrecovered ECC Error",
}
# The reason of a GPU NVML cannot reach any more (NVML_ERROR_GPU_IS_LOST).
GPU_LOST_REASON = "GPU is lost: NVML cannot reach it (NVML_ERROR_GPU_IS_LOST)"


def xid_reason(xid: int) -> str:
    """``XID 79: GPU has fallen off the bus``; an XID the catalog above lacks: ``XID 150``."""
    description = XID_DESCRIPTIONS.get(xid)
    return f"XID {xid}: {description}" if description else f"XID {xid}"


def nvml_error_reason(error: str) -> str:
    """Why a GPU's health is unknown: the NVML queries that failed on it."""
    return f"NVML error: {error}"


def xid_taint(xid: int, extra_non_fatal_xids: Iterable[int] = ()) -> DeviceTaint:
    """healthEventToTaint for an XID: effect None for application errors, else NoSchedule."""
    non_fatal = xid in NON_FATAL_XIDS or xid in set(extra_non_fatal_xids)
    return DeviceTaint(key=TAINT_XID, value=str(xid), effect="None" if non_fatal else "NoSchedule")


def xid_target(gpu: Gpu, xid: Xid) -> str | None:
    """The device an XID lands on: the MIG device of its GI and CI, else the full GPU.

    As the reference's placement map (device_health.go, getDevicePlacementMap),
    keyed by the exact (GPU, GI, CI): a full GPU under (0xFFFFFFFF, 0xFFFFFFFF),
    a static MIG device under its own GI and CI ids. Any other pair is dropped
    (None), among them an XID for a whole GPU instance (its GI with CI
    0xFFFFFFFF, which discovery records as no CI). An XID with neither on a GPU
    in MIG mode names the full GPU, which is not published: it taints nothing.
    """
    if xid.gi_id is None:
        return gpu_device_name(gpu.minor) if xid.ci_id is None else None
    for mig in gpu.mig_devices:
        if mig.gi_id == xid.gi_id and mig.ci_id == xid.ci_id:
            return mig_device_name(gpu.minor, mig.profile, mig.gi_profile_id, mig.placement.start)
    return None


def health_taints(
    gpu: Gpu, device_names: Iterable[str], extra_non_fatal_xids: Iterable[int] = ()
) -> dict[str, list[DeviceTaint]]:
    """Taints per device of one GPU (NVMLDeviceHealthCheck), for its GPU, MIG and VFIO devices.

    One taint per key and device, in the order the reference adds them
    (AddOrUpdateTaint appends a new key): ``unmonitored`` (effect None) on
    every NVML device of a GPU whose event registration failed, as the
    reference marks it when it starts watching; the device's most recent XID,
    which sets value and effect; ``gpu-lost``. Neither of the first two lands
    on the VFIO twin (the reference watches NVML devices only). A lost GPU
    taints every device of it with ``gpu-lost``, its VFIO twin included: a GPU
    that fell off the bus is no use to a VM either (moot while the gates that
    publish twins and taints cannot be combined; see featuregates.EXCLUSIVE).
    """
    names = list(device_names)
    out: dict[str, list[DeviceTaint]] = {}
    if gpu.health.unmonitored:
        unmonitored = DeviceTaint(key=TAINT_UNMONITORED, effect="None")
        for name in names:
            if not is_vfio_device_name(name):
                out[name] = [unmonitored]
    for xid in sorted(gpu.health.xids, key=lambda x: x.timestamp):
        target = xid_target(gpu, xid)
        if target in names:
            kept = [t for t in out.get(target, []) if t.key != TAINT_XID]
            out[target] = [*kept, xid_taint(xid.xid, extra_non_fatal_xids)]
    if gpu.health.lost:
        lost = DeviceTaint(key=TAINT_GPU_LOST, effect="NoSchedule")
        for name in names:
            out.setdefault(name, []).append(lost)
    return out
