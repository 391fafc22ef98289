"""Inventory scans over the simulated backend: content, error isolation, health, changes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.core.model.schemas import VfioInfo
from services.discovery import backend as nv
from services.discovery import mig
from services.discovery.fleet import get_fleet
from services.discovery.health import HealthTracker
from services.discovery.inventory import Scan, ScanError, describe_changes, scan
from services.discovery.sim import SimNvml

GIB = 1024**3


def boot(fleet: str) -> SimNvml:
    sim = SimNvml.boot("node-a", get_fleet(fleet), 7)
    sim.init()
    return sim


def test_dgx_h100_inventory_has_every_attribute_the_publisher_needs() -> None:
    inv = scan(boot("dgx-h100"), "node-a").inventory
    assert (inv.node, inv.backend) == ("node-a", "simulated:dgx-h100")
    assert (inv.driver_version, inv.cuda_driver_version) == ("570.124.06", "12.8")
    assert [g.minor for g in inv.gpus] == list(range(8))
    g = inv.gpus[3]
    assert g.error is None and g.uuid.startswith("GPU-")
    assert (g.product_name, g.brand, g.architecture) == (
        "NVIDIA H100 80GB HBM3",
        "Nvidia",
        "Hopper",
    )
    assert (g.cuda_compute_capability, g.memory_bytes) == ("9.0", 81559 * 1024 * 1024)
    # Hopper on x86: NVML supports the call and answers NONE (read on a real H100, 580.159.04)
    assert (g.pci_bus_id, g.pcie_root, g.addressing_mode) == ("0000:5d:00.0", "pci0000:30", "None")
    assert (g.mig_capable, g.mig_enabled, g.mig_devices) == (True, False, [])
    assert [p.name for p in g.mig_profiles] == [  # NVML's enumeration order
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
        "1g.10gb+me",
        "1g.20gb",
    ]
    p = g.mig_profiles[6]
    assert (p.gi_profile_id, p.ci_profile_id, p.slices, p.multiprocessors) == (15, 0, 1, 26)
    assert p.memory_bytes == 20096 * 1024 * 1024
    assert [(pl.start, pl.size) for pl in p.placements] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert g.vfio == VfioInfo(
        vendor_id="0x10de",
        device_id="0x2330",
        numa_node=0,
        iommu_group=54,
        iommu_fd_enabled=False,
        addressable_memory_bytes=256 * GIB,
        product_name="GH100 [H100 SXM5 80GB]",  # the PCI ID database's name for 10de:2330
    )


def test_static_mig_and_non_mig_gpus() -> None:
    inv = scan(boot("mixed"), "node-a").inventory
    h100, a100, h200, l4 = inv.gpus
    assert [g.minor for g in inv.gpus] == [1, 0, 2, 3]
    assert a100.mig_enabled and [(m.profile, m.gi_id, m.ci_id) for m in a100.mig_devices] == [
        ("3g.40gb", 1, 0),
        ("1g.20gb", 5, 0),
        ("1g.10gb", 13, 0),
    ]
    assert a100.mig_devices[1].gi_profile_id == 15 and a100.mig_devices[1].placement.size == 2
    assert (h200.product_name, h200.mig_profiles[4].name) == ("NVIDIA H200", "7g.141gb")
    assert (l4.architecture, l4.cuda_compute_capability) == ("Ada Lovelace", "8.9")
    assert (l4.mig_capable, l4.mig_profiles, l4.error) == (False, [], None)
    assert h100.vfio is not None and l4.vfio is not None


class Faulty:
    """A backend that fails chosen calls on chosen GPUs, passing the rest through."""

    def __init__(self, inner: SimNvml, faults: dict[tuple[str, int], Exception]) -> None:
        self.inner = inner
        self.faults = faults

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any) -> Any:
            if args and (name, args[0]) in self.faults:
                raise self.faults[(name, args[0])]
            return attr(*args)

        return call


def test_nvml_errors_on_one_gpu_mark_only_that_gpu() -> None:
    sim = boot("dgx-a100")
    good = scan(sim, "node-a").inventory
    faulty = Faulty(
        sim,
        {
            ("product_name", 3): nv.NvmlError("boom"),
            ("mig_devices", 5): RuntimeError("driver bug"),
            ("pcie_root", 1): nv.NotSupported("no sysfs"),
        },
    )
    inv = scan(faulty, "node-a", previous=good).inventory
    assert [g.index for g in inv.gpus if g.error] == [3, 5]
    assert inv.gpus[3].error == "name: NVML_ERROR_UNKNOWN: boom"
    assert inv.gpus[3].product_name == "NVIDIA A100-SXM4-40GB"  # from the previous scan
    assert "MIG devices: RuntimeError: driver bug" in (inv.gpus[5].error or "")
    assert inv.gpus[5].mig_devices == good.gpus[5].mig_devices
    assert inv.gpus[1].pcie_root is None and inv.gpus[1].error is None  # optional fact
    for i in (0, 2, 4, 6, 7):
        assert inv.gpus[i] == good.gpus[i]

    fresh = scan(faulty, "node-a").inventory  # nothing to fall back on
    assert fresh.gpus[3].product_name == "" and fresh.gpus[3].uuid == good.gpus[3].uuid


def test_lost_gpu_keeps_its_identity_and_a_failed_count_is_a_scan_error() -> None:
    sim = boot("dgx-h100")
    good = scan(sim, "node-a").inventory
    sim.set_lost(6, True)
    result = scan(sim, "node-a", previous=good)
    assert result.lost == {6}
    lost = result.inventory.gpus[6]
    assert (lost.uuid, lost.minor, lost.pci_bus_id) == (good.gpus[6].uuid, 6, "0000:ba:00.0")
    assert (lost.error or "").startswith("NVML_ERROR_GPU_IS_LOST")
    unknown = scan(sim, "node-a").inventory.gpus[6]
    assert (unknown.uuid, unknown.minor) == ("", -1)
    with pytest.raises(ScanError, match="device count"):
        scan(_CountFails(), "node-a")  # type: ignore[arg-type]


class _CountFails:
    name = "broken"

    def device_count(self) -> int:
        raise nv.Uninitialized("no driver")


def test_health_tracker_turns_xids_and_loss_into_events_and_health() -> None:
    sim = boot("dgx-a100")
    tracker = HealthTracker("node-a")
    inv, events = tracker.on_scan(scan(sim, "node-a"))
    assert events == []
    sim.inject_xid(5, 43, 9, 0)
    reader = SimNvml(sim.state, deliver_past_events=True)
    reader.init()
    first = reader.wait_event(0)
    assert first is not None
    event = tracker.on_event(inv, first)
    assert event is not None
    assert (event.kind, event.xid, event.gpu_index, event.gpu_uuid) == (
        "xid",
        43,
        5,
        inv.gpus[5].uuid,
    )
    assert "on MIG 1g.5gb (GI 9/CI 0" in event.message
    assert (event.reason, event.gi_id, event.ci_id) == ("XID 43: GPU stopped processing", 9, 0)
    inv2, _ = tracker.on_scan(scan(sim, "node-a", inv))
    assert [(x.xid, x.gi_id, x.ci_id) for x in inv2.gpus[5].health.xids] == [(43, 9, 0)]
    assert describe_changes(inv, inv2) == ["gpu-5: XID 43 on GI 9/CI 0"]

    sim.set_lost(2, True)
    inv3, events = tracker.on_scan(scan(sim, "node-a", inv2))
    assert [(e.kind, e.gpu_index, e.reason) for e in events] == [
        ("gpu-lost", 2, "GPU is lost: NVML cannot reach it (NVML_ERROR_GPU_IS_LOST)")
    ]
    assert inv3.gpus[2].health.lost
    _, again = tracker.on_scan(scan(sim, "node-a", inv3))
    assert again == []  # reported once
    sim.set_lost(2, False)
    inv4, events = tracker.on_scan(scan(sim, "node-a", inv3))
    assert [(e.kind, e.gpu_index, e.reason) for e in events] == [
        ("recovered", 2, "GPU answers NVML again")
    ]
    assert not inv4.gpus[2].health.lost
    assert describe_changes(inv3, inv4) == ["gpu-2: recovered", "gpu-2: NVML error cleared"]


def test_an_nvml_error_event_says_which_queries_failed() -> None:
    sim = boot("dgx-a100")
    result = scan(sim, "node-a")
    gpus = list(result.inventory.gpus)
    gpus[1] = msgspec.structs.replace(gpus[1], error="memory: NVML_ERROR_UNKNOWN")
    broken = msgspec.structs.replace(result.inventory, gpus=gpus)
    _, events = HealthTracker("node-a").on_scan(Scan(broken, result.lost, result.unmonitored))
    assert [(e.kind, e.gpu_index, e.reason) for e in events] == [
        ("nvml-error", 1, "NVML error: memory: NVML_ERROR_UNKNOWN")
    ]


def test_scans_are_stable_and_changes_are_described() -> None:
    sim = boot("dgx-h100")
    first = scan(sim, "node-a").inventory
    assert scan(sim, "node-a", first).inventory.digest() == first.digest()
    dev = mig.create(sim, 4, "3g.40gb", 0)
    second = scan(sim, "node-a", first).inventory
    assert second.digest() != first.digest()
    assert describe_changes(first, second) == [
        "gpu-4: MIG mode enabled",
        f"gpu-4: MIG 3g.40gb created at 0 (GI 1, {dev.uuid})",
    ]
    mig.destroy(sim, 4, dev.gi_id, dev.ci_id)
    third = scan(sim, "node-a", second).inventory
    assert describe_changes(second, third) == ["gpu-4: MIG 3g.40gb destroyed at 0 (GI 1)"]
    assert describe_changes(None, third) == ["inventory created: 8 GPUs (simulated:dgx-h100)"]
