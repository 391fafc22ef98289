"""The pynvml backend, driven through pynvml's real module with its C calls answered by the sim.

There is no GPU here, so every pynvml function the backend calls is replaced
by one that answers from a simulated node, in pynvml's own shapes (handles,
ctypes structs, NVMLError codes). Both backends must then yield the same
inventory: that is what "one interface, two implementations" promises.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import msgspec
import pynvml
import pytest

from services.discovery import backend as nv
from services.discovery import mig, nvmlabi, pciids, sysfs
from services.discovery.fleet import get_fleet
from services.discovery.inventory import scan
from services.discovery.nvml import NvmlBackend, format_bus_id
from services.discovery.sim import SimNvml
from tests.helpers.nvml import FakeNvml, fake_sysfs


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
    assert ctypes.sizeof(nvmlabi.GpuInstancePlacement) == 8  # the struct we hand NVML
