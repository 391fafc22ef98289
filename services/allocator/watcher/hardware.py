"""Which hardware an allocated device is, from the ResourceSlices that published it.

Claim events name the GPU behind each device (its UUID and PCI address, and a
MIG device's own UUID) so that an auditor can tell which physical GPU a claim
held without our inventory. The slices carry exactly that, in the attributes
the reference driver publishes; this index is rebuilt when they change.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.core.kube.resource import Device, ResourceSlice
from services.core.model import deviceattrs, nvidia
from services.core.model.schemas import DeviceRef

_Hardware = tuple[str, str, str]  # gpu uuid, pci bus id, the device's own uuid


class DeviceIndex:
    """(pool, device) -> the hardware, for our driver's devices."""

    def __init__(self) -> None:
        self._version: object = None
        self._found: dict[tuple[str, str], _Hardware] = {}

    def update(self, version: object, slices: Iterable[ResourceSlice]) -> None:
        if version == self._version:
            return
        found: dict[tuple[str, str], _Hardware] = {}
        gpus: dict[tuple[str, str], str] = {}  # (pool, PCI address) -> the GPU's uuid
        for item in slices:
            if item.spec.driver != nvidia.DRIVER_NAME:
                continue
            for device in item.spec.devices or []:
                hardware = _hardware(device)
                found[(item.spec.pool.name, device.name)] = hardware
                if _attr(device, deviceattrs.ATTR_TYPE) == nvidia.GPU_TYPE and hardware[1]:
                    gpus[(item.spec.pool.name, hardware[1])] = hardware[0]
        for (pool, name), (gpu_uuid, pci, own) in found.items():
            if not gpu_uuid and pci:  # a VFIO device: the GPU it passes through
                found[(pool, name)] = (gpus.get((pool, pci), ""), pci, own)
        self._found, self._version = found, version

    def ref(self, request: str, pool: str, device: str) -> DeviceRef:
        gpu_uuid, pci, own = self._found.get((pool, device), ("", "", ""))
        return DeviceRef(
            request=request, pool=pool, device=device, gpu_uuid=gpu_uuid, pci_bus_id=pci, uuid=own
        )


def _attr(device: Device, name: str) -> str:
    value = (device.attributes or {}).get(name)
    return value.string or "" if value is not None else ""


def _hardware(device: Device) -> _Hardware:
    kind = _attr(device, deviceattrs.ATTR_TYPE)
    uuid = _attr(device, deviceattrs.ATTR_UUID)
    pci = _attr(device, deviceattrs.ATTR_PCI_BUS_ID)
    if kind == nvidia.MIG_TYPE:
        return _attr(device, deviceattrs.ATTR_PARENT_UUID), pci, uuid
    if kind == nvidia.VFIO_TYPE:
        return "", pci, uuid  # its GPU's uuid: the GPU device at the same PCI address
    return uuid, pci, ""
