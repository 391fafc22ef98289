"""A pynvml stand-in over the simulated NVML, and the sysfs it implies.

The real (pynvml) backend runs against it in unit and integration tests. Each
call that returns or fills a struct does what pynvml's wrapper and NVML do
together: the struct is the binding's own class (whatever ``pynvml`` holds at
the time, so a test can install another release's layouts), and its bytes are
written as nvml.h lays them out (the ``struct`` formats below, from nvml.h for
Linux's LP64 ABI), never through the binding's field names.
"""

from __future__ import annotations

import ctypes
import os
import struct
import uuid
from pathlib import Path
from typing import Any

import pynvml
import pytest

from services.discovery import backend as nv
from services.discovery.models import MIB, get_model
from services.discovery.nvml import ARCHITECTURES, BRANDS
from services.discovery.sim import SimNvml

# nvml.h's structs as NVML writes them (little-endian, LP64: pointers and
# unsigned long long 8 bytes, natural alignment spelled out as padding).
PCI_INFO = "<16s5I32s"  # nvmlPciInfo_t: busIdLegacy, domain, bus, device, pciDeviceId, sub, busId
MEMORY = "<3Q"  # nvmlMemory_t: total, free, used
GI_PROFILE_V1 = "<10IQ"  # nvmlGpuInstanceProfileInfo_t: id .. ofaCount, memorySizeMB
GI_PROFILE_V2 = "<11I4xQ96s"  # _v2_t: version, id .. ofaCount, (pad), memorySizeMB, name
PLACEMENT = "<2I"  # nvmlGpuInstancePlacement_t: start, size
GI_INFO = "<Q4I"  # nvmlGpuInstanceInfo_t: device, id, profileId, placement
CI_PROFILE_V2 = "<10I96s"  # nvmlComputeInstanceProfileInfo_v2_t: version, id .. sharedOfa, name
CI_INFO = "<2Q4I"  # nvmlComputeInstanceInfo_t: device, gpuInstance, id, profileId, placement
EVENT_DATA = "<3Q2I"  # nvmlEventData_t: device, eventType, eventData, gpuInstanceId, ciId
FABRIC_INFO = "<16s2IB3x"  # nvmlGpuFabricInfo_t: clusterUuid, status, cliqueId, state (uchar)


def nvml_writes(target: Any, payload: bytes) -> None:
    """NVML filling ``target`` (a ctypes object) with ``payload`` from its first byte."""
    room = ctypes.sizeof(target)
    assert room >= len(payload), (
        f"NVML writes {len(payload)} bytes into a {room}-byte {type(target).__name__}"
    )
    ctypes.memmove(ctypes.addressof(target), payload, len(payload))


def filled(struct_type: Any, payload: bytes) -> Any:
    """What a pynvml wrapper returns: its own struct, as NVML filled it."""
    out = struct_type()
    nvml_writes(out, payload)
    return out


