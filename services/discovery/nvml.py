"""The real NVML backend, through pynvml (package ``nvidia-ml-py``).

pynvml is imported when the backend is initialised, not when this module is
imported, so discovery loads (and runs simulated) on machines without the
NVIDIA library. Each attribute is read the way the reference driver reads it
(go-nvlib): brand/architecture strings, the PCI bus id without the leading
"0000" of NVML's 8-digit domain, the addressing mode only where the platform
supports it, MIG profiles from the GPU-instance profile table with their
possible placements, MIG devices walked by index. The PCIe root and the VFIO
facts come from sysfs (:mod:`services.discovery.sysfs`).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import logging
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from services.core.model.schemas import VfioInfo
from services.discovery import backend as nv
from services.discovery import nvmlabi, pciids, sysfs
from services.discovery.pciids import PciIds

log = logging.getLogger(__name__)
T = TypeVar("T")

# go-nvlib's names for nvmlBrandType_t and nvmlDeviceArchitecture_t values.
BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    0xFFFFFFFF: "Unknown",
}
ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}
# Compute-instance profile index of the CI that spans a GI of N compute slices.
FULL_CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
NO_INSTANCE = 0xFFFFFFFF  # NVML's "whole GPU" GI/CI id in events
MAX_PLACEMENTS = 16


def _load_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:  # pragma: no cover - the wheel is a dependency
        raise nv.LibraryNotFound(f"pynvml is not installed: {exc}") from exc


def binding_version() -> str:
    """The installed pynvml distribution and version, e.g. "nvidia-ml-py 13.615.71"."""
    try:
        return f"nvidia-ml-py {importlib.metadata.version('nvidia-ml-py')}"
    except importlib.metadata.PackageNotFoundError:
        return "pynvml (not from nvidia-ml-py)"


def format_bus_id(raw: str | bytes) -> str:
    """NVML's "00000000:3B:00.0" -> "0000:3b:00.0" (go-nvlib's GetPCIBusID)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    bus_id = text.split("\x00", 1)[0].lower()
    return bus_id[4:] if bus_id.startswith("0000") and len(bus_id) > 12 else bus_id


def profile_name(
    raw_name: str | bytes | None, slices: int, memory_mib: int, device_memory: int, nvml_index: int
) -> str:
    """The profile's name: NVML's own (v2 info) or go-nvlib's rule from the memory fraction."""
    if raw_name:
        text = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
        text = text.split("\x00", 1)[0].strip()
        if text:
            return text.removeprefix("MIG ").strip()
    one_gib = 1024**3
    fraction = math.ceil(memory_mib * 1024 * 1024 / device_memory * 8) / 8
    total_gb = (device_memory + one_gib - 1) // one_gib
    gb = math.floor(fraction * total_gb + 0.5)
    suffix = "+me" if nvml_index in (7, 8) else ""  # the *_REV1 profiles carry media extensions
    return f"{slices}g.{gb}gb{suffix}"


