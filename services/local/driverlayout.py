"""What a fake driver installation (:mod:`services.local.driverroot`) is made of: where
its pieces go, the driver's version, its GPUs and the pieces left out.

The builders (:mod:`services.local.drivergpus`, :mod:`services.local.driverfiles`,
:mod:`services.local.driverkernel`) take a :class:`DriverLayout`; the built
:class:`~services.local.driverroot.DriverRoot` is one, so the builders never import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.core.model.nvidia import mig_device_name


@dataclass(frozen=True)
class FakeMig:
    """A MIG device as NVML and /proc/driver/nvidia/capabilities describe it."""

    uuid: str
    parent_uuid: str
    parent_minor: int
    profile: str  # "1g.10gb"
    gi_profile_id: int
    placement_start: int
    placement_size: int
    gi_id: int
    ci_id: int
    gi_cap_minor: int  # /dev/nvidia-caps/nvidia-cap<N> of the GPU instance
    ci_cap_minor: int  # ... and of the compute instance

    @property
    def device_name(self) -> str:
        """The DRA device name, as the publisher names it."""
        return mig_device_name(
            self.parent_minor, self.profile, self.gi_profile_id, self.placement_start
        )


@dataclass(frozen=True)
class FakeGpu:
    index: int
    uuid: str
    minor: int
    pci_bus_id: str
    model: str
    iommu_group: int
    vfio_dev: str  # "vfio3": its /dev/vfio/devices cdev when IOMMUFD is on
    migs: tuple[FakeMig, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DriverLayout:
    """Where an installation's pieces go and what they describe; paths are absolute."""

    driver_root: Path  # the host's driver root (as the toolkit's --driver-root)
    dev_root: Path  # contains dev/ (as the toolkit's --dev-root)
    proc: Path  # stands in for /proc
    sysfs: Path  # stands in for /sys
    version: str
    cuda_version: int
    iommufd: bool
    gpus: tuple[FakeGpu, ...]
    missing: frozenset[str] = field(default_factory=frozenset)  # see driverroot.PIECES

    def migs(self) -> list[FakeMig]:
        return [m for g in self.gpus for m in g.migs]
