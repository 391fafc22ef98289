"""Prepared device states and a CDI generator over a simulated driver root, for spec tests."""

from __future__ import annotations

from pathlib import Path

from services.preparer.cdigen.caps import TableCaps
from services.preparer.cdigen.generator import Generator, Options
from services.preparer.checkpoint import (
    MigState,
    PreparedDeviceState,
    VfioState,
)
from services.preparer.devices import simroot

UID = "0e2f6c1a-8b3d-4c5e-9f70-1a2b3c4d5e6f"
VERSION = "570.124.06"
CAPS_MAJOR = 508


def generator(
    root: Path, version: str = VERSION, *, host_root: str = "", iommufd: bool = False
) -> Generator:
    """A generator over the simulated backend's driver root (built at ``root``), GPUs 0-7."""
    simroot.build(root, version)
    host = host_root or str(root)
    options = Options(
        driver_root=str(root),
        host_driver_root=host,
        hook_path=f"{host.rstrip('/')}/usr/bin/nvidia-cdi-hook",
    )
    devs = simroot.SimDevFs(lambda: (set(range(8)), iommufd))
    return Generator(options, devs, TableCaps(CAPS_MAJOR), lambda: iommufd)


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
        vfio=VfioState(pci_bus_id="0000:3b:00.0", iommu_group=group, iommufd_dev="vfio3"),
    )  # fmt: skip