class NvmlBackend:
    """The Backend protocol over the host's NVML library."""

    name = "nvml"

    def __init__(
        self,
        sysfs_root: Path = Path("/sys"),
        dev_root: Path = Path("/dev"),
        pci_ids: PciIds | None = None,
    ) -> None:
        self.sysfs_root = sysfs_root
        self.dev_root = dev_root
        self.pci_ids = pci_ids or pciids.load()  # VFIO product names, as go-nvlib finds them
        self._nvml: ModuleType | None = None
        self._handles: dict[int, Any] = {}
        self._event_set: Any = None
        self._unmonitored: dict[int, str] = {}
        self.binding = binding_version()

    # ------------------------------------------------------------ calls

    @property
    def lib(self) -> ModuleType:
        if self._nvml is None:
            raise nv.Uninitialized("NVML backend used before init()")
        return self._nvml

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Call pynvml, turning its NVMLError into our hierarchy."""
        try:
            return fn(*args)
        except self.lib.NVMLError as exc:
            raise nv.error_for_code(int(exc.value), str(exc)) from exc

    def _read(self, layout: type[nvmlabi.S], filled: Any) -> nvmlabi.S:
        """A struct pynvml returned, read as nvml.h lays it out (never by pynvml's fields)."""
        return nvmlabi.read(layout, filled, self.binding)

    def _device(self, address: int | None) -> Any:
        """An nvmlDevice_t read from a struct, as the handle pynvml's calls take."""
        if not address:
            raise nv.NvmlError("NVML returned a null device handle")
        return ctypes.cast(ctypes.c_void_p(address), self.lib.c_nvmlDevice_t)

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._call(self.lib.nvmlDeviceGetHandleByIndex, index)
        return self._handles[index]

    # ------------------------------------------------------------ lifecycle

    def init(self) -> None:
        lib = _load_pynvml()
        try:
            lib.nvmlInitWithFlags(lib.NVML_INIT_FLAG_NO_GPUS)
        except lib.NVMLError as exc:
            raise nv.error_for_code(int(exc.value), f"nvmlInit: {exc}") from exc
        self._nvml = lib
        self._handles.clear()
        self._register_events()

    def shutdown(self) -> None:
        if self._nvml is None:
            return
        if self._event_set is not None:
            try:
                self._call(self.lib.nvmlEventSetFree, self._event_set)
            except nv.NvmlError as exc:
                log.warning("freeing the NVML event set failed", extra={"error": str(exc)})
            self._event_set = None
        self._call(self.lib.nvmlShutdown)
        self._nvml = None

    # ------------------------------------------------------------ system

    def driver_version(self) -> str:
        return str(self._call(self.lib.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> int:
        return int(self._call(self.lib.nvmlSystemGetCudaDriverVersion))

    def device_count(self) -> int:
        return int(self._call(self.lib.nvmlDeviceGetCount))

    # ------------------------------------------------------------ per device

    def uuid(self, index: int) -> str:
        return str(self._call(self.lib.nvmlDeviceGetUUID, self._handle(index)))

    def minor(self, index: int) -> int:
        return int(self._call(self.lib.nvmlDeviceGetMinorNumber, self._handle(index)))

    def product_name(self, index: int) -> str:
        return str(self._call(self.lib.nvmlDeviceGetName, self._handle(index)))

    def brand(self, index: int) -> str:
        value = int(self._call(self.lib.nvmlDeviceGetBrand, self._handle(index)))
        if value not in BRANDS:
            raise nv.NvmlError(f"unknown brand type {value}")
        return BRANDS[value]

    def architecture(self, index: int) -> str:
        value = int(self._call(self.lib.nvmlDeviceGetArchitecture, self._handle(index)))
        if value not in ARCHITECTURES:
            raise nv.NvmlError(f"unknown architecture {value}")
        return ARCHITECTURES[value]

    def cuda_compute_capability(self, index: int) -> tuple[int, int]:
        major, minor = self._call(self.lib.nvmlDeviceGetCudaComputeCapability, self._handle(index))
        return int(major), int(minor)

    def memory_total(self, index: int) -> int:
        info = self._call(self.lib.nvmlDeviceGetMemoryInfo, self._handle(index))
        return int(self._read(nvmlabi.Memory, info).total)

    def pci_info(self, index: int) -> nv.PciInfo:
        info = self._read(
            nvmlabi.PciInfo, self._call(self.lib.nvmlDeviceGetPciInfo, self._handle(index))
        )
        combined = int(info.pciDeviceId)  # device id << 16 | vendor id
        return nv.PciInfo(
            bus_id=format_bus_id(nvmlabi.c_string(info.busId)),
            device_id=combined >> 16,
            vendor_id=combined & 0xFFFF,
        )

    def addressing_mode(self, index: int) -> str | None:
        try:
            value = self._call(self.lib.nvmlDeviceGetAddressingMode, self._handle(index))
        except (nv.NotSupported, nv.FunctionNotFound):
            return None  # not a coherent platform, or a driver without the call
        return ADDRESSING_MODES.get(int(value))

    def pcie_root(self, index: int) -> str | None:
        return sysfs.pcie_root(self.pci_info(index).bus_id, self.sysfs_root)

    def numa_node(self, index: int) -> int | None:
        return sysfs.numa_node(self.pci_info(index).bus_id, self.sysfs_root)

    def vfio_info(self, index: int) -> VfioInfo | None:
        bus_id = self.pci_info(index).bus_id
        return sysfs.vfio_info(bus_id, self.sysfs_root, self.dev_root, self.pci_ids)

    def gpu_fabric_info(self, index: int) -> nv.FabricInfo:
        """nvmlDeviceGetGpuFabricInfo, the call go-nvlib's IsFabricAttached makes.

        Into nvml.h's struct, not pynvml's: before 13.615 pynvml's was 92 bytes with
        the fields after the UUID 64 bytes late (see :mod:`nvmlabi`).
        """
        info = nvmlabi.GpuFabricInfo()
        self._call(self.lib.nvmlDeviceGetGpuFabricInfo, self._handle(index), ctypes.byref(info))
        return nv.FabricInfo(
            cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
            state=int(info.state),
            status=int(info.status),
        )

    # ------------------------------------------------------------ MIG queries

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        current, pending = self._call(self.lib.nvmlDeviceGetMigMode, self._handle(index))
        enable = self.lib.NVML_DEVICE_MIG_ENABLE
        return current == enable, pending == enable

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        lib = self.lib
        mode = lib.NVML_DEVICE_MIG_ENABLE if enabled else lib.NVML_DEVICE_MIG_DISABLE
        status = self._call(lib.nvmlDeviceSetMigMode, self._handle(index), mode)
        if status:  # the activation status: e.g. in use by another client
            raise nv.error_for_code(int(status), f"GPU {index}: MIG mode change not activated")

    def gpu_instance_profiles(self, index: int) -> list[nv.GpuInstanceProfile]:
        return [p for p, _ in self._profiles(index)]

    def _profiles(self, index: int) -> list[tuple[nv.GpuInstanceProfile, Any]]:
        """Every GI profile the GPU supports, with NVML's info struct."""
        lib, handle = self.lib, self._handle(index)
        device_memory = self.memory_total(index)
        out = []
        for nvml_index in range(lib.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info, name = self._profile_info(handle, nvml_index)
            except (nv.NotSupported, nv.InvalidArgument):
                continue
            try:
                placements = self._placements(handle, int(info.id))
            except (nv.NotSupported, nv.InvalidArgument):
                continue
            slices = int(info.sliceCount)
            profile = nv.GpuInstanceProfile(
                name=profile_name(
                    name,
                    slices,
                    int(info.memorySizeMB),
                    device_memory,
                    nvml_index,
                ),
                id=int(info.id),
                ci_profile=FULL_CI_PROFILE.get(slices, 0),
                slices=slices,
                memory_mib=int(info.memorySizeMB),
                multiprocessors=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                encoders=int(info.encoderCount),
                jpeg_engines=int(info.jpegCount),
                ofa_engines=int(info.ofaCount),
                instance_count=int(info.instanceCount),
                placements=placements,
            )
            out.append((profile, info))
        return out

    def _profile_info(
        self, handle: Any, nvml_index: int
    ) -> tuple[nvmlabi.GpuInstanceProfileInfo | nvmlabi.GpuInstanceProfileInfoV2, bytes | None]:
        """The profile's info struct and NVML's name for it (None before the v2 struct)."""
        lib = self.lib
        try:
            info = self._call(lib.nvmlDeviceGetGpuInstanceProfileInfo, handle, nvml_index, 2)
        except nv.FunctionNotFound:  # drivers before the v2 struct (no name field)
            info = self._call(lib.nvmlDeviceGetGpuInstanceProfileInfo, handle, nvml_index, 1)
            return self._read(nvmlabi.GpuInstanceProfileInfo, info), None
        v2 = self._read(nvmlabi.GpuInstanceProfileInfoV2, info)
        return v2, bytes(v2.name)

    def _placements(self, handle: Any, profile_id: int) -> tuple[nv.Placement, ...]:
        lib = self.lib
        array = (nvmlabi.GpuInstancePlacement * MAX_PLACEMENTS)()
        count = ctypes.c_uint(MAX_PLACEMENTS)
        self._call(
            lib.nvmlDeviceGetGpuInstancePossiblePlacements,
            handle,
            profile_id,
            array,
            ctypes.byref(count),
        )
        return tuple(nv.Placement(int(p.start), int(p.size)) for p in array[: count.value])

    def mig_devices(self, index: int) -> list[nv.MigInstance]:
        lib, handle = self.lib, self._handle(index)
        out = []
        for slot in range(int(self._call(lib.nvmlDeviceGetMaxMigDeviceCount, handle))):
            try:
                mig = self._call(lib.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            except (nv.NotFound, nv.InvalidArgument):
                continue  # an empty slot
            gi_id = int(self._call(lib.nvmlDeviceGetGpuInstanceId, mig))
            ci_id = int(self._call(lib.nvmlDeviceGetComputeInstanceId, mig))
            gi = self._call(lib.nvmlDeviceGetGpuInstanceById, handle, gi_id)
            info = self._gi_info(gi)
            out.append(
                nv.MigInstance(
                    gi_id=gi_id,
                    ci_id=ci_id,
                    gi_profile_id=int(info.profileId),
                    placement=nv.Placement(int(info.placement.start), int(info.placement.size)),
                    uuid=str(self._call(lib.nvmlDeviceGetUUID, mig)),
                )
            )
        return out

    # ------------------------------------------------------------ MIG changes

    def create_gpu_instance(
        self, index: int, profile_id: int, placement_start: int | None
    ) -> tuple[int, nv.Placement]:
        lib, handle = self.lib, self._handle(index)
        profile = next((p for p, _ in self._profiles(index) if p.id == profile_id), None)
        if profile is None:
            raise nv.InvalidArgument(f"GPU {index}: no GPU instance profile id {profile_id}")
        if placement_start is None:
            gi = self._call(lib.nvmlDeviceCreateGpuInstance, handle, profile_id)
        else:
            size = profile.placements[0].size if profile.placements else 1
            placement = nvmlabi.GpuInstancePlacement(placement_start, size)
            gi = self._call(
                lib.nvmlDeviceCreateGpuInstanceWithPlacement,
                handle,
                profile_id,
                ctypes.byref(placement),
            )
        info = self._gi_info(gi)
        return int(info.id), nv.Placement(int(info.placement.start), int(info.placement.size))

    def _gi_info(self, gi: Any) -> nvmlabi.GpuInstanceInfo:
        return self._read(nvmlabi.GpuInstanceInfo, self._call(self.lib.nvmlGpuInstanceGetInfo, gi))

    def create_compute_instance(self, index: int, gi_id: int) -> tuple[int, str]:
        lib, handle = self.lib, self._handle(index)
        gi = self._call(lib.nvmlDeviceGetGpuInstanceById, handle, gi_id)
        gi_info = self._gi_info(gi)
        profile = next(
            (p for p, _ in self._profiles(index) if p.id == int(gi_info.profileId)), None
        )
        if profile is None:
            raise nv.NotFound(f"GPU {index} GI {gi_id}: unknown profile {gi_info.profileId}")
        ci_profile = self._read(
            nvmlabi.ComputeInstanceProfileInfoV2,
            self._call(
                lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                profile.ci_profile,
                lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            ),
        )
        ci = self._call(lib.nvmlGpuInstanceCreateComputeInstance, gi, int(ci_profile.id))
        ci_info = self._read(
            nvmlabi.ComputeInstanceInfo, self._call(lib.nvmlComputeInstanceGetInfo, ci)
        )
        # The CI's own device handle gives the UUID without walking every MIG slot.
        mig = self._device(ci_info.device)
        return int(ci_info.id), str(self._call(lib.nvmlDeviceGetUUID, mig))

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        lib = self.lib
        gi = self._call(lib.nvmlDeviceGetGpuInstanceById, self._handle(index), gi_id)
        ci = self._call(lib.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id)
        self._call(lib.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        lib = self.lib
        gi = self._call(lib.nvmlDeviceGetGpuInstanceById, self._handle(index), gi_id)
        self._call(lib.nvmlGpuInstanceDestroy, gi)

    # ------------------------------------------------------------ events

    def _register_events(self) -> None:
        """XID critical errors of every GPU into one event set; GPUs that refuse are unmonitored.

        As the reference's health monitor: a GPU whose handle, supported event
        types or registration fails (NOT_SUPPORTED: too old) is unmonitored.
        """
        lib = self.lib
        self._unmonitored = {}
        try:
            count = self.device_count()
        except nv.NvmlError as exc:
            log.warning("NVML events unavailable: no device count", extra={"error": str(exc)})
            return
        try:
            self._event_set = self._call(lib.nvmlEventSetCreate)
        except nv.NvmlError as exc:
            log.warning("NVML events unavailable; every GPU unmonitored", extra={"error": str(exc)})
            self._unmonitored = dict.fromkeys(range(count), f"event set: {exc}")
            return
        for index in range(count):
            try:
                handle = self._handle(index)
                supported = int(self._call(lib.nvmlDeviceGetSupportedEventTypes, handle))
                mask = lib.nvmlEventTypeXidCriticalError & supported
                if not mask:
                    raise nv.NotSupported("the GPU reports no XID critical error events")
                self._call(lib.nvmlDeviceRegisterEvents, handle, mask, self._event_set)
            except nv.NvmlError as exc:
                log.warning(
                    "XID events not registered; unmonitored",
                    extra={"gpu": index, "error": str(exc)},
                )
                self._unmonitored[index] = str(exc)

    def unmonitored(self) -> dict[int, str]:
        return dict(self._unmonitored)

    def wait_event(self, timeout_s: float) -> nv.NvmlEvent | None:
        if self._event_set is None:
            time.sleep(timeout_s)
            return None
        lib = self.lib
        try:
            raw = self._call(lib.nvmlEventSetWait_v2, self._event_set, int(timeout_s * 1000))
        except nv.Timeout:
            return None
        data = self._read(nvmlabi.EventData, raw)
        if not int(data.eventType) & lib.nvmlEventTypeXidCriticalError:
            return None
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return nv.NvmlEvent(
            gpu_uuid=str(self._call(lib.nvmlDeviceGetUUID, self._device(data.device))),
            xid=int(data.eventData),
            gi_id=None if gi == NO_INSTANCE else gi,
            ci_id=None if ci == NO_INSTANCE else ci,
            timestamp=time.time(),
        )