class FakeNvml:
    """pynvml's C calls, answered by a simulated node."""

    def __init__(self, sim: SimNvml) -> None:
        self.sim = sim
        self.v2_names = True
        # Handles NVML puts into structs (nvmlDevice_t and the like) are pointers; these
        # stand-in addresses are never dereferenced, only mapped back to the handle.
        self._addresses: dict[tuple[Any, ...], int] = {}

    def address(self, handle: tuple[Any, ...]) -> int:
        return self._addresses.setdefault(handle, 0x1000 + 0x10 * len(self._addresses))

    def _resolve(self, handle: Any) -> tuple[Any, ...]:
        """A handle as the backend hands it back: ours, or a pointer read from a struct."""
        if isinstance(handle, tuple):
            return handle
        address = ctypes.cast(handle, ctypes.c_void_p).value
        return next(h for h, a in self._addresses.items() if a == address)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def _run(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except nv.NvmlError as exc:
            raise pynvml.NVMLError(exc.code) from exc

    def _spec(self, i: int, nvml_index: int) -> Any:
        model = get_model(self.sim.state.gpus[i].model)
        if model.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for p in model.mig.profiles:
            if p.nvml_profile == nvml_index:
                return p
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    # system
    def nvmlInitWithFlags(self, flags: int) -> None:
        assert flags == pynvml.NVML_INIT_FLAG_NO_GPUS

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.sim.driver_version()

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.sim.cuda_driver_version()

    def nvmlDeviceGetCount(self) -> int:
        return self.sim.device_count()

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple[str, int]:
        return ("gpu", i)

    # devices
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        h = self._resolve(handle)
        if h[0] == "mig":
            return next(m.uuid for m in self.sim.mig_devices(h[1]) if (m.gi_id, m.ci_id) == h[2:])
        return str(self._run(self.sim.uuid, h[1]))

    def nvmlDeviceGetMinorNumber(self, h: tuple[str, int]) -> int:
        return int(self._run(self.sim.minor, h[1]))

    def nvmlDeviceGetName(self, h: tuple[str, int]) -> str:
        return str(self._run(self.sim.product_name, h[1]))

    def nvmlDeviceGetBrand(self, h: tuple[str, int]) -> int:
        name = self._run(self.sim.brand, h[1])
        return next(k for k, v in BRANDS.items() if v == name)

    def nvmlDeviceGetArchitecture(self, h: tuple[str, int]) -> int:
        name = self._run(self.sim.architecture, h[1])
        return next(k for k, v in ARCHITECTURES.items() if v == name)

    def nvmlDeviceGetCudaComputeCapability(self, h: tuple[str, int]) -> tuple[int, int]:
        major, minor = self._run(self.sim.cuda_compute_capability, h[1])
        return major, minor

    def nvmlDeviceGetMemoryInfo(self, h: tuple[str, int], version: Any = None) -> Any:
        assert version is None  # the v1 struct, as the backend asks
        total = self._run(self.sim.memory_total, h[1])
        return filled(pynvml.c_nvmlMemory_t, struct.pack(MEMORY, total, total, 0))

    def nvmlDeviceGetPciInfo(self, h: tuple[str, int]) -> Any:
        info = self._run(self.sim.pci_info, h[1])
        domain, bus, rest = info.bus_id.split(":")
        device = rest.split(".")[0]
        payload = struct.pack(
            PCI_INFO,
            f"{int(domain, 16):04X}:{int(bus, 16):02X}:{int(device, 16):02X}.0".encode(),
            int(domain, 16),
            int(bus, 16),
            int(device, 16),
            info.device_id << 16 | info.vendor_id,
            0,
            ("0000" + info.bus_id).upper().encode(),  # NVML: 8-digit domain, upper case
        )
        return filled(pynvml.nvmlPciInfo_t, payload)

    def nvmlDeviceGetGpuFabricInfo(self, h: tuple[str, int], ref: Any) -> int:
        info = self._run(self.sim.gpu_fabric_info, h[1])
        payload = struct.pack(
            FABRIC_INFO, uuid.UUID(info.cluster_uuid).bytes, info.status, info.clique_id, info.state
        )
        nvml_writes(ref._obj, payload)  # the caller passes ctypes.byref(its struct)
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetAddressingMode(self, h: tuple[str, int]) -> int:
        mode = self._run(self.sim.addressing_mode, h[1])
        if mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return {"None": 0, "HMM": 1, "ATS": 2}[mode]  # NVML's DEVICE_ADDRESSING_MODE_*

    # MIG
    def nvmlDeviceGetMigMode(self, h: tuple[str, int]) -> list[int]:
        current, pending = self._run(self.sim.mig_mode, h[1])
        return [int(current), int(pending)]

    def nvmlDeviceSetMigMode(self, h: tuple[str, int], mode: int) -> int:
        self._run(self.sim.set_mig_mode, h[1], mode == pynvml.NVML_DEVICE_MIG_ENABLE)
        return 0

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: tuple[str, int], idx: int, v: int = 2) -> Any:
        if v == 2 and not self.v2_names:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        p = self._spec(h[1], idx)
        counts = (
            p.id,
            0,  # isP2pSupported
            p.slices,
            p.instances,
            p.multiprocessors,
            p.copy_engines,
            p.decoders,
            p.encoders,
            p.jpeg_engines,
            p.ofa_engines,
        )
        if v == 1:
            payload = struct.pack(GI_PROFILE_V1, *counts, p.memory_mib)
            return filled(pynvml.c_nvmlGpuInstanceProfileInfo_t, payload)
        version = pynvml.nvmlGpuInstanceProfileInfo_v2
        payload = struct.pack(
            GI_PROFILE_V2, version, *counts, p.memory_mib, f"MIG {p.name}".encode()
        )
        return filled(pynvml.c_nvmlGpuInstanceProfileInfo_v2_t, payload)

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, h: tuple[str, int], profile_id: int, array: Any, count: Any
    ) -> int:
        profile = next(p for p in self.sim.gpu_instance_profiles(h[1]) if p.id == profile_id)
        assert count._obj.value >= len(profile.placements)
        payload = b"".join(struct.pack(PLACEMENT, pl.start, pl.size) for pl in profile.placements)
        nvml_writes(array, payload)
        count._obj.value = len(profile.placements)
        return 0

    def nvmlDeviceGetMaxMigDeviceCount(self, h: tuple[str, int]) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: tuple[str, int], slot: int) -> Any:
        devices = self._run(self.sim.mig_devices, h[1])
        if slot >= len(devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", h[1], devices[slot].gi_id, devices[slot].ci_id)

    def nvmlDeviceGetGpuInstanceId(self, m: tuple[Any, ...]) -> int:
        return int(m[2])

    def nvmlDeviceGetComputeInstanceId(self, m: tuple[Any, ...]) -> int:
        return int(m[3])

    def nvmlDeviceGetGpuInstanceById(self, h: tuple[str, int], gi_id: int) -> Any:
        gpu = self.sim.state.gpus[h[1]]
        if not gpu.mig_enabled:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if all(g.id != gi_id for g in gpu.gpu_instances):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("gi", h[1], gi_id)

    def nvmlGpuInstanceGetInfo(self, gi: tuple[Any, ...]) -> Any:
        g = next(g for g in self.sim.state.gpus[gi[1]].gpu_instances if g.id == gi[2])
        device = self.address(("gpu", gi[1]))
        payload = struct.pack(GI_INFO, device, g.id, g.profile_id, g.start, g.size)
        return filled(pynvml.c_nvmlGpuInstanceInfo_t, payload)

    def nvmlDeviceCreateGpuInstance(self, h: tuple[str, int], profile_id: int) -> Any:
        gi_id, _ = self._run(self.sim.create_gpu_instance, h[1], profile_id, None)
        return ("gi", h[1], gi_id)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, h: tuple[str, int], profile_id: int, placement: Any
    ) -> Any:
        start, _size = struct.unpack_from(PLACEMENT, bytes(placement._obj))  # as NVML reads it
        gi_id, _ = self._run(self.sim.create_gpu_instance, h[1], profile_id, start)
        return ("gi", h[1], gi_id)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: Any, ci: int, eng: int) -> Any:
        assert eng == pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        version = pynvml.nvmlComputeInstanceProfileInfo_v2
        payload = struct.pack(CI_PROFILE_V2, version, ci, 0, 0, 0, 0, 0, 0, 0, 0, b"")
        return filled(pynvml.c_nvmlComputeInstanceProfileInfo_v2_t, payload)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: tuple[Any, ...], ci_profile: int) -> Any:
        ci_id, _ = self._run(self.sim.create_compute_instance, gi[1], gi[2])
        return ("ci", gi[1], gi[2], ci_id)

    def nvmlComputeInstanceGetInfo(self, ci: tuple[Any, ...]) -> Any:
        device = self.address(("mig", ci[1], ci[2], ci[3]))
        gpu_instance = self.address(("gi", ci[1], ci[2]))
        payload = struct.pack(CI_INFO, device, gpu_instance, ci[3], 0, 0, 0)
        return filled(pynvml.c_nvmlComputeInstanceInfo_t, payload)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: tuple[Any, ...], ci_id: int) -> Any:
        return ("ci", gi[1], gi[2], ci_id)

    def nvmlComputeInstanceDestroy(self, ci: tuple[Any, ...]) -> None:
        self._run(self.sim.destroy_compute_instance, ci[1], ci[2], ci[3])

    def nvmlGpuInstanceDestroy(self, gi: tuple[Any, ...]) -> None:
        self._run(self.sim.destroy_gpu_instance, gi[1], gi[2])

    # events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, es: str) -> None:
        pass

    def nvmlDeviceGetSupportedEventTypes(self, h: tuple[str, int]) -> int:
        return int(pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypePState)

    def nvmlDeviceRegisterEvents(self, h: tuple[str, int], mask: int, es: str) -> None:
        assert mask == pynvml.nvmlEventTypeXidCriticalError
        if not self.sim.state.gpus[h[1]].xid_events:  # too old to support health checking
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        self.sim.load(self.sim.state)  # pick up XIDs injected since the last wait
        event = self.sim.wait_event(timeout_ms / 1000)
        if event is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        index = next(g.index for g in self.sim.state.gpus if g.uuid == event.gpu_uuid)
        none = 0xFFFFFFFF
        payload = struct.pack(
            EVENT_DATA,
            self.address(("gpu", index)),
            pynvml.nvmlEventTypeXidCriticalError,
            event.xid,
            none if event.gi_id is None else event.gi_id,
            none if event.ci_id is None else event.ci_id,
        )
        return filled(pynvml.c_nvmlEventData_t, payload)


