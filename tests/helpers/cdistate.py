"""Prepared device states and node facts for tests of the CDI spec."""

from __future__ import annotations

from services.preparer import cdi
from services.preparer.checkpoint import (
    MigState,
    PreparedDeviceState,
    VfioState,
)

UID = "0e2f6c1a-8b3d-4c5e-9f70-1a2b3c4d5e6f"


FACTS = cdi.NodeFacts(
    driver_files=[
        cdi.DriverFile(
            "/usr/lib/x86_64-linux-gnu/libcuda.so.570.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.570.1",
        )
    ],
    caps_major=508,
)


def gpu(name: str = "gpu-2", minor: int = 2, group: int = 0) -> PreparedDeviceState:
    return PreparedDeviceState(
        name=name,
        kind="gpu",
        requests=["r"],
        pool="n1",
        gpu_uuid="GPU-1",
        gpu_minor=minor,
        group=group,
    )


def mig(minor: int = 1, gi: int = 9, ci: int = 0) -> PreparedDeviceState:
    state = MigState(
        uuid="MIG-1", parent_uuid="GPU-1", parent_minor=minor, profile="1g.10gb",
        gi_profile_id=19, placement_start=2, gi_id=gi, ci_id=ci,
    )  # fmt: skip
    return PreparedDeviceState(
        name=f"gpu-{minor}-mig-1g10gb-19-2", kind="mig", requests=["m"], pool="n1",
        gpu_uuid="GPU-1", gpu_minor=minor, mig=state,
    )  # fmt: skip


def vfio(group: int = 42) -> PreparedDeviceState:
    return PreparedDeviceState(
        name="gpu-vfio-0", kind="vfio", requests=["v"], pool="n1", gpu_uuid="GPU-1",
        vfio=VfioState(pci_bus_id="0000:3b:00.0", iommu_group=group),
    )  # fmt: skip
