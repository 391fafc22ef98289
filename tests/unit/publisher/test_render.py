"""The NVIDIA device model and the slice renderer, against hand-built inventories.

The inventories here spell out NVML's facts (H100 and A100 MIG profile tables
from the MIG user guide) so each expected value can be checked by eye; the
fleet x gate matrix over discovery's simulated fleets is in test_slicecheck.py.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import msgspec
import pytest
import yaml

from services.core.kube import quantity, resource
from services.core.kube.resource import Device, ResourceSlice
from services.core.model import (
    computedomain,
    deviceattrs,
    deviceclasses,
    featuregates,
    gpuhealth,
    migpartitions,
    nvidia,
    shares,
)
from services.core.model.schemas import (
    Gpu,
    GpuHealth,
    VfioInfo,
    Xid,
)
from services.offline import slicecheck
from services.offline.slicecheck.names import dns_subdomain
from services.publisher.render import (
    RenderError,
    RenderOptions,
    render_contents,
    render_slices,
    slice_name,
)
from tests.helpers.inventories import MIB, a100, dgx_a100, h100, node

REPO = Path(__file__).resolve().parents[3]


def opts(gates: str = "", minor: int = 35, **kw) -> RenderOptions:
    return RenderOptions(gates=featuregates.parse(gates), kube_minor=minor, **kw)


def devices_of(slices: list[ResourceSlice]) -> dict[str, Device]:
    return {d.name: d for s in slices for d in s.spec.devices or []}


def attrs(device: Device) -> dict[str, object]:
    return {k: v.value() for k, v in (device.attributes or {}).items()}


def caps(device: Device) -> dict[str, str]:
    return {k: v.value for k, v in (device.capacity or {}).items()}


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("9.0", "9.0.0"),
        ("570.124.06", "570.124.6"),
        ("12.8", "12.8.0"),
        ("550.54.15", "550.54.15"),
        ("v1.2.3-rc.1+build.5", "1.2.3-rc.1+build.5"),
        ("8", "8.0.0"),
    ],
)
def test_versions_are_normalised_like_masterminds_semver(text: str, want: str) -> None:
    assert deviceattrs.semver(text) == want


@pytest.mark.parametrize("text", ["abc", "9.x", "", "1.2.3-01"])
def test_unparseable_versions_name_the_field(text: str) -> None:
    with pytest.raises(nvidia.InventoryError, match="driver_version"):
        deviceattrs.semver(text, "driver_version")


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (0, "0"),
        (1, "1"),
        (132, "132"),
        (1000, "1k"),
        (1023, "1023"),
        (1024, "1Ki"),
        (1025, "1025"),
        (3000, "3k"),
        (40 * 1024 * MIB, "40Gi"),
        (81559 * MIB, "81559Mi"),
        (85_000_000_000, "85G"),
    ],
)
def test_quantities_are_written_in_the_servers_canonical_form(value: int, want: str) -> None:
    assert quantity.format_int(value) == want
    assert quantity.parse(want) == value


def test_device_names_round_trip_through_parse() -> None:
    assert nvidia.parse_device_name("gpu-3") == nvidia.DeviceId("gpu", minor=3)
    assert nvidia.parse_device_name("gpu-vfio-2") == nvidia.DeviceId("vfio", vfio_index=2)
    name = nvidia.mig_device_name(0, "1g.10gb+me", 20, 6)
    assert name == "gpu-0-mig-1g10gb-me-20-6"
    assert nvidia.parse_device_name(name) == nvidia.DeviceId(
        "mig", minor=0, profile_token="1g10gb-me", gi_profile_id=20, placement_start=6
    )
    assert nvidia.mig_device_name(0, "1g.20gb", 15, 6) == "gpu-0-mig-1g20gb-15-6"
    with pytest.raises(ValueError, match="gpu-<minor>"):
        nvidia.parse_device_name("gpu-0-mig-1g10gb")


def test_counter_names_follow_camel_to_dns() -> None:
    assert [migpartitions.counter_name(c) for c in ("copyEngines", "jpegEngines", "memory")] == [
        "copy-engines",
        "jpeg-engines",
        "memory",
    ]
    assert migpartitions.counter_set_name(5) == "gpu-5-counter-set"


def test_slice_names_are_deterministic_and_valid_for_any_node_name() -> None:
    assert slice_name("n1", 0) == "n1-gpu.nvidia.com-0"
    long = ".".join(["abcdefghij" * 6 + "abc"] * 4)[:253]
    a, b = slice_name(long, 11), slice_name(long[:-1] + "x", 11)
    assert a != b and len(a) <= 253 and len(b) <= 253
    for name in (a, b):
        assert not dns_subdomain(name, "x"), name


# --------------------------------------------------------------------------- full GPUs


def test_full_gpus_carry_every_section_5_attribute() -> None:
    slices = render_slices(node(gpus=[h100(i, addressing_mode="HMM") for i in range(8)]), opts())
    assert len(slices) == 1
    assert [d.name for d in slices[0].spec.devices or []] == [f"gpu-{i}" for i in range(8)]
    gpu0 = devices_of(slices)["gpu-0"]
    assert attrs(gpu0) == {
        "type": "gpu",
        "uuid": "GPU-00000000-1111-2222-3333-444444444444",
        "productName": "NVIDIA H100 80GB HBM3",
        "brand": "Nvidia",
        "architecture": "Hopper",
        "cudaComputeCapability": "9.0.0",
        "driverVersion": "570.124.6",
        "cudaDriverVersion": "12.8.0",
        "resource.kubernetes.io/pciBusID": "0000:18:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
        "resource.kubernetes.io/numaNode": 0,
        "addressingMode": "HMM",
    }
    assert gpu0.attributes is not None
    assert gpu0.attributes["cudaComputeCapability"].version == "9.0.0"
    assert gpu0.attributes["resource.kubernetes.io/numaNode"].int_ == 0
    assert caps(gpu0) == {"memory": "81559Mi"}
    assert gpu0.consumes_counters is None and gpu0.taints is None


def test_optional_attributes_are_left_out_when_unknown() -> None:
    gpu = h100(0, pcie_root=None, numa_node=None, addressing_mode=None)
    names = set(attrs(devices_of(render_slices(node(gpus=[gpu]), opts()))["gpu-0"]))
    assert not names & {
        "resource.kubernetes.io/pcieRoot",
        "resource.kubernetes.io/numaNode",
        "addressingMode",
    }


def test_pool_and_slice_bookkeeping() -> None:
    (s,) = render_slices(node("node-a"), opts(), generation=3)
    assert s.metadata.name == "node-a-gpu.nvidia.com-0"
    assert s.spec.driver == "gpu.nvidia.com" and s.spec.node_name == "node-a"
    assert (s.spec.pool.name, s.spec.pool.generation, s.spec.pool.resource_slice_count) == (
        "node-a",
        3,
        1,
    )
    assert s.api_version == "resource.k8s.io/v1" and s.kind == "ResourceSlice"


def test_a_gpu_whose_nvml_queries_failed_is_not_published() -> None:
    inv = node(gpus=[h100(0), h100(1, error="NVML_ERROR_UNKNOWN: memory info")])
    assert list(devices_of(render_slices(inv, opts()))) == ["gpu-0"]


def test_a_node_without_gpus_still_has_its_pool() -> None:
    (s,) = render_slices(node(gpus=[]), opts())
    assert s.spec.devices is None and s.spec.pool.resource_slice_count == 1


# --------------------------------------------------------------------------- static MIG


def test_static_mig_devices_replace_their_parent_gpu() -> None:
    slices = render_slices(dgx_a100(), opts())
    devices = devices_of(slices)
    assert {f"gpu-{i}" for i in range(4)} <= set(devices)
    assert not {f"gpu-{i}" for i in range(4, 8)} & set(devices)
    assert {
        "gpu-4-mig-3g20gb-9-0",
        "gpu-4-mig-2g10gb-14-4",
        "gpu-4-mig-1g5gb-19-6",
        "gpu-7-mig-1g5gb-me-20-6",
    } <= set(devices)
    assert len(devices) == 4 + 3 + 7 + 2 + 4
    mig = devices["gpu-4-mig-3g20gb-9-0"]
    parent = dgx_a100().gpus[4]
    assert attrs(mig) == {
        "type": "mig",
        "uuid": parent.mig_devices[0].uuid,
        "parentUUID": parent.uuid,
        "profile": "3g.20gb",
        "productName": "NVIDIA A100-SXM4-40GB",
        "brand": "Nvidia",
        "architecture": "Ampere",
        "cudaComputeCapability": "8.0.0",
        "driverVersion": "570.124.6",
        "cudaDriverVersion": "12.8.0",
        "resource.kubernetes.io/pciBusID": parent.pci_bus_id,
        "resource.kubernetes.io/pcieRoot": parent.pcie_root,
        "resource.kubernetes.io/numaNode": 1,
    }
    assert caps(mig) == {
        "multiprocessors": "42",
        "copyEngines": "3",
        "decoders": "2",
        "encoders": "0",
        "jpegEngines": "0",
        "ofaEngines": "0",
        "memory": "19968Mi",
        **{f"memorySlice{i}": "1" for i in range(4)},
    }
    assert caps(devices["gpu-4-mig-1g5gb-19-6"])["memorySlice6"] == "1"
    assert "memorySlice5" not in caps(devices["gpu-4-mig-1g5gb-19-6"])


def test_a_mig_device_of_an_unknown_profile_is_a_render_error() -> None:
    gpu = a100(0, [("3g.20gb", 0, 2)])
    broken = msgspec.structs.replace(
        gpu,
        mig_devices=[msgspec.structs.replace(gpu.mig_devices[0], gi_profile_id=77)],
    )
    with pytest.raises(RenderError, match="gi_profile_id 77"):
        render_slices(node(gpus=[broken]), opts())


def test_an_unreadable_version_is_a_render_error_naming_the_field() -> None:
    with pytest.raises(RenderError, match=r"gpu 0: cuda_compute_capability: 'nine'"):
        render_slices(node(gpus=[h100(0, cuda_compute_capability="nine")]), opts())


# --------------------------------------------------------------------------- dynamic MIG


def test_dynamic_mig_on_1_35_splits_counters_from_devices() -> None:
    slices = render_slices(node(), opts("DynamicMIG=true", 35))
    assert len(slices) == 9
    counters, *device_slices = slices
    assert counters.spec.devices is None
    assert [c.name for c in counters.spec.shared_counters or []] == [
        f"gpu-{i}-counter-set" for i in range(8)
    ]
    for s in device_slices:
        assert s.spec.shared_counters is None and len(s.spec.devices or []) == 26
    assert {s.spec.pool.resource_slice_count for s in slices} == {9}
    assert not slicecheck.check_pool(slices, kube_minor=35)


def test_dynamic_mig_counter_set_holds_per_profile_maxima_and_memory_slices() -> None:
    counters = render_slices(node(), opts("DynamicMIG=true"))[0].spec.shared_counters or []
    want = {
        "multiprocessors": "132",
        "copy-engines": "8",
        "decoders": "7",
        "encoders": "0",
        "jpeg-engines": "7",
        "ofa-engines": "1",
        "memory": "81152Mi",
        **{f"memory-slice-{i}": "1" for i in range(8)},
    }
    assert {k: v.value for k, v in counters[0].counters.items()} == want


def test_dynamic_mig_full_gpu_consumes_everything_and_partitions_their_slices() -> None:
    devices = devices_of(render_slices(node(), opts("DynamicMIG=true")))
    full = devices["gpu-0"]
    (consumed,) = full.consumes_counters or []
    assert consumed.counter_set == "gpu-0-counter-set"
    assert len(consumed.counters) == 15
    assert caps(full)["memory"] == "81152Mi"  # the largest profile's, as PartCapacities
    part = devices["gpu-0-mig-3g40gb-9-4"]
    assert "uuid" not in attrs(part) and attrs(part)["profile"] == "3g.40gb"
    assert "memorySlice4" not in caps(part)  # abstract devices carry no slice capacities
    (used,) = part.consumes_counters or []
    assert {k: v.value for k, v in used.counters.items()} == {
        "multiprocessors": "60",
        "copy-engines": "3",
        "decoders": "3",
        "encoders": "0",
        "jpeg-engines": "3",
        "ofa-engines": "0",
        "memory": "40448Mi",
        **{f"memory-slice-{i}": "1" for i in range(4, 8)},
    }
    names = [n for n in devices if n.startswith("gpu-0-")]
    assert len(names) == 25 and "gpu-0-mig-1g10gb-me-20-3" in names


def test_dynamic_mig_on_1_34_keeps_each_gpus_counters_beside_its_devices() -> None:
    slices = render_slices(node(), opts("DynamicMIG=true", 34))
    assert len(slices) == 8
    for i, s in enumerate(slices):
        assert [c.name for c in s.spec.shared_counters or []] == [f"gpu-{i}-counter-set"]
        assert len(s.spec.devices or []) == 26
    assert not slicecheck.check_pool(slices, kube_minor=34)
    assert slicecheck.check_pool(slices, kube_minor=35)  # not valid for 1.35


def test_dynamic_mig_on_ampere_publishes_partitions_only_when_mig_is_on() -> None:
    devices = devices_of(render_slices(dgx_a100(), opts("DynamicMIG=true")))
    assert {"gpu-0", "gpu-3"} <= set(devices)  # MIG off on Ampere: not dynamic-MIG capable
    assert devices["gpu-0"].consumes_counters is None
    assert "gpu-4" not in devices  # MIG on: no full GPU without a reset
    assert "gpu-4-mig-7g40gb-0-0" in devices and "gpu-0-mig-7g40gb-0-0" not in devices


def test_dynamic_mig_leaves_gpus_without_mig_as_plain_devices() -> None:
    l4 = h100(0, mig_capable=False, mig_profiles=[], architecture="Ada Lovelace")
    slices = render_slices(node(gpus=[l4]), opts("DynamicMIG=true"))
    assert [s.spec.shared_counters for s in slices] == [None]
    assert caps(devices_of(slices)["gpu-0"]) == {"memory": "81559Mi"}


# --------------------------------------------------------------------------- VFIO


def test_passthrough_adds_a_vfio_twin_per_gpu_in_mig_mode_too() -> None:
    """As the reference (nvlib.go, enumerateGpuVfioDevices): every PCI GPU gets its
    twin; only one whose full-GPU device has VFIO off is skipped, and a GPU in MIG
    mode has no full-GPU device to say so."""
    inv = node(gpus=[h100(0), h100(1), a100(2, [("7g.40gb", 0, 0)]), a100(3, [])])
    devices = devices_of(render_slices(inv, opts("PassthroughSupport=true")))
    assert set(devices) == {
        "gpu-0", "gpu-1", "gpu-2-mig-7g40gb-0-0",
        "gpu-vfio-0", "gpu-vfio-1", "gpu-vfio-2", "gpu-vfio-3",
    }  # fmt: skip
    mig_twin = attrs(devices["gpu-vfio-2"])
    assert mig_twin["resource.kubernetes.io/pciBusID"] == a100(2).pci_bus_id
    vfio = devices["gpu-vfio-1"]
    assert attrs(vfio) == {
        "type": "vfio",
        "uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, "0000:28:00.0")),
        "deviceID": "0x2330",
        "vendorID": "0x10de",
        "productName": "GH100 [H100 SXM5 80GB]",  # the PCI database's, not NVML's name
        "iommuFDEnabled": False,
        "resource.kubernetes.io/pciBusID": "0000:28:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:10",
        "resource.kubernetes.io/numaNode": 0,
    }
    assert caps(vfio) == {"addressableMemory": "256Gi"}
    assert "gpu-vfio-0" not in devices_of(render_slices(inv, opts()))
    # An inventory without the database name (an older discovery) says what go-nvlib says.
    older = VfioInfo(
        vendor_id="0x10de",
        device_id="0x2330",
        numa_node=0,
        iommu_group=20,
        iommu_fd_enabled=False,
        addressable_memory_bytes=262144 * MIB,
    )
    unnamed = devices_of(
        render_slices(node(gpus=[h100(0, vfio=older)]), opts("PassthroughSupport=true"))
    )
    assert attrs(unnamed["gpu-vfio-0"])["productName"] == "UNKNOWN_DEVICE"


def test_vfio_twins_are_numbered_by_pci_address_as_the_preparer_finds_them() -> None:
    """One rule (nvidia.vfio_order) for both sides: publisher names, preparer locates."""
    from services.preparer.inventory import locate

    unknown = Gpu(
        index=4, minor=-1, uuid="", product_name="", brand="", architecture="",
        cuda_compute_capability="", memory_bytes=0, pci_bus_id="",
        health=_health(lost=True), error="NVML_ERROR_GPU_IS_LOST",
    )  # fmt: skip
    # Listed out of PCI order; gpu-1 is in MIG mode (it has a twin as well).
    gpus = [h100(3), unknown, a100(1, [("7g.40gb", 0, 0)]), h100(0), h100(2)]
    inv = node(gpus=gpus)
    devices = devices_of(render_slices(inv, opts("PassthroughSupport=true")))
    twins = {n: attrs(d)["resource.kubernetes.io/pciBusID"] for n, d in devices.items()}
    twins = {n: bus for n, bus in twins.items() if n.startswith("gpu-vfio-")}
    assert twins == {
        "gpu-vfio-0": h100(0).pci_bus_id,
        "gpu-vfio-1": a100(1).pci_bus_id,
        "gpu-vfio-2": h100(2).pci_bus_id,
        "gpu-vfio-3": h100(3).pci_bus_id,
    }
    for name, bus in twins.items():
        assert locate(inv, name).gpu.pci_bus_id == bus
    assert [g.minor for g in nvidia.vfio_order(gpus)] == [0, 1, 2, 3]


def test_a_prepared_device_withdraws_its_twin_and_a_held_device_always_stays() -> None:
    from services.core.model.schemas import HeldDevice, NodePreparedDevices
    from services.publisher.render import Holdings

    def held(*items: tuple[str, nvidia.DeviceType, int]) -> Holdings:
        devices = [
            HeldDevice(device=name, kind=kind, pci_bus_id=h100(i).pci_bus_id, claim_uid="c1")
            for name, kind, i in items
        ]
        return Holdings.of(NodePreparedDevices(node="n1", devices=devices))

    inv = node(gpus=[h100(i) for i in range(4)])
    gates = opts("PassthroughSupport=true")
    everything = set(devices_of(render_slices(inv, gates)))
    holdings = held(
        ("gpu-0", "gpu", 0),
        ("gpu-vfio-1", "vfio", 1),
        ("gpu-2", "gpu", 2),
        ("gpu-vfio-2", "vfio", 2),
    )
    shown = set(devices_of(render_slices(inv, gates, holdings=holdings)))
    # gpu-0 held: its twin goes; gpu-vfio-1 held: gpu-1 goes; gpu-2 held both ways: both stay.
    assert everything - shown == {"gpu-vfio-0", "gpu-1"}
    assert Holdings.of(None) == Holdings.of(NodePreparedDevices(node="n1")) == held()


def test_a_gpu_in_mig_mode_and_its_twin_withdraw_each_other() -> None:
    """A MIG device in use withdraws its GPU's twin; the twin in use, every MIG device
    of its GPU (the reference withdraws neither: RemoveSiblingDevices is a TODO there)."""
    from services.core.model.schemas import HeldDevice, NodePreparedDevices
    from services.publisher.render import Holdings

    mig = a100(0, [("3g.20gb", 0, 2), ("3g.20gb", 4, 1)])
    inv = node(gpus=[mig, h100(1)])
    gates = opts("PassthroughSupport=true")
    everything = set(devices_of(render_slices(inv, gates)))
    assert everything == {
        "gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4", "gpu-1", "gpu-vfio-0", "gpu-vfio-1"
    }  # fmt: skip

    def shown(name: str, kind: nvidia.DeviceType) -> set[str]:
        holding = HeldDevice(device=name, kind=kind, pci_bus_id=mig.pci_bus_id, claim_uid="c1")
        holdings = Holdings.of(NodePreparedDevices(node="n1", devices=[holding]))
        return set(devices_of(render_slices(inv, gates, holdings=holdings)))

    assert everything - shown("gpu-0-mig-3g20gb-9-4", "mig") == {"gpu-vfio-0"}
    assert everything - shown("gpu-vfio-0", "vfio") == {
        "gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"
    }  # fmt: skip


# --------------------------------------------------------------------------- health


def _health(*xids: Xid, lost: bool = False) -> GpuHealth:
    return GpuHealth(xids=list(xids), lost=lost)


def test_xid_taints_follow_the_latest_event_and_its_severity() -> None:
    gpus = [
        h100(0, health=_health(Xid(13, 1.0), Xid(79, 2.0))),
        h100(1, health=_health(Xid(79, 1.0), Xid(31, 2.0))),
        h100(2, health=_health(Xid(48, 1.0))),
        h100(3, health=_health(lost=True)),
        h100(4),
    ]
    devices = devices_of(render_slices(node(gpus=gpus), opts("NVMLDeviceHealthCheck=true")))

    def taints(name: str) -> list[tuple[str, str | None, str]]:
        return [(t.key, t.value, t.effect) for t in devices[name].taints or []]

    assert taints("gpu-0") == [("gpu.nvidia.com/xid", "79", "NoSchedule")]
    assert taints("gpu-1") == [("gpu.nvidia.com/xid", "31", "None")]
    assert taints("gpu-2") == [("gpu.nvidia.com/xid", "48", "NoSchedule")]
    assert taints("gpu-3") == [("gpu.nvidia.com/gpu-lost", None, "NoSchedule")]
    assert taints("gpu-4") == []
    extra = devices_of(
        render_slices(
            node(gpus=gpus),
            opts("NVMLDeviceHealthCheck=true", extra_non_fatal_xids=frozenset({48})),
        )
    )
    assert [t.effect for t in extra["gpu-2"].taints or []] == ["None"]
    untainted = devices_of(render_slices(node(gpus=gpus), opts()))
    assert all(d.taints is None for d in untainted.values())


def test_a_lost_gpu_keeps_its_last_identity_with_gpu_lost_on_every_device() -> None:
    lost_health = _health(Xid(79, 1.0), lost=True)
    lost = h100(1, health=lost_health, error="NVML_ERROR_GPU_IS_LOST")
    mig_lost = a100(2, [("3g.20gb", 0, 2), ("3g.20gb", 4, 1)], health=_health(lost=True))
    mig_lost = msgspec.structs.replace(mig_lost, error="NVML_ERROR_GPU_IS_LOST")
    inv = node(gpus=[h100(0), lost, mig_lost])
    devices = devices_of(render_slices(inv, opts("NVMLDeviceHealthCheck=true")))

    def keys(name: str) -> list[tuple[str, str | None, str]]:
        return [(t.key, t.value, t.effect) for t in devices[name].taints or []]

    gpu_lost = ("gpu.nvidia.com/gpu-lost", None, "NoSchedule")
    assert keys("gpu-1") == [("gpu.nvidia.com/xid", "79", "NoSchedule"), gpu_lost]
    assert attrs(devices["gpu-1"])["uuid"] == lost.uuid  # the last identity
    assert keys("gpu-2-mig-3g20gb-9-0") == keys("gpu-2-mig-3g20gb-9-4") == [gpu_lost]
    assert keys("gpu-0") == []
    # Without the health check nothing could keep the scheduler off it: withdrawn.
    plain = devices_of(render_slices(inv, opts("PassthroughSupport=true")))
    assert set(plain) == {"gpu-0", "gpu-vfio-0"}


def test_a_gpu_whose_events_cannot_be_watched_is_tainted_unmonitored() -> None:
    """The reference's unmonitored taint (effect None), on every NVML device of the GPU."""
    unwatched = GpuHealth(unmonitored=True)
    gpus = [
        h100(0, health=unwatched),
        h100(1),
        a100(2, [("3g.20gb", 0, 2), ("3g.20gb", 4, 1)], health=unwatched),
        h100(3, health=GpuHealth(xids=[Xid(79, 1.0)], lost=True, unmonitored=True)),
    ]
    devices = devices_of(render_slices(node(gpus=gpus), opts("NVMLDeviceHealthCheck=true")))

    def taints(name: str) -> list[tuple[str, str | None, str]]:
        return [(t.key, t.value, t.effect) for t in devices[name].taints or []]

    unmonitored = ("gpu.nvidia.com/unmonitored", None, "None")
    assert taints("gpu-0") == [unmonitored]
    assert taints("gpu-1") == []
    assert taints("gpu-2-mig-3g20gb-9-0") == taints("gpu-2-mig-3g20gb-9-4") == [unmonitored]
    assert taints("gpu-3") == [  # in the order the reference adds them
        unmonitored,
        ("gpu.nvidia.com/xid", "79", "NoSchedule"),
        ("gpu.nvidia.com/gpu-lost", None, "NoSchedule"),
    ]
    assert gpuhealth.TAINT_UNMONITORED == "gpu.nvidia.com/unmonitored"
    # Everything else about the devices is what an unwatched GPU would have anyway.
    healthy = [msgspec.structs.replace(g, health=GpuHealth()) for g in gpus[:3]]
    plain = devices_of(render_slices(node(gpus=healthy), opts("NVMLDeviceHealthCheck=true")))
    for name, device in plain.items():
        assert msgspec.structs.replace(devices[name], taints=None) == device, name
    # Health checking off: the reference publishes no health taints at all.
    off = devices_of(render_slices(node(gpus=gpus), opts()))
    assert all(d.taints is None for d in off.values())
    assert not slicecheck.check_pool(
        render_slices(node(gpus=gpus), opts("NVMLDeviceHealthCheck=true"))
    )


