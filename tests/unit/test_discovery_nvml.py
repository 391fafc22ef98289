"""The pynvml backend, driven through pynvml's real module with its C calls answered by the sim.

There is no GPU here, so every pynvml function the backend calls is replaced
by one that answers from a simulated node, in pynvml's own shapes (handles,
ctypes structs, NVMLError codes). Both backends must then yield the same
inventory: that is what "one interface, two implementations" promises.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pynvml
import pytest

from services.discovery import backend as nv
from services.discovery import mig, pciids, sysfs
from services.discovery.fleet import get_fleet
from services.discovery.inventory import scan
from services.discovery.models import MIB, get_model
from services.discovery.nvml import ARCHITECTURES, BRANDS, NvmlBackend, format_bus_id
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

    def nvmlDeviceGetAddressingMode(self, h: tuple[str, int]) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

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


@pytest.fixture
def sim() -> SimNvml:
    s = SimNvml.boot("node-a", get_fleet("mixed"), 3)
    s.init()
    return s


@pytest.fixture
def real(sim: SimNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> NvmlBackend:
    FakeNvml(sim).install(monkeypatch)
    # The simulator names VFIO twins from the built-in pci.ids subset; so does this backend here.
    backend = NvmlBackend(*fake_sysfs(tmp_path, sim), pciids.builtin())
    backend.init()
    return backend


def without_backend_name(inv: Any) -> Any:
    return msgspec.structs.replace(inv, backend="")


def test_both_backends_give_the_same_inventory(sim: SimNvml, real: NvmlBackend) -> None:
    simulated = scan(sim, "node-a").inventory
    from_pynvml = scan(real, "node-a").inventory
    assert from_pynvml.backend == "nvml"
    assert all(g.error is None and g.vfio is not None for g in from_pynvml.gpus)
    assert without_backend_name(from_pynvml) == without_backend_name(simulated)
    assert [g.numa_node for g in from_pynvml.gpus] == [0, 0, 1, 1]  # mixed.yaml, via sysfs


def test_vfio_twins_are_named_from_the_pci_database_the_backend_was_given(
    sim: SimNvml, real: NvmlBackend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    names = [g.vfio.product_name for g in scan(real, "node-a").inventory.gpus if g.vfio]
    assert names == [
        "GH100 [H100 SXM5 80GB]",
        "GA100 [A100 SXM4 80GB]",
        "GH100 [H200 SXM 141GB]",
        "AD104GL [L4]",
    ]
    other = tmp_path / "pci.ids"
    other.write_text("10de  NVIDIA Corporation\n\t2330  GH100[H100 SXM5 80GB]\n")
    backend = NvmlBackend(*fake_sysfs(tmp_path / "again", sim), pciids.from_file(other))
    backend.init()
    twins = [g.vfio for g in scan(backend, "node-a").inventory.gpus]
    assert [t.product_name if t else None for t in twins] == [
        "GH100[H100 SXM5 80GB]",  # Debian bookworm's spelling
        "UNKNOWN_DEVICE",  # what go-nvlib says for an id its database lacks
        "UNKNOWN_DEVICE",
        "UNKNOWN_DEVICE",
    ]


def test_gpus_whose_xid_events_cannot_be_registered_are_unmonitored(
    sim: SimNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from services.discovery.health import HealthTracker

    sim.state.gpus[2].xid_events = False
    FakeNvml(sim).install(monkeypatch)
    real = NvmlBackend(*fake_sysfs(tmp_path, sim), pciids.builtin())
    real.init()
    assert set(real.unmonitored()) == set(sim.unmonitored()) == {2}
    assert "NVML_ERROR_NOT_SUPPORTED" in real.unmonitored()[2]
    for backend in (real, sim):
        result = scan(backend, "node-a")
        assert result.unmonitored == {2}
        inventory, events = HealthTracker("node-a").on_scan(result)
        assert [g.health.unmonitored for g in inventory.gpus] == [False, False, True, False]
        assert events == []

    def no_event_set() -> str:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlEventSetCreate", no_event_set)
    blind = NvmlBackend(*fake_sysfs(tmp_path / "again", sim), pciids.builtin())
    blind.init()
    assert set(blind.unmonitored()) == {0, 1, 2, 3}  # no health checking at all
    assert blind.wait_event(0) is None


def test_profile_names_without_nvml_v2_follow_go_nvlib(
    sim: SimNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = FakeNvml(sim)
    fake.v2_names = False
    fake.install(monkeypatch)
    backend = NvmlBackend(*fake_sysfs(tmp_path, sim))
    backend.init()
    for i in range(3):
        assert backend.gpu_instance_profiles(i) == sim.gpu_instance_profiles(i)


def test_mig_create_and_destroy_through_pynvml(sim: SimNvml, real: NvmlBackend) -> None:
    dev = mig.create(real, 2, "2g.35gb", 4)  # H200, MIG mode off until now
    assert (dev.gi_id, dev.ci_id, dev.placement.start) == (5, 0, 4)
    assert sim.mig_mode(2) == (True, True)
    assert (
        [m.uuid for m in real.mig_devices(2)] == [dev.uuid] == [m.uuid for m in sim.mig_devices(2)]
    )
    with pytest.raises(nv.InsufficientResources):
        mig.create(real, 2, "2g.35gb", 4)
    with pytest.raises(nv.InvalidArgument):
        mig.create(real, 2, "2g.35gb", 5)
    mig.destroy(real, 2, dev.gi_id, dev.ci_id)
    assert real.mig_devices(2) == []
    with pytest.raises(nv.NotSupported):
        real.mig_mode(3)  # L4


def test_xid_events_through_pynvml(sim: SimNvml, real: NvmlBackend) -> None:
    assert real.wait_event(0) is None
    sim.inject_xid(1, 94, 5, 0)
    sim.inject_xid(0, 79, None, None)
    a, b = real.wait_event(0), real.wait_event(0)
    assert a is not None and b is not None
    assert (a.gpu_uuid, a.xid, a.gi_id, a.ci_id) == (sim.uuid(1), 94, 5, 0)
    assert (b.gpu_uuid, b.xid, b.gi_id, b.ci_id) == (sim.uuid(0), 79, None, None)


def test_nvml_errors_map_to_the_shared_hierarchy(
    real: NvmlBackend, sim: SimNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim.set_lost(0, True)
    with pytest.raises(nv.GpuLost):
        real.uuid(0)

    def no_library(flags: int) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInitWithFlags", no_library)
    with pytest.raises(nv.LibraryNotFound, match="nvmlInit"):
        NvmlBackend().init()
    assert isinstance(nv.error_for_code(12345), nv.NvmlError)


def test_bus_id_and_sysfs_edge_cases(tmp_path: Path) -> None:
    assert format_bus_id(b"00000000:3B:00.0\x00") == "0000:3b:00.0"
    assert format_bus_id("0001:3b:00.0") == "0001:3b:00.0"
    assert sysfs.pcie_root("0000:3b:00.0", tmp_path) is None  # no sysfs entry
    assert sysfs.vfio_info("0000:3b:00.0", tmp_path, tmp_path) is None
    assert sysfs.numa_node("0000:3b:00.0", tmp_path) is None
    device = tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("-1\n")  # what a single-node machine says
    assert sysfs.numa_node("0000:3b:00.0", tmp_path) is None
    lines = ["0x0 0x0 0x0", "0x1000 0x1fff 0x4", "0x3000 0x3fff 0x0"]
    assert sysfs.addressable_memory(lines) == 0x1000  # only the 64-bit BAR counts
    assert sysfs.addressable_memory(["0x1000 0x2fff 0xc"]) == 0x2000
    assert ctypes.sizeof(pynvml.c_nvmlGpuInstancePlacement_t) == 8  # the struct we hand NVML