def fake_sysfs(root: Path, sim: SimNvml) -> tuple[Path, Path]:
    """/sys and /dev trees for the simulated node's GPUs, laid out like Linux's."""
    sys_root, dev_root = root / "sys", root / "dev"
    (sys_root / "bus" / "pci" / "devices").mkdir(parents=True)
    (sys_root / "kernel" / "iommu_groups").mkdir(parents=True)
    dev_root.mkdir()
    if sim.state.iommu_fd:
        (dev_root / "iommu").touch()
    for gpu in sim.state.gpus:
        model = get_model(gpu.model)
        device = sys_root / "devices" / str(gpu.pcie_root) / "0000:00:01.0" / gpu.pci_bus_id
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x10de\n")
        (device / "device").write_text(f"0x{model.pci_device_id:04x}\n")
        (device / "numa_node").write_text(f"{gpu.numa_node}\n")
        bar1 = model.addressable_memory_mib * MIB // 2
        (device / "resource").write_text(
            "0x00000000ac000000 0x00000000acffffff 0x0000000000040200\n"
            f"0x0000380000000000 0x{0x380000000000 + bar1 - 1:016x} 0x000000000014220c\n"
            "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
            "0x0000382000000000 0x0000382001ffffff 0x000000000014220c\n"
        )
        group = sys_root / "kernel" / "iommu_groups" / str(gpu.iommu_group)
        group.mkdir()
        os.symlink(os.path.relpath(group, device), device / "iommu_group")
        link = sys_root / "bus" / "pci" / "devices" / gpu.pci_bus_id
        os.symlink(os.path.relpath(device, link.parent), link)
    return sys_root, dev_root