def test_an_xid_with_gi_and_ci_taints_only_that_mig_device() -> None:
    gpu = a100(0, [("3g.20gb", 0, 2), ("3g.20gb", 4, 1)])
    gpu = msgspec.structs.replace(gpu, health=_health(Xid(94, 1.0, gi_id=1, ci_id=0)))
    devices = devices_of(render_slices(node(gpus=[gpu]), opts("NVMLDeviceHealthCheck=true")))
    assert devices["gpu-0-mig-3g20gb-9-4"].taints is not None
    assert devices["gpu-0-mig-3g20gb-9-0"].taints is None


@pytest.mark.parametrize(
    ("gi_id", "ci_id", "tainted"),
    [
        (1, 0, {"gpu-0-mig-3g20gb-9-4"}),  # GI 1, CI 0: that MIG device
        (1, None, set()),  # GI 1, CI 0xFFFFFFFF: the whole GPU instance, no device's own
        (None, 0, set()),  # GI 0xFFFFFFFF with a CI: no such placement
        (None, None, set()),  # the full GPU, not published in MIG mode
        (5, 0, set()),  # a GI no MIG device of the inventory has
    ],
)
def test_an_xid_taints_the_device_of_exactly_its_placement_as_the_reference(
    gi_id: int | None, ci_id: int | None, tainted: set[str]
) -> None:
    """The reference looks an event up by (UUID, GI, CI) in its placement map
    (device_health.go): an XID for a whole GPU instance matches no MIG device."""
    gpu = a100(0, [("3g.20gb", 0, 2), ("3g.20gb", 4, 1)])
    gpu = msgspec.structs.replace(gpu, health=_health(Xid(79, 1.0, gi_id=gi_id, ci_id=ci_id)))
    devices = devices_of(render_slices(node(gpus=[gpu]), opts("NVMLDeviceHealthCheck=true")))
    assert {name for name, d in devices.items() if d.taints} == tainted
    whole = h100(1, health=_health(Xid(79, 1.0, gi_id=gi_id, ci_id=ci_id)))
    plain = devices_of(render_slices(node(gpus=[whole]), opts("NVMLDeviceHealthCheck=true")))
    assert bool(plain["gpu-1"].taints) == (gi_id is None and ci_id is None)


