"""The pynvml backend under each nvidia-ml-py release's struct declarations.

NVML writes its structs as nvml.h lays them out, whatever the Python binding
declares. Here pynvml's calls are answered by the simulated node (tests/helpers/
nvml.py) writing nvml.h's bytes into the binding's own structs, and the binding's
declarations are those of three releases (tests/helpers/pynvml_layouts.py). On a
real H100 with nvidia-ml-py 13.610.43, discovery failed on every GPU: that
release's c_nvmlGpuFabricInfo_t is 92 bytes where NVML writes 28.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import uuid
from pathlib import Path

import msgspec
import pynvml
import pytest

from services.core.model.schemas import NodeInventory
from services.discovery import backend as nv
from services.discovery import mig, nvmlabi, pciids
from services.discovery.fleet import get_fleet
from services.discovery.inventory import scan
from services.discovery.nvml import NvmlBackend
from services.discovery.sim import SimNvml
from services.offline import hostcheck
from tests.helpers import pynvml_layouts
from tests.helpers.nvml import FakeNvml, fake_sysfs

RELEASES = sorted(pynvml_layouts.LAYOUTS)
REALGPU = Path(__file__).parents[1] / "realgpu"
# Cluster UUIDs with NUL bytes: first, inside, and last (a c_char array stops at the first).
NUL_UUIDS = [
    uuid.UUID(bytes=b"\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\xcc\xdd\xee\xff"),
    uuid.UUID(bytes=b"\x8c\x6a\x00\x1e\x00\x00\x4a\x10\x9b\x00\x00\x00\x5d\x21\x7e\x00"),
]


def _backend(
    sim: SimNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, release: str
) -> NvmlBackend:
    pynvml_layouts.install(monkeypatch, release)
    FakeNvml(sim).install(monkeypatch)
    backend = NvmlBackend(*fake_sysfs(tmp_path, sim), pciids.builtin())
    backend.init()
    return backend


def _same(a: NodeInventory, b: NodeInventory) -> None:
    assert msgspec.structs.replace(a, backend="") == msgspec.structs.replace(b, backend="")


def test_the_installed_binding_declares_what_its_recorded_layout_says() -> None:
    """The copies in tests/helpers/pynvml_layouts.py stay the real declarations."""
    release = importlib.metadata.version("nvidia-ml-py")
    assert release in pynvml_layouts.LAYOUTS, (
        f"nvidia-ml-py {release}: record its layouts in tests/helpers/pynvml_layouts.py"
    )
    for name, recorded in pynvml_layouts.LAYOUTS[release].items():
        assert pynvml_layouts.shape(getattr(pynvml, name)) == pynvml_layouts.shape(recorded), name


@pytest.mark.parametrize("release", RELEASES)
def test_fabric_facts_with_nul_bytes_in_the_cluster_uuid(
    release: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sim = SimNvml.boot("tray-1", get_fleet("gb200-nvl72"), 7)
    fabrics = [g.fabric for g in sim.state.gpus if g.fabric is not None]
    assert len(fabrics) == 4
    for fabric, cluster in zip(fabrics, [*NUL_UUIDS, *NUL_UUIDS], strict=True):
        fabric.cluster_uuid = str(cluster)
    fabrics[1].clique_id, fabrics[1].state, fabrics[1].status = 0x7FFF0001, 2, 0
    real = _backend(sim, monkeypatch, tmp_path, release)
    assert [real.gpu_fabric_info(i) for i in range(4)] == [sim.gpu_fabric_info(i) for i in range(4)]
    assert real.gpu_fabric_info(0).cluster_uuid == "00112233-4455-6677-8899-aabbccddeeff"
    info = real.gpu_fabric_info(1)
    assert (info.clique_id, info.state, info.status) == (0x7FFF0001, 2, 0)
    _same(scan(real, "tray-1").inventory, scan(sim, "tray-1").inventory)


@pytest.mark.parametrize("release", RELEASES)
def test_every_struct_the_backend_reads_whatever_the_release(
    release: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PCI ids and bus ids, memory, MIG profiles and placements, GPU and compute
    instances, XID events, the fabric of an H100 outside one (sixteen NUL bytes)."""
    sim = SimNvml.boot("node-a", get_fleet("mixed"), 3)
    sim.init()
    real = _backend(sim, monkeypatch, tmp_path, release)
    inventory = scan(real, "node-a").inventory
    assert all(g.error is None for g in inventory.gpus), [g.error for g in inventory.gpus]
    _same(inventory, scan(sim, "node-a").inventory)
    assert [real.pci_info(i) for i in range(4)] == [sim.pci_info(i) for i in range(4)]
    h100 = json.loads((REALGPU / "h100-580.159.04.json").read_text())["facts"]
    assert msgspec.to_builtins(real.gpu_fabric_info(0)) == h100["gpu_fabric_info"]

    created = mig.create(real, 2, "2g.35gb", 4)  # GI info, CI profile info, CI info
    assert real.mig_devices(2) == sim.mig_devices(2) != []
    assert created.uuid == sim.mig_devices(2)[0].uuid

    sim.inject_xid(1, 94, 5, 0)  # event data: device handle, XID, GI and CI ids
    event = real.wait_event(0)
    assert event is not None
    assert (event.gpu_uuid, event.xid, event.gi_id, event.ci_id) == (sim.uuid(1), 94, 5, 0)


@pytest.mark.parametrize("release", RELEASES)
def test_profiles_from_the_v1_struct_whatever_the_release(
    release: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sim = SimNvml.boot("node-a", get_fleet("mixed"), 3)
    pynvml_layouts.install(monkeypatch, release)
    fake = FakeNvml(sim)
    fake.v2_names = False  # a driver without nvmlDeviceGetGpuInstanceProfileInfoV
    fake.install(monkeypatch)
    real = NvmlBackend(*fake_sysfs(tmp_path, sim))
    real.init()
    for i in range(3):
        assert real.gpu_instance_profiles(i) == sim.gpu_instance_profiles(i)


@pytest.mark.parametrize("release", RELEASES)
def test_host_check_over_each_release_finds_no_difference_and_names_the_binding(
    release: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What was run on the real H100: ``gpudra host-check`` through pynvml."""
    sim = SimNvml.boot("node-1", get_fleet("dgx-h100"), 0)
    real = _backend(sim, monkeypatch, tmp_path, release)
    report = hostcheck.check(real, str(tmp_path / "no-driver"), 1)
    assert report["differences"] == []
    assert report["binding"] == f"nvidia-ml-py {importlib.metadata.version('nvidia-ml-py')}"
    h100 = json.loads((REALGPU / "h100-580.159.04.json").read_text())["facts"]
    facts = report["gpus"][0]["real"]
    assert facts["gpu_fabric_info"] == h100["gpu_fabric_info"]
    assert all(g["real"]["pci_device_id"] == h100["pci_device_id"] for g in report["gpus"])


def test_a_binding_struct_smaller_than_nvml_h_says_so() -> None:
    class Short(ctypes.Structure):  # a binding that lost memory_t's last field
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong)]

    with pytest.raises(nv.NvmlError, match=r"nvidia-ml-py 1\.2\.3: Short is 16 bytes.* 24"):
        nvmlabi.read(nvmlabi.Memory, Short(), "nvidia-ml-py 1.2.3")
    with pytest.raises(nv.NvmlError, match="wanted a ctypes struct for Memory"):
        nvmlabi.read(nvmlabi.Memory, object(), "pynvml")
