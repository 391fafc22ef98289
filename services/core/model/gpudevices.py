"""The devices a GPU is published as without DynamicMIG: the full GPU, each of its static
MIG devices, and its VFIO twin."""

from __future__ import annotations

import uuid

from services.core.kube.resource import Device, DeviceAttribute
from services.core.model.deviceattrs import (
    ATTR_DEVICE_ID,
    ATTR_IOMMU_FD_ENABLED,
    ATTR_NUMA_NODE,
    ATTR_PCI_BUS_ID,
    ATTR_PCIE_ROOT,
    ATTR_PRODUCT_NAME,
    ATTR_TYPE,
    ATTR_UUID,
    ATTR_VENDOR_ID,
    CAP_ADDRESSABLE_MEMORY,
    CAP_MEMORY,
    gpu_attributes,
    memory_slice_capacity,
    mig_attributes,
    profile_capacities,
)
from services.core.model.devicevalues import (
    capacity_value,
    capacity_values,
    int_attribute,
    string_attribute,
)
from services.core.model.nvidia import (
    VFIO_TYPE,
    InventoryError,
    gpu_device_name,
    mig_device_name,
    vfio_device_name,
)
from services.core.model.schemas import Gpu, MigDevice, MigProfile, NodeInventory


def gpu_device(gpu: Gpu, inv: NodeInventory) -> Device:
    """A full GPU as published without DynamicMIG (GpuInfo.GetDevice)."""
    return Device(
        name=gpu_device_name(gpu.minor),
        attributes=gpu_attributes(gpu, inv),
        capacity={CAP_MEMORY: capacity_value(gpu.memory_bytes)},
    )


def static_mig_device(gpu: Gpu, mig: MigDevice, inv: NodeInventory) -> Device:
    """An existing MIG device (MigDeviceInfo.GetDevice): uuid, profile capacities, memory slices."""
    profile = _find_profile(gpu, mig.gi_profile_id, mig.profile)
    attrs = mig_attributes(gpu, mig.profile, inv)
    attrs[ATTR_UUID] = string_attribute(mig.uuid)
    capacity = capacity_values(profile_capacities(profile))
    for i in range(mig.placement.start, mig.placement.start + mig.placement.size):
        capacity[memory_slice_capacity(i)] = capacity_value(1)
    return Device(
        name=mig_device_name(gpu.minor, mig.profile, mig.gi_profile_id, mig.placement.start),
        attributes=attrs,
        capacity=capacity,
    )


def vfio_uuid(pci_bus_id: str) -> str:
    """The VFIO twin's stable UUID: SHA-1 name-based UUID of the PCI address (uuid.NewSHA1)."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, pci_bus_id))


def vfio_device(gpu: Gpu, index: int) -> Device:
    """The VFIO twin of a GPU (VfioDeviceInfo.GetDevice); ``index`` is its PCI enumeration order."""
    if gpu.vfio is None:
        raise InventoryError(f"gpu {gpu.index}: no vfio facts to publish a VFIO device from")
    attrs = {
        ATTR_TYPE: string_attribute(VFIO_TYPE),
        ATTR_UUID: string_attribute(vfio_uuid(gpu.pci_bus_id)),
        ATTR_DEVICE_ID: string_attribute(gpu.vfio.device_id),
        ATTR_VENDOR_ID: string_attribute(gpu.vfio.vendor_id),
        ATTR_PRODUCT_NAME: string_attribute(gpu.vfio.product_name),  # the PCI database's name
        ATTR_IOMMU_FD_ENABLED: DeviceAttribute(bool_=gpu.vfio.iommu_fd_enabled),
        ATTR_PCI_BUS_ID: string_attribute(gpu.pci_bus_id),
    }
    if gpu.pcie_root:
        attrs[ATTR_PCIE_ROOT] = string_attribute(gpu.pcie_root)
    if gpu.vfio.numa_node >= 0:
        attrs[ATTR_NUMA_NODE] = int_attribute(gpu.vfio.numa_node)
    return Device(
        name=vfio_device_name(index),
        attributes=attrs,
        capacity={CAP_ADDRESSABLE_MEMORY: capacity_value(gpu.vfio.addressable_memory_bytes)},
    )


def _find_profile(gpu: Gpu, gi_profile_id: int, name: str) -> MigProfile:
    for profile in gpu.mig_profiles:
        if profile.gi_profile_id == gi_profile_id:
            return profile
    raise InventoryError(
        f"gpu {gpu.index}: MIG device profile {name!r} (gi_profile_id {gi_profile_id}) "
        "is not among the GPU's mig_profiles"
    )
