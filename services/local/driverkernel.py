"""The kernel's side of a fake driver installation (:mod:`services.local.driverroot`):
character device nodes made with ``mknod``, a sysfs of the PCI devices, and the
``/proc`` files the driver writes.

Made for the GPUs of :mod:`services.local.drivergpus`, with the majors and minors a
real node has, so that the CDI specs name device nodes that exist.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from services.discovery.models import get_model
from services.local.drivergpus import mig_cap_minors
from services.local.driverlayout import DriverLayout

# Char majors: 195 is fixed by the nvidia module, 10 is misc; the others are
# dynamic on a real node, these are what one H100 node had.
NVIDIA_MAJOR = 195
UVM_MAJOR = 510
CAPS_MAJOR = 511
VFIO_GROUP_MAJOR = 505
VFIO_DEV_MAJOR = 506
MISC_MAJOR = 10
VFIO_MISC_MINOR = 196
IOMMU_MISC_MINOR = 123


def _mknod(path: Path, major: int, minor: int, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # the umask may have trimmed it


def device_nodes(root: DriverLayout) -> None:
    dev, gone = root.dev_root / "dev", root.missing
    if "gpu-nodes" not in gone:
        for g in root.gpus:
            _mknod(dev / f"nvidia{g.minor}", NVIDIA_MAJOR, g.minor, 0o666)
    control = {
        "nvidiactl": (NVIDIA_MAJOR, 255),
        "nvidia-modeset": (NVIDIA_MAJOR, 254),
        "nvidia-uvm": (UVM_MAJOR, 0),
        "nvidia-uvm-tools": (UVM_MAJOR, 1),
    }
    for name, (major, minor) in control.items():
        if name not in gone:
            _mknod(dev / name, major, minor, 0o666)
    if "caps-nodes" not in gone:
        caps = dev / "nvidia-caps"
        _mknod(caps / "nvidia-cap1", CAPS_MAJOR, 1, 0o400)  # mig/config
        _mknod(caps / "nvidia-cap2", CAPS_MAJOR, 2, 0o444)  # mig/monitor
        for m in root.migs():
            _mknod(caps / f"nvidia-cap{m.gi_cap_minor}", CAPS_MAJOR, m.gi_cap_minor, 0o444)
            _mknod(caps / f"nvidia-cap{m.ci_cap_minor}", CAPS_MAJOR, m.ci_cap_minor, 0o444)
    if "vfio-nodes" not in gone:
        _mknod(dev / "vfio" / "vfio", MISC_MAJOR, VFIO_MISC_MINOR, 0o666)
        for i, g in enumerate(root.gpus):
            _mknod(dev / "vfio" / str(g.iommu_group), VFIO_GROUP_MAJOR, i, 0o600)
            if root.iommufd:
                _mknod(dev / "vfio" / "devices" / g.vfio_dev, VFIO_DEV_MAJOR, i, 0o600)
        if root.iommufd:
            _mknod(dev / "iommu", MISC_MAJOR, IOMMU_MISC_MINOR, 0o666)


def sysfs(root: DriverLayout) -> None:
    """PCI devices as go-nvlib's nvpci and our VFIO code read them (GPUs bound to vfio-pci)."""
    sys_root = root.sysfs
    devices = sys_root / "bus" / "pci" / "devices"
    drivers = sys_root / "bus" / "pci" / "drivers"
    groups = sys_root / "kernel" / "iommu_groups"
    for d in (
        devices,
        drivers / "vfio-pci",
        drivers / "nvidia",
        groups,
    ):
        d.mkdir(parents=True, exist_ok=True)
    for g in root.gpus:
        model = get_model(g.model)
        device = sys_root / "devices" / "pci0000:00" / g.pci_bus_id
        device.mkdir(parents=True)
        files = {
            "vendor": "0x10de",
            "device": f"0x{model.pci_device_id:04x}",
            "class": "0x030200",
            "numa_node": "-1",
            "resource": "0x00000000ac000000 0x00000000acffffff 0x0000000000040200\n"
            "0x0000000000000000 0x0000000000000000 0x0000000000000000",
            "sriov_totalvfs": "0",
            "sriov_numvfs": "0",
        }
        for name, text in files.items():
            (device / name).write_text(text + "\n")
        group = groups / str(g.iommu_group)
        (group / "devices").mkdir(parents=True)
        os.symlink(os.path.relpath(group, device), device / "iommu_group")
        os.symlink(os.path.relpath(device, group / "devices"), group / "devices" / g.pci_bus_id)
        os.symlink(os.path.relpath(drivers / "vfio-pci", device), device / "driver")
        if root.iommufd:
            (device / "vfio-dev" / g.vfio_dev).mkdir(parents=True)
        os.symlink(os.path.relpath(device, devices), devices / g.pci_bus_id)


def proc(root: DriverLayout) -> None:
    proc = root.proc
    (proc / "devices").write_text(
        "Character devices:\n  1 mem\n  4 tty\n 10 misc\n"
        f"{NVIDIA_MAJOR} nvidia-frontend\n{VFIO_GROUP_MAJOR} vfio\n{VFIO_DEV_MAJOR} vfio-dev\n"
        f"{UVM_MAJOR} nvidia-uvm\n{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n  8 sd\n"
    )
    nv = proc / "driver" / "nvidia"
    (nv / "gpus").mkdir(parents=True)
    (nv / "version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {root.version}  "
        "Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    for g in root.gpus:
        info = nv / "gpus" / g.pci_bus_id
        info.mkdir()
        (info / "information").write_text(
            f"Model: \t\t {get_model(g.model).product_name}\nIRQ:   \t\t 0\n"
            f"GPU UUID: \t {g.uuid}\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\n"
            f"DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {g.pci_bus_id}\n"
            f"Device Minor: \t {g.minor}\nGPU Firmware: \t {root.version}\nGPU Excluded:\t No\n"
        )
    caps = nv / "capabilities"
    _cap_file(caps / "mig" / "config", 1, 0o400)
    _cap_file(caps / "mig" / "monitor", 2, 0o444)
    for m in root.migs():
        gi = caps / f"gpu{m.parent_minor}" / "mig" / f"gi{m.gi_id}"
        _cap_file(gi / "access", m.gi_cap_minor, 0o444)
        _cap_file(gi / f"ci{m.ci_id}" / "access", m.ci_cap_minor, 0o444)
    lines = ["config 1", "monitor 2"]
    for gpu in range(32):
        for gi_id in range(15):
            gi_minor, _ = mig_cap_minors(gpu, gi_id, 0)
            lines.append(f"gpu{gpu}/gi{gi_id}/access {gi_minor}")
            lines += [f"gpu{gpu}/gi{gi_id}/ci{ci}/access {gi_minor + 1 + ci}" for ci in range(8)]
    (proc / "driver" / "nvidia-caps").mkdir(parents=True)
    (proc / "driver" / "nvidia-caps" / "mig-minors").write_text("\n".join(lines) + "\n")


def _cap_file(path: Path, minor: int, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
