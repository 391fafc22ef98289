"""A pynvml stand-in over the simulated NVML, and the sysfs it implies.

The real (pynvml) backend runs against it in unit and integration tests.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from services.discovery import backend as nv
from services.discovery.models import MIB, get_model
from services.discovery.nvml import ARCHITECTURES, BRANDS
from services.discovery.sim import SimNvml


class FakeNvml:
    """pynvml's C calls, answered by a simulated node."""

    def __init__(self, sim: SimNvml) -> None:
        self.sim = sim
        self.v2_names = True

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
    def nvmlDeviceGetUUID(self, h: tuple[Any, ...]) -> str:
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

    def nvmlDeviceGetMemoryInfo(self, h: tuple[str, int]) -> Any:
        return SimpleNamespace(total=self._run(self.sim.memory_total, h[1]))

    def nvmlDeviceGetPciInfo(self, h: tuple[str, int]) -> Any:
        info = self._run(self.sim.pci_info, h[1])
        return SimpleNamespace(
            busId=("0000" + info.bus_id).upper().encode(),  # NVML: 8-digit domain, upper case
            pciDeviceId=info.device_id << 16 | info.vendor_id,
        )

    def nvmlDeviceGetGpuFabricInfo(self, h: tuple[str, int], ref: Any) -> int:
        info = self._run(self.sim.gpu_fabric_info, h[1])
        out = ref._obj  # pynvml passes ctypes.byref(c_nvmlGpuFabricInfo_t())
        out.clusterUuid[:] = list(uuid.UUID(info.cluster_uuid).bytes)
        out.cliqueId, out.state, out.status = info.clique_id, info.state, info.status
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
        info = SimpleNamespace(
            id=p.id,
            sliceCount=p.slices,
            instanceCount=p.instances,
            multiprocessorCount=p.multiprocessors,
            copyEngineCount=p.copy_engines,
            decoderCount=p.decoders,
            encoderCount=p.encoders,
            jpegCount=p.jpeg_engines,
            ofaCount=p.ofa_engines,
            memorySizeMB=p.memory_mib,
        )
        if v == 2:
            info.name = f"MIG {p.name}"
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, h: tuple[str, int], profile_id: int, array: Any, count: Any
    ) -> int:
        profile = next(p for p in self.sim.gpu_instance_profiles(h[1]) if p.id == profile_id)
        assert count._obj.value >= len(profile.placements)
        for slot, pl in enumerate(profile.placements):
            array[slot].start, array[slot].size = pl.start, pl.size
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
        return SimpleNamespace(
            id=g.id, profileId=g.profile_id, placement=SimpleNamespace(start=g.start, size=g.size)
        )

    def nvmlDeviceCreateGpuInstance(self, h: tuple[str, int], profile_id: int) -> Any:
        gi_id, _ = self._run(self.sim.create_gpu_instance, h[1], profile_id, None)
        return ("gi", h[1], gi_id)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, h: tuple[str, int], profile_id: int, placement: Any
    ) -> Any:
        start = placement._obj.start
        gi_id, _ = self._run(self.sim.create_gpu_instance, h[1], profile_id, start)
        return ("gi", h[1], gi_id)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: Any, ci: int, eng: int) -> Any:
        assert eng == pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        return SimpleNamespace(id=ci)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: tuple[Any, ...], ci_profile: int) -> Any:
        ci_id, _ = self._run(self.sim.create_compute_instance, gi[1], gi[2])
        return ("ci", gi[1], gi[2], ci_id)

    def nvmlComputeInstanceGetInfo(self, ci: tuple[Any, ...]) -> Any:
        return SimpleNamespace(id=ci[3], device=("mig", ci[1], ci[2], ci[3]))

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
        return SimpleNamespace(
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=event.xid,
            gpuInstanceId=none if event.gi_id is None else event.gi_id,
            computeInstanceId=none if event.ci_id is None else event.ci_id,
            device=("gpu", index),
        )


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
