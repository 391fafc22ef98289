"""Hand-built node inventories that spell out NVML's facts, for tests of the renderer and publisher.

H100 and A100 MIG profile tables come from the MIG user guide, so each value
a test expects can be checked by eye.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from services.core.model.schemas import (
    Gpu,
    MigDevice,
    MigPlacement,
    MigProfile,
    NodeInventory,
    VfioInfo,
)

MIB = 1 << 20


def _profile(
    name: str,
    gi: int,
    ci: int,
    slices: int,
    mib: int,
    sms: int,
    ce: int,
    dec: int,
    jpeg: int,
    ofa: int,
    size: int,
    starts: Iterable[int],
) -> MigProfile:
    return MigProfile(
        name=name,
        gi_profile_id=gi,
        ci_profile_id=ci,
        slices=slices,
        memory_bytes=mib * MIB,
        multiprocessors=sms,
        copy_engines=ce,
        decoders=dec,
        encoders=0,
        jpeg_engines=jpeg,
        ofa_engines=ofa,
        placements=[MigPlacement(s, size) for s in starts],
    )


H100_PROFILES = [
    _profile("1g.10gb", 19, 0, 1, 9984, 16, 1, 1, 1, 0, 1, range(7)),
    _profile("1g.10gb+me", 20, 0, 1, 9984, 16, 1, 1, 1, 1, 1, range(7)),
    _profile("1g.20gb", 15, 0, 1, 20096, 26, 1, 1, 1, 0, 2, (0, 2, 4, 6)),
    _profile("2g.20gb", 14, 1, 2, 20096, 32, 2, 2, 2, 0, 2, (0, 2, 4)),
    _profile("3g.40gb", 9, 2, 3, 40448, 60, 3, 3, 3, 0, 4, (0, 4)),
    _profile("4g.40gb", 5, 3, 4, 40448, 64, 4, 4, 4, 0, 4, (0,)),
    _profile("7g.80gb", 0, 4, 7, 81152, 132, 8, 7, 7, 1, 8, (0,)),
]
A100_PROFILES = [
    _profile("1g.5gb", 19, 0, 1, 4864, 14, 1, 0, 0, 0, 1, range(7)),
    _profile("1g.5gb+me", 20, 0, 1, 4864, 14, 1, 1, 1, 1, 1, range(7)),
    _profile("1g.10gb", 15, 0, 1, 9856, 14, 1, 1, 0, 0, 2, (0, 2, 4, 6)),
    _profile("2g.10gb", 14, 1, 2, 9856, 28, 2, 1, 0, 0, 2, (0, 2, 4)),
    _profile("3g.20gb", 9, 2, 3, 19968, 42, 3, 2, 0, 0, 4, (0, 4)),
    _profile("4g.20gb", 5, 3, 4, 19968, 56, 4, 2, 0, 0, 4, (0,)),
    _profile("7g.40gb", 0, 4, 7, 40192, 98, 7, 5, 1, 1, 8, (0,)),
]


def h100(index: int, **changes) -> Gpu:
    gpu = Gpu(
        index=index,
        minor=index,
        uuid=f"GPU-{index:08x}-1111-2222-3333-444444444444",
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        memory_bytes=81559 * MIB,
        pci_bus_id=f"0000:{0x18 + 0x10 * index:02x}:00.0",
        pcie_root=f"pci0000:{0x10 * index:02x}",
        numa_node=index // 4,
        mig_capable=True,
        mig_profiles=H100_PROFILES,
        vfio=VfioInfo(
            vendor_id="0x10de",
            device_id="0x2330",
            numa_node=index // 4,
            iommu_group=20 + index,
            iommu_fd_enabled=False,
            addressable_memory_bytes=262144 * MIB,
            product_name="GH100 [H100 SXM5 80GB]",
        ),
    )
    return msgspec.structs.replace(gpu, **changes)


def a100(index: int, migs: list[tuple[str, int, int]] | None = None, **changes) -> Gpu:
    """An A100 40GB; ``migs`` = [(profile, start, gi_id)] puts it in MIG mode with those devices."""
    by_name = {p.name: p for p in A100_PROFILES}
    devices = [
        MigDevice(
            uuid=f"MIG-{index:04x}{gi:04x}-aaaa-bbbb-cccc-dddddddddddd",
            profile=name,
            gi_profile_id=by_name[name].gi_profile_id,
            gi_id=gi,
            ci_id=0,
            placement=MigPlacement(start, by_name[name].placements[0].size),
        )
        for name, start, gi in migs or []
    ]
    gpu = h100(
        index,
        uuid=f"GPU-{index:08x}-aaaa-bbbb-cccc-dddddddddddd",
        product_name="NVIDIA A100-SXM4-40GB",
        architecture="Ampere",
        cuda_compute_capability="8.0",
        memory_bytes=40960 * MIB,
        mig_profiles=A100_PROFILES,
        mig_enabled=migs is not None,
        mig_devices=devices,
    )
    return msgspec.structs.replace(gpu, **changes)


def node(name: str = "n1", gpus: list[Gpu] | None = None) -> NodeInventory:
    return NodeInventory(
        node=name,
        driver_version="570.124.06",
        cuda_driver_version="12.8",
        gpus=gpus if gpus is not None else [h100(i) for i in range(8)],
    )


def dgx_a100(name: str = "n1") -> NodeInventory:
    """GPUs 0-3 whole, 4-7 in MIG mode (the layout of discovery's dgx-a100 fleet)."""
    migs = {
        4: [("3g.20gb", 0, 2), ("2g.10gb", 4, 3), ("1g.5gb", 6, 9)],
        5: [("1g.5gb", s, 7 + s) for s in range(7)],
        6: [("4g.20gb", 0, 1), ("3g.20gb", 4, 2)],
        7: [("1g.10gb", 0, 3), ("1g.10gb", 2, 4), ("2g.10gb", 4, 5), ("1g.5gb+me", 6, 13)],
    }
    return node(name, [a100(i, migs.get(i)) for i in range(8)])
