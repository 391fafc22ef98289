"""The NVIDIA device model: what the reference driver (kubernetes-sigs/dra-driver-nvidia-gpu)
publishes for a GPU, a MIG device, a dynamic-MIG partition and a VFIO twin.

One place for each fact, one module for each kind of fact:

- here: the driver name, the device types and the device names, and the way back
  from a published name to what it denotes (:func:`parse_device_name`, the
  preparer's way back to hardware);
- :mod:`.deviceattrs`: attribute and capacity names, and a device's attributes;
- :mod:`.devicevalues`: the interned attribute, capacity and counter values;
- :mod:`.gpudevices`: the devices published without DynamicMIG (full GPU, static
  MIG device, VFIO twin);
- :mod:`.migpartitions`: DynamicMIG's counter sets and partition devices;
- :mod:`.gpuhealth`: XIDs, their words and the taints they become;
- :mod:`.deviceclasses`: the DeviceClasses;
- :mod:`.cliques`: a node's NVLink clique.

The publisher turns an inventory into devices with the builders there. Every rule
follows the reference code (``cmd/gpu-kubelet-plugin``: deviceinfo.go, mig.go,
partitions.go, nvlib.go, device_health.go); where it differs from CONTRACTS.md the
code wins and the docstring says so.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from services.core.model.schemas import Gpu

DRIVER_NAME = "gpu.nvidia.com"

DeviceType = Literal["gpu", "mig", "vfio"]
GPU_TYPE: DeviceType = "gpu"
MIG_TYPE: DeviceType = "mig"  # static and dynamic MIG look the same to users
VFIO_TYPE: DeviceType = "vfio"


class InventoryError(ValueError):
    """Inventory content the device model cannot publish (which field, what was expected)."""


# ------------------------------------------------------------------ names


def rfc1123(name: str) -> str:
    """Lower-case, ``[^a-z0-9-.]`` -> ``-``, trimmed: the reference's toRFC1123Compliant."""
    name = re.sub(r"[^a-z0-9.-]", "-", name.lower()).strip("-")
    return name.removesuffix(".")[:253]


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, gi_profile_id: int, start: int) -> str:
    """``gpu-<minor>-mig-<profile without dots>-<giProfileId>-<placementStart>``."""
    return f"gpu-{parent_minor}-mig-{profile_token(profile)}-{gi_profile_id}-{start}"


@functools.lru_cache(maxsize=256)
def profile_token(profile: str) -> str:
    """A profile as it appears in device names: "1g.10gb+me" -> "1g10gb-me"."""
    return rfc1123(profile.replace(".", ""))


def vfio_device_name(index: int) -> str:
    return f"gpu-vfio-{index}"


def vfio_order(gpus: Iterable[Gpu]) -> list[Gpu]:
    """The GPUs in VFIO numbering order: ``gpu-vfio-<i>`` is the twin of the i-th.

    The reference numbers the node's NVIDIA GPUs in PCI address order (go-nvlib
    nvpci.GetGPUs sorts by the address read as one hex number), counting GPUs
    that get no twin (MIG devices, no VFIO support) too. A GPU whose address is
    unknown (lost before discovery ever saw it answer) cannot be placed; it is
    left out rather than shifting every other twin's index.
    """
    placed = [(key, gpu) for gpu in gpus if (key := _pci_address_id(gpu.pci_bus_id)) is not None]
    return [gpu for _, gpu in sorted(placed, key=lambda kg: kg[0])]


def _pci_address_id(bus_id: str) -> int | None:
    """``0000:3b:00.0`` -> 0x00003b000 (go-nvlib's addressToID); None for no address."""
    digits = bus_id.replace(":", "").replace(".", "")
    try:
        return int(digits, 16)
    except ValueError:
        return None


@dataclass(frozen=True)
class DeviceId:
    """What a published device name denotes (the preparer's way back to hardware)."""

    kind: DeviceType
    minor: int | None = None  # GPU minor, or the MIG device's parent minor
    profile_token: str | None = None  # MIG profile as it appears in the name ("1g10gb")
    gi_profile_id: int | None = None
    placement_start: int | None = None
    vfio_index: int | None = None


_GPU_NAME = re.compile(r"^gpu-(\d+)$")
_VFIO_NAME = re.compile(r"^gpu-vfio-(\d+)$")
_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")


def parse_device_name(name: str) -> DeviceId:
    """Invert the device-name functions; raise ValueError for a name we never publish."""
    if m := _GPU_NAME.match(name):
        return DeviceId(GPU_TYPE, minor=int(m[1]))
    if m := _VFIO_NAME.match(name):
        return DeviceId(VFIO_TYPE, vfio_index=int(m[1]))
    if m := _MIG_NAME.match(name):
        return DeviceId(
            MIG_TYPE,
            minor=int(m[1]),
            profile_token=m[2],
            gi_profile_id=int(m[3]),
            placement_start=int(m[4]),
        )
    raise ValueError(
        f"device name {name!r} is not gpu-<minor>, gpu-vfio-<index> or "
        "gpu-<minor>-mig-<profile>-<giProfileId>-<placementStart>"
    )


def is_vfio_device_name(name: str) -> bool:
    """Whether ``name`` is a VFIO twin's (``gpu-vfio-<index>``)."""
    return _VFIO_NAME.match(name) is not None
