"""What the node's checkpoint records: which claims are prepared, and exactly what was done
for them (the devices, MIG devices, VFIO bindings, MPS daemons, consumable shares and
config groups), enough to undo it after a crash.

The file that holds them is :mod:`.checkpointfile`; the store that keeps it, in memory
and on disk, :mod:`.checkpointstore`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from services.core.kube.resource import AllocationResult
from services.core.model.schemas import Gpu, MigDevice

ClaimState = Literal["PrepareStarted", "PrepareCompleted"]
PREPARE_STARTED: ClaimState = "PrepareStarted"
PREPARE_COMPLETED: ClaimState = "PrepareCompleted"


class Record(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True, frozen=True):
    """A record in the file: camelCase names, defaults left out, never changed in place."""


class MigState(Record, frozen=True, kw_only=True):
    """A MIG device as it exists: enough to find it again and to destroy it."""

    uuid: str
    parent_uuid: str
    parent_minor: int
    profile: str
    gi_profile_id: int
    placement_start: int
    placement_size: int = 0
    gi_id: int
    ci_id: int
    created: bool = False  # dynamic MIG: we created it and must destroy it

    @classmethod
    def of(cls, gpu: Gpu, device: MigDevice, *, created: bool = False) -> MigState:
        """The state of ``device``, a MIG device of ``gpu`` as the inventory lists it."""
        return cls(
            uuid=device.uuid,
            parent_uuid=gpu.uuid,
            parent_minor=gpu.minor,
            profile=device.profile,
            gi_profile_id=device.gi_profile_id,
            placement_start=device.placement.start,
            placement_size=device.placement.size,
            gi_id=device.gi_id,
            ci_id=device.ci_id,
            created=created,
        )


class VfioState(Record, frozen=True, kw_only=True):
    pci_bus_id: str
    iommu_group: int
    previous_driver: str = "nvidia"
    iommufd_dev: str = ""  # vfioN under /dev/vfio/devices (its IOMMUFD cdev), once bound


class ShareState(Record, frozen=True, kw_only=True):
    """One consumable share of a device (KEP-5075) and the limits it was given.

    The device's MPS daemon is shared by every share on it: how many prepared
    claims hold a share naming ``daemon_id`` is its reference count (read from
    the checkpoint, so it survives a preparer restart).
    """

    share_id: str
    device_uuid: str  # the GPU's, or the MIG device's: what the limits name
    consumed: dict[str, str]  # capacity -> quantity, as checked against the device's policy
    daemon_id: str
    memory_limit_mib: int | None = None
    thread_percentage: int = 100


GpuKind = Literal["gpu", "mig", "vfio"]
GPU_KINDS: tuple[GpuKind, ...] = ("gpu", "mig", "vfio")
DeviceKind = GpuKind | Literal["channel", "daemon"]  # the last two: compute-domain.nvidia.com


class PreparedDeviceState(Record, frozen=True, kw_only=True):
    """One allocated device and what preparing it produced."""

    name: str
    kind: DeviceKind
    requests: list[str]
    pool: str
    cdi_device_ids: list[str] = []
    gpu_uuid: str = ""  # the physical GPU (parent of a MIG device)
    gpu_minor: int = -1
    pci_bus_id: str = ""
    admin_access: bool = False
    group: int = 0
    mig: MigState | None = None
    vfio: VfioState | None = None
    share: ShareState | None = None
    share_mps: MpsState | None = None  # the device's shared daemon, as this share found it


class MpsState(Record, frozen=True, kw_only=True):
    daemon_id: str
    root_dir: str
    pipe_dir: str
    shm_dir: str
    log_dir: str
    device_uuids: list[str]
    gpu_uuids: list[str] = []
    active_thread_percentage: int | None = None
    pinned_memory_limits_mib: dict[str, int] = {}
    pid: int | None = None


class GroupState(Record, frozen=True, kw_only=True):
    """One config group: the config that won for its devices and the sharing applied."""

    kind: str  # GpuConfig / MigDeviceConfig / VfioDeviceConfig
    origin: str
    config: dict[str, Any] = {}
    time_slice: str | None = None  # interval applied, reset to Default on unprepare
    time_slice_gpus: list[str] = []
    mps: MpsState | None = None
    vfio_api_device: bool = False
    vfio_iommufd: bool = False


class ClaimEntry(Record, frozen=True, kw_only=True):
    state: ClaimState
    namespace: str
    name: str
    allocation: AllocationResult | None = None
    started_at: float = 0.0
    completed_at: float | None = None
    devices: list[PreparedDeviceState] = []
    groups: list[GroupState] = []
    metadata_files: list[str] = []  # KEP-5304 files written for this claim


class CheckpointData(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    node_boot_id: str = msgspec.field(default="", name="nodeBootID")
    claims: dict[str, ClaimEntry] = {}
