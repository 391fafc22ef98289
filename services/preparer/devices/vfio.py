"""Moving a GPU between the nvidia driver and vfio-pci through sysfs.

``driver_override`` pins which driver may claim the device, so the nvidia
driver cannot grab it back between unbind and bind; clearing it and asking
the kernel to probe again hands the GPU back to nvidia.
"""

from __future__ import annotations

import os
from pathlib import Path

from services.preparer.checkpoint import VfioState
from services.preparer.devices.base import DeviceOpError

VFIO_DRIVER = "vfio-pci"
NVIDIA_DRIVER = "nvidia"


class VfioSysfs:
    def __init__(self, sysfs: Path = Path("/sys")) -> None:
        self.sysfs = sysfs

    def _device(self, bdf: str) -> Path:
        return self.sysfs / "bus" / "pci" / "devices" / bdf

    def driver(self, bdf: str) -> str:
        """The driver bound to the device now ("" when none)."""
        link = self._device(bdf) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else ""

    def iommu_group(self, bdf: str) -> int:
        link = self._device(bdf) / "iommu_group"
        if not link.is_symlink():
            raise DeviceOpError(f"GPU {bdf}: no IOMMU group (is the IOMMU enabled?)")
        return int(os.path.basename(os.readlink(link)))

    def bind(self, bdf: str) -> VfioState:
        """Rebind to vfio-pci; already bound is fine."""
        if not self._device(bdf).exists():
            raise DeviceOpError(f"GPU {bdf}: no such PCI device in {self.sysfs}")
        group = self.iommu_group(bdf)
        current = self.driver(bdf)
        if current == VFIO_DRIVER:
            return VfioState(
                pci_bus_id=bdf,
                iommu_group=group,
                previous_driver=NVIDIA_DRIVER,
                iommufd_dev=self.iommufd_dev(bdf),
            )
        if current not in ("", NVIDIA_DRIVER):
            raise DeviceOpError(
                f"GPU {bdf} is bound to {current!r}; expected {NVIDIA_DRIVER} or {VFIO_DRIVER}"
            )
        self._write(self._device(bdf) / "driver_override", VFIO_DRIVER, bdf)
        if current:
            self._write(self._device(bdf) / "driver" / "unbind", bdf, bdf)
        self._write(self.sysfs / "bus" / "pci" / "drivers" / VFIO_DRIVER / "bind", bdf, bdf)
        return VfioState(
            pci_bus_id=bdf,
            iommu_group=group,
            previous_driver=current or NVIDIA_DRIVER,
            iommufd_dev=self.iommufd_dev(bdf),
        )

    def iommufd_dev(self, bdf: str) -> str:
        """The device's IOMMUFD cdev (``vfioN``) once vfio-pci has it ("" when none)."""
        try:
            names = sorted(os.listdir(self._device(bdf) / "vfio-dev"))
        except OSError:
            return ""
        return next((n for n in names if n.startswith("vfio")), "")

    def unbind(self, state: VfioState) -> None:
        """Back to the previous driver (nvidia); already there is fine."""
        bdf = state.pci_bus_id
        if not self._device(bdf).exists() or self.driver(bdf) == state.previous_driver:
            return
        self._write(self._device(bdf) / "driver_override", "\n", bdf)
        if self.driver(bdf):
            self._write(self._device(bdf) / "driver" / "unbind", bdf, bdf)
        self._write(self.sysfs / "bus" / "pci" / "drivers_probe", bdf, bdf)

    @staticmethod
    def _write(path: Path, value: str, bdf: str) -> None:
        try:
            path.write_text(value)
        except OSError as exc:
            raise DeviceOpError(f"GPU {bdf}: writing {value.strip()!r} to {path}: {exc}") from exc