def test_taints_lower_the_device_limit_per_slice_to_64() -> None:
    many = [h100(i, mig_capable=False, mig_profiles=[]) for i in range(130)]
    plain = render_slices(node(gpus=many), opts("NVMLDeviceHealthCheck=true"))
    assert [len(s.spec.devices or []) for s in plain] == [128, 2]
    many[7] = msgspec.structs.replace(many[7], health=_health(Xid(79, 1.0)))
    tainted = render_slices(node(gpus=many), opts("NVMLDeviceHealthCheck=true"))
    assert [len(s.spec.devices or []) for s in tainted] == [64, 64, 2]
    assert {s.spec.pool.resource_slice_count for s in tainted} == {3}
    assert not slicecheck.check_pool(tainted)


# --------------------------------------------------------------------------- classes


def test_deployed_device_classes_are_the_models() -> None:
    deployed = list(yaml.safe_load_all((REPO / "deploy" / "deviceclasses.yaml").read_text()))
    models = [*deviceclasses.device_classes(), *computedomain.device_classes()]
    assert deployed == [resource.to_builtins(c) for c in models]
    by_name = {c["metadata"]["name"]: c for c in deployed}
    assert set(by_name) == {"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com",
                            "compute-domain-daemon.nvidia.com",
                            "compute-domain-default-channel.nvidia.com"}  # fmt: skip
    assert by_name["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert by_name["mig.nvidia.com"]["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
    )


