"""The NVML backend interface every implementation offers (real pynvml, simulated).

The calls mirror NVML one query at a time, so the code above them (inventory,
MIG management, health) is the same for both and a failing query on one GPU
fails only that query. Errors are one small hierarchy carrying NVML's return
codes, so callers can tell "not supported" from "in use" from "GPU is lost"
whichever backend raised them.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import msgspec

from services.core.model.schemas import VfioInfo

# ---------------------------------------------------------------- errors


class NvmlError(Exception):
    """An NVML call failed; ``code`` is the nvmlReturn_t value."""

    code: ClassVar[int] = 999
    symbol: ClassVar[str] = "NVML_ERROR_UNKNOWN"

    def __init__(self, message: str = "") -> None:
        super().__init__(f"{self.symbol}: {message}" if message else self.symbol)
        self.detail = message


class Uninitialized(NvmlError):
    code, symbol = 1, "NVML_ERROR_UNINITIALIZED"


class InvalidArgument(NvmlError):
    code, symbol = 2, "NVML_ERROR_INVALID_ARGUMENT"


class NotSupported(NvmlError):
    code, symbol = 3, "NVML_ERROR_NOT_SUPPORTED"


class NoPermission(NvmlError):
    code, symbol = 4, "NVML_ERROR_NO_PERMISSION"


class NotFound(NvmlError):
    code, symbol = 6, "NVML_ERROR_NOT_FOUND"


class Timeout(NvmlError):
    code, symbol = 10, "NVML_ERROR_TIMEOUT"


class LibraryNotFound(NvmlError):
    code, symbol = 12, "NVML_ERROR_LIBRARY_NOT_FOUND"


class FunctionNotFound(NvmlError):
    code, symbol = 13, "NVML_ERROR_FUNCTION_NOT_FOUND"


class GpuLost(NvmlError):
    code, symbol = 15, "NVML_ERROR_GPU_IS_LOST"


class InUse(NvmlError):
    code, symbol = 19, "NVML_ERROR_IN_USE"


class InsufficientResources(NvmlError):
    code, symbol = 23, "NVML_ERROR_INSUFFICIENT_RESOURCES"


class InvalidState(NvmlError):
    code, symbol = 29, "NVML_ERROR_INVALID_STATE"


_BY_CODE: dict[int, type[NvmlError]] = {
    cls.code: cls
    for cls in (
        Uninitialized,
        InvalidArgument,
        NotSupported,
        NoPermission,
        NotFound,
        Timeout,
        LibraryNotFound,
        FunctionNotFound,
        GpuLost,
        InUse,
        InsufficientResources,
        InvalidState,
    )
}


def error_for_code(code: int, message: str = "") -> NvmlError:
    """The exception for an nvmlReturn_t code (unknown codes keep their number)."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message)
    return NvmlError(f"code {code}: {message}" if message else f"code {code}")


# ---------------------------------------------------------------- values


class Placement(msgspec.Struct, frozen=True):
    start: int
    size: int


class PciInfo(msgspec.Struct, frozen=True, kw_only=True):
    bus_id: str  # "0000:3b:00.0", as go-nvlib formats it
    device_id: int  # 0x2330
    vendor_id: int  # 0x10de


class GpuInstanceProfile(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU-instance profile, its full-size compute instance and its placements."""

    name: str
    id: int
    ci_profile: int
    slices: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    instance_count: int
    placements: tuple[Placement, ...]


class MigInstance(msgspec.Struct, frozen=True, kw_only=True):
    """A live MIG device: one compute instance inside one GPU instance."""

    gi_id: int
    ci_id: int
    gi_profile_id: int
    placement: Placement
    uuid: str


# nvmlGpuFabricState_t
FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_IN_PROGRESS = 2
FABRIC_STATE_COMPLETED = 3


class FabricInfo(msgspec.Struct, frozen=True, kw_only=True):
    """nvmlGpuFabricInfo_t: the GPU's place in a multi-node NVLink fabric.

    ``cluster_uuid`` is the 16 raw bytes formatted as a UUID (all zeros when the
    fabric manager assigned none), ``status`` an nvmlReturn_t (0: the probe
    succeeded), ``state`` one of the FABRIC_STATE_* values.
    """

    cluster_uuid: str
    clique_id: int
    state: int
    status: int


class NvmlEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An XID critical error as nvmlEventSetWait delivers it."""

    gpu_uuid: str
    xid: int
    gi_id: int | None = None  # None: the whole GPU (NVML reports 0xFFFFFFFF)
    ci_id: int | None = None
    timestamp: float


# ---------------------------------------------------------------- interface


class Backend(Protocol):
    """NVML, one query per call; every method may raise :class:`NvmlError`."""

    @property
    def name(self) -> str:
        """``nvml`` or ``simulated:<fleet>``: goes into NodeInventory.backend."""
        ...

    def init(self) -> None: ...
    def shutdown(self) -> None: ...

    # system
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int:
        """As NVML reports it: 12080 for 12.8."""
        ...

    def device_count(self) -> int: ...

    # per device (index = NVML enumeration index)
    def uuid(self, index: int) -> str: ...
    def minor(self, index: int) -> int: ...
    def product_name(self, index: int) -> str: ...
    def brand(self, index: int) -> str: ...
    def architecture(self, index: int) -> str: ...
    def cuda_compute_capability(self, index: int) -> tuple[int, int]: ...
    def memory_total(self, index: int) -> int:
        """Bytes."""
        ...

    def pci_info(self, index: int) -> PciInfo: ...
    def addressing_mode(self, index: int) -> str | None:
        """``ATS``/``HMM``/``None`` on coherent platforms; None where unsupported."""
        ...

    def pcie_root(self, index: int) -> str | None: ...
    def numa_node(self, index: int) -> int | None:
        """The PCI device's NUMA node (sysfs ``numa_node``); None where unknown or -1."""
        ...

    def vfio_info(self, index: int) -> VfioInfo | None: ...
    def gpu_fabric_info(self, index: int) -> FabricInfo:
        """nvmlDeviceGetGpuFabricInfo; raises NotSupported on GPUs outside an NVLink fabric."""
        ...

    # MIG
    def mig_mode(self, index: int) -> tuple[bool, bool]:
        """(current, pending); raises NotSupported on GPUs without MIG."""
        ...

    def set_mig_mode(self, index: int, enabled: bool) -> None: ...
    def gpu_instance_profiles(self, index: int) -> list[GpuInstanceProfile]: ...
    def mig_devices(self, index: int) -> list[MigInstance]: ...
    def create_gpu_instance(
        self, index: int, profile_id: int, placement_start: int | None
    ) -> tuple[int, Placement]:
        """Returns the new GPU instance id and where it was placed."""
        ...

    def create_compute_instance(self, index: int, gi_id: int) -> tuple[int, str]:
        """The full-size compute instance; returns its id and the MIG device UUID."""
        ...

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None: ...
    def destroy_gpu_instance(self, index: int, gi_id: int) -> None: ...

    # events
    def unmonitored(self) -> dict[int, str]:
        """GPUs (index -> why) whose XID events could not be registered at init."""
        ...

    def wait_event(self, timeout_s: float) -> NvmlEvent | None:
        """Block up to ``timeout_s`` for an XID; None on timeout. GpuLost if a GPU fell off."""
        ...
