"""PCI facts NVML does not give: the PCIe root, the NUMA node and the VFIO twin's facts.

Both are read from sysfs the way the reference driver's libraries do:
``/sys/bus/pci/devices/<bdf>`` is a link into ``/sys/devices/pci<domain>:<bus>/...``
whose first component is the PCIe root (k8s deviceattribute); vendor, device,
NUMA node, IOMMU group and the BAR sizes come from the device directory, and
the addressable memory is the sum of the 64-bit memory BARs rounded up to a
power of two (go-nvlib nvpci). IOMMUFD is enabled when ``/dev/iommu`` exists.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from services.core.model.schemas import VfioInfo
from services.discovery import pciids
from services.discovery.pciids import PciIds

log = logging.getLogger(__name__)
BAR_COUNT = 6
MEM_TYPE_MASK = 0x06
MEM_TYPE_64 = 0x04


def pcie_root(bus_id: str, sysfs_root: Path = Path("/sys")) -> str | None:
    """``pci0000:00`` for ``0000:3b:00.0``; None when sysfs does not say."""
    link = sysfs_root / "bus" / "pci" / "devices" / bus_id
    try:
        target = os.readlink(link)
    except OSError as exc:
        log.warning("no PCIe root", extra={"pci_bus_id": bus_id, "error": str(exc)})
        return None
    resolved = os.path.normpath(os.path.join(link.parent, target))
    devices = os.path.normpath(sysfs_root / "devices")
    rel = os.path.relpath(resolved, devices)
    parts = rel.split(os.sep)
    if rel.startswith("..") or not parts[0].startswith("pci") or parts[-1] != bus_id:
        log.warning("unexpected sysfs link", extra={"pci_bus_id": bus_id, "target": target})
        return None
    return parts[0]


def numa_node(bus_id: str, sysfs_root: Path = Path("/sys")) -> int | None:
    """The device's NUMA node as the kernel says (go-nvlib nvpci); None when unknown (-1)."""
    numa = _int(sysfs_root / "bus" / "pci" / "devices" / bus_id / "numa_node", -1)
    return numa if numa >= 0 else None


def vfio_info(
    bus_id: str,
    sysfs_root: Path = Path("/sys"),
    dev_root: Path = Path("/dev"),
    pci_ids: PciIds | None = None,
) -> VfioInfo | None:
    """The twin's facts; its product name from ``pci_ids`` (default: :func:`pciids.load`)."""
    device = sysfs_root / "bus" / "pci" / "devices" / bus_id
    try:
        vendor = _hex(device / "vendor")
        device_id = _hex(device / "device")
        resources = (device / "resource").read_text().splitlines()
    except (OSError, ValueError) as exc:
        log.warning("no VFIO facts", extra={"pci_bus_id": bus_id, "error": str(exc)})
        return None
    return VfioInfo(
        vendor_id=f"0x{vendor:04x}",
        device_id=f"0x{device_id:04x}",
        numa_node=_int(device / "numa_node", -1),
        iommu_group=_iommu_group(device),
        iommu_fd_enabled=(dev_root / "iommu").exists(),
        addressable_memory_bytes=addressable_memory(resources),
        product_name=(pci_ids or pciids.load()).device_name(vendor, device_id),
    )


def addressable_memory(resource_lines: list[str]) -> int:
    """Sum of the 64-bit memory BARs among the first six, rounded up to a power of two."""
    total = 0
    for line in resource_lines[:BAR_COUNT]:
        start, end, flags = (int(field, 16) for field in line.split()[:3])
        if end > start and flags & MEM_TYPE_MASK == MEM_TYPE_64:
            total += end - start + 1
    return 1 << (total - 1).bit_length() if total else 0


def _hex(path: Path) -> int:
    return int(path.read_text().strip(), 16)


def _int(path: Path, default: int) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return default


def _iommu_group(device: Path) -> int:
    try:
        return int(os.path.basename(os.readlink(device / "iommu_group")))
    except (OSError, ValueError):
        return -1