def test_render_contents_is_stable() -> None:
    a = render_contents(dgx_a100(), opts("PassthroughSupport=true"))
    b = render_contents(dgx_a100(), opts("PassthroughSupport=true"))
    assert msgspec.json.encode([c.devices for c in a]) == msgspec.json.encode(
        [c.devices for c in b]
    )


# --------------------------------------------------------------------------- list attributes

LISTS = featuregates.DRA_LIST_TYPE_ATTRIBUTES
NUMA = deviceattrs.ATTR_NUMA_NODE


def _layouts() -> list[str]:
    """Every mix of the gates that change what is published (those the reference takes)."""
    out = []
    for dyn, vfio, health in itertools.product((False, True), repeat=3):
        spec = f"DynamicMIG={dyn},PassthroughSupport={vfio},NVMLDeviceHealthCheck={health}"
        try:
            featuregates.parse(spec)
        except featuregates.FeatureGateError:
            continue
        out.append(spec)
    return out


def _fleet_names() -> list[str]:
    from services.discovery.fleet import fleet_names

    return fleet_names()


@pytest.mark.parametrize("fleet", _fleet_names())
def test_list_type_attributes_turn_numa_node_into_a_one_element_list_on_every_fleet(
    fleet: str,
) -> None:
    """addNumaNodeAttribute: with DRAListTypeAttributes every device that has numaNode
    (full GPU, static MIG, dynamic-MIG partition, VFIO twin, consumable shares) has it
    as ``ints: [n]``; nothing else of the pool changes, and the pool is valid."""
    from services.offline.slices import fleet_inventory

    inv = fleet_inventory(fleet, "n1")
    kinds: set[str] = set()
    for layout, mode in itertools.product(_layouts(), ("", "memory")):
        extra = ",ConsumableShares=true" if mode else ""
        share = shares.parse_mode(mode or "disabled")
        off = render_slices(inv, opts(layout + extra, 37, shares=share))
        on = render_slices(inv, opts(f"{layout}{extra},{LISTS}=true", 37, shares=share))
        assert [s.metadata.name for s in on] == [s.metadata.name for s in off] or any(
            len(s.spec.devices or []) > 64 for s in off
        )
        off_devices, on_devices = devices_of(off), devices_of(on)
        assert list(on_devices) == list(off_devices) or len(on) != len(off)
        assert set(on_devices) == set(off_devices)
        for name, plain in off_devices.items():
            listed = on_devices[name]
            numa = (plain.attributes or {}).get(NUMA)
            want = dict(plain.attributes or {})
            if numa is not None:
                assert numa.int_ is not None and numa.int_ >= 0
                want[NUMA] = resource.DeviceAttribute(ints=[numa.int_])
                kinds.add(attrs(plain)["type"])  # type: ignore[arg-type]
            assert listed.attributes == want, (fleet, layout, name)
            assert msgspec.structs.replace(listed, attributes=plain.attributes) == plain
        assert not slicecheck.check_pool(on, kube_minor=37), (fleet, layout)
        assert not slicecheck.check_pool(on, kube_minor=36), (fleet, layout)
        # A 1.35 API server has no list-type attributes: the gate changes nothing there.
        assert render_slices(inv, opts(f"{layout}{extra},{LISTS}=true", 35, shares=share)) == (
            render_slices(inv, opts(layout + extra, 35, shares=share))
        )
    if any(g.numa_node is not None and g.numa_node >= 0 for g in inv.gpus):
        assert "vfio" in kinds and kinds & {"gpu", "mig"}, kinds


def test_numa_node_is_written_as_ints_and_nothing_else_changes_form() -> None:
    (plain,) = render_slices(dgx_a100(), opts("PassthroughSupport=true", 37))
    (listed,) = render_slices(dgx_a100(), opts(f"PassthroughSupport=true,{LISTS}=true", 37))
    data = resource.to_builtins(listed)["spec"]["devices"]
    by_name = {d["name"]: d["attributes"] for d in data}
    assert by_name["gpu-0"][NUMA] == {"ints": [0]}
    assert by_name["gpu-4-mig-3g20gb-9-0"][NUMA] == {"ints": [1]}
    assert by_name["gpu-vfio-4"][NUMA] == {"ints": [1]}
    before = {d["name"]: d["attributes"] for d in resource.to_builtins(plain)["spec"]["devices"]}
    for name, attributes in by_name.items():
        changed = {k for k in attributes if attributes[k] != before[name][k]}
        assert changed == {NUMA}, name
        assert before[name][NUMA] == {"int": attributes[NUMA]["ints"][0]}
    # attrs() (the allocator's view) sees the list
    assert attrs(devices_of([listed])["gpu-0"])[NUMA] == [0]


def test_a_gpu_without_a_numa_node_has_no_list_attribute() -> None:
    gpu = h100(0, numa_node=None)
    (s,) = render_slices(node(gpus=[gpu]), opts(f"{LISTS}=true", 37))
    assert NUMA not in (devices_of([s])["gpu-0"].attributes or {})
    assert not deviceattrs.has_list_attributes(devices_of([s])["gpu-0"])


def test_dynamic_mig_partitions_keep_sharing_their_attribute_maps() -> None:
    """Rendering a thousand nodes stays cheap: the list form is made once per map."""
    slices = render_slices(node(), opts(f"DynamicMIG=true,{LISTS}=true", 37))
    parts = [d for d in devices_of(slices).values() if d.name.startswith("gpu-0-mig-1g10gb-19-")]
    assert len(parts) > 1
    assert all(p.attributes is parts[0].attributes for p in parts)
    assert (parts[0].attributes or {})[NUMA].ints == [0]


def test_list_attributes_lower_the_device_limit_per_slice_to_64() -> None:
    """ResourceSliceMaxDevicesWithAdvancedFeatures: list attributes count, as taints do."""
    many = [h100(i, mig_capable=False, mig_profiles=[]) for i in range(130)]
    plain = render_slices(node(gpus=many), opts("", 37))
    assert [len(s.spec.devices or []) for s in plain] == [128, 2]
    listed = render_slices(node(gpus=many), opts(f"{LISTS}=true", 37))
    assert [len(s.spec.devices or []) for s in listed] == [64, 64, 2]
    assert {s.spec.pool.resource_slice_count for s in listed} == {3}
    assert not slicecheck.check_pool(listed, kube_minor=37)
    # The same pool in 128-device slices is what the API server refuses.
    spec = listed[0].spec
    too_big = msgspec.structs.replace(
        listed[0],
        spec=msgspec.structs.replace(
            spec, devices=[*(spec.devices or []), *(listed[1].spec.devices or [])]
        ),
    )
    (problem,) = slicecheck.check_slice(too_big, kube_minor=37)
    assert problem.path == "spec.devices" and "list attribute" in problem.message
    # Without any NUMA node there is no list, and 128 fit again.
    unknown = [msgspec.structs.replace(g, numa_node=None) for g in many]
    again = render_slices(node(gpus=unknown), opts(f"{LISTS}=true", 37))
    assert [len(s.spec.devices or []) for s in again] == [128, 2]
