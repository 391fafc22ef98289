"""Device attributes and capacities: their names, and the attributes of a published device.

Bare names belong to the driver's domain; the reference publishes the PCI facts
under Kubernetes' standard domain (k8s.io/dynamic-resource-allocation/deviceattribute).
Versions are published as the reference parses them (:func:`semver`); with
DRAListTypeAttributes some attributes are published as lists
(:func:`list_type_attributes`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import msgspec

from services.core.kube.resource import Device, DeviceAttribute
from services.core.model.devicevalues import int_attribute, string_attribute
from services.core.model.nvidia import GPU_TYPE, MIG_TYPE, InventoryError
from services.core.model.schemas import Gpu, MigProfile, NodeInventory

# ------------------------------------------------------------------ attribute names
ATTR_TYPE = "type"
ATTR_UUID = "uuid"
ATTR_PRODUCT_NAME = "productName"
ATTR_BRAND = "brand"
ATTR_ARCHITECTURE = "architecture"
ATTR_CUDA_COMPUTE_CAPABILITY = "cudaComputeCapability"
ATTR_DRIVER_VERSION = "driverVersion"
ATTR_CUDA_DRIVER_VERSION = "cudaDriverVersion"
ATTR_ADDRESSING_MODE = "addressingMode"
ATTR_PARENT_UUID = "parentUUID"
ATTR_PROFILE = "profile"
ATTR_DEVICE_ID = "deviceID"
ATTR_VENDOR_ID = "vendorID"
ATTR_IOMMU_FD_ENABLED = "iommuFDEnabled"
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
# CONTRACTS.md says "numa" for VFIO; the reference publishes this standard name
# for full GPUs, MIG devices and VFIO devices alike.
ATTR_NUMA_NODE = "resource.kubernetes.io/numaNode"

# ------------------------------------------------------------------ capacity names
CAP_MEMORY = "memory"
CAP_MULTIPROCESSORS = "multiprocessors"
CAP_COPY_ENGINES = "copyEngines"
CAP_DECODERS = "decoders"
CAP_ENCODERS = "encoders"
CAP_JPEG_ENGINES = "jpegEngines"
CAP_OFA_ENGINES = "ofaEngines"
CAP_ADDRESSABLE_MEMORY = "addressableMemory"


def memory_slice_capacity(index: int) -> str:
    """Capacity name of one memory slice of a static MIG device (``memorySlice<i>``)."""
    return f"memorySlice{index}"


# ------------------------------------------------------------------ versions

_LOOSE_SEMVER = re.compile(
    r"^v?([0-9]+)(\.[0-9]+)?(\.[0-9]+)?"
    r"(-([0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*))?"
    r"(\+([0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*))?$"
)


@functools.lru_cache(maxsize=256)
def semver(text: str, field: str = "version") -> str:
    """Masterminds ``semver.MustParse(text).String()``, as the reference publishes versions.

    The loose parser fills missing parts with 0 and drops leading zeros:
    "9.0" -> "9.0.0", "570.124.06" -> "570.124.6", "12.8" -> "12.8.0".
    """
    m = _LOOSE_SEMVER.match(text)
    if m is None:
        raise InventoryError(
            f"{field}: {text!r} is not a version (expected e.g. 9.0 or 570.124.06)"
        )
    major, minor, patch = (int(g.lstrip(".")) if g else 0 for g in (m[1], m[2], m[3]))
    pre, meta = m[5], m[8]
    for ident in (pre or "").split(".") if pre else ():
        if ident.isdigit() and len(ident) > 1 and ident[0] == "0":
            raise InventoryError(f"{field}: {text!r} has a pre-release part with a leading zero")
    out = f"{major}.{minor}.{patch}"
    out += f"-{pre}" if pre else ""
    out += f"+{meta}" if meta else ""
    return out


# ------------------------------------------------------------------ attributes


def _pci_attributes(gpu: Gpu) -> dict[str, DeviceAttribute]:
    attrs = {ATTR_PCI_BUS_ID: string_attribute(gpu.pci_bus_id)}
    if gpu.pcie_root:
        attrs[ATTR_PCIE_ROOT] = string_attribute(gpu.pcie_root)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs[ATTR_NUMA_NODE] = int_attribute(gpu.numa_node)
    return attrs


def _versions(gpu: Gpu, inv: NodeInventory) -> dict[str, DeviceAttribute]:
    where = f"gpu {gpu.index}"
    return {
        ATTR_CUDA_COMPUTE_CAPABILITY: DeviceAttribute(
            version=semver(gpu.cuda_compute_capability, f"{where}: cuda_compute_capability")
        ),
        ATTR_DRIVER_VERSION: DeviceAttribute(version=semver(inv.driver_version, "driver_version")),
        ATTR_CUDA_DRIVER_VERSION: DeviceAttribute(
            version=semver(inv.cuda_driver_version, "cuda_driver_version")
        ),
    }


def _gpu_facts(gpu: Gpu, inv: NodeInventory) -> dict[str, DeviceAttribute]:
    """The physical GPU's facts, which a full GPU and each of its MIG devices carry."""
    attrs = {
        ATTR_PRODUCT_NAME: string_attribute(gpu.product_name),
        ATTR_BRAND: string_attribute(gpu.brand),
        ATTR_ARCHITECTURE: string_attribute(gpu.architecture),
        **_versions(gpu, inv),
        **_pci_attributes(gpu),
    }
    if gpu.addressing_mode:
        attrs[ATTR_ADDRESSING_MODE] = string_attribute(gpu.addressing_mode)
    return attrs


def gpu_attributes(gpu: Gpu, inv: NodeInventory) -> dict[str, DeviceAttribute]:
    """A full GPU's attributes (GpuInfo.Attributes)."""
    return {
        ATTR_TYPE: string_attribute(GPU_TYPE),
        ATTR_UUID: string_attribute(gpu.uuid),
        **_gpu_facts(gpu, inv),
    }


def mig_attributes(gpu: Gpu, profile: str, inv: NodeInventory) -> dict[str, DeviceAttribute]:
    """What static and dynamic MIG devices share (CommonAttributesMig): the parent's facts."""
    return {
        ATTR_TYPE: string_attribute(MIG_TYPE),
        ATTR_PARENT_UUID: string_attribute(gpu.uuid),
        ATTR_PROFILE: string_attribute(profile),
        **_gpu_facts(gpu, inv),
    }


# What DRAListTypeAttributes changes (KEP-6072): the reference's addNumaNodeAttribute
# publishes the standard numaNode as a one-element ints list instead of an int, on every
# device that has it (full GPU, MIG device, dynamic-MIG partition, VFIO twin); no other
# attribute changes form.
LIST_TYPE_ATTRIBUTES = frozenset({ATTR_NUMA_NODE})


@functools.lru_cache(maxsize=256)
def _ints(value: int) -> DeviceAttribute:
    return DeviceAttribute(ints=[value])


def list_type_attributes(devices: Iterable[Device]) -> list[Device]:
    """``devices`` as the reference publishes them with DRAListTypeAttributes on.

    New device objects where an attribute changes form; devices that shared an
    attribute map share its list-form copy (rendered pools are values: no map is
    changed in place).
    """
    out: list[Device] = []
    # id -> (map, its list form); holding the map keeps its id from being reused
    copies: dict[int, tuple[dict[str, DeviceAttribute], dict[str, DeviceAttribute]]] = {}
    for device in devices:
        attrs = device.attributes or {}
        hit = copies.get(id(attrs))
        if hit is None:
            changed = {
                name: _ints(attr.int_)
                for name in LIST_TYPE_ATTRIBUTES
                if (attr := attrs.get(name)) is not None and attr.int_ is not None
            }
            hit = copies[id(attrs)] = (attrs, {**attrs, **changed} if changed else attrs)
        listed = hit[1]
        out.append(
            device if listed is attrs else msgspec.structs.replace(device, attributes=listed)
        )
    return out


def scalar_attributes(devices: Iterable[Device]) -> list[Device]:
    """The inverse of :func:`list_type_attributes`, for an API server that cannot store
    lists: a one-element list becomes its value again; a longer one, which has no
    scalar form, is left out."""
    out: list[Device] = []
    for device in devices:
        attrs = device.attributes
        if not attrs or not any(a.is_list for a in attrs.values()):
            out.append(device)
            continue
        scalar: dict[str, DeviceAttribute] = {}
        for name, attr in attrs.items():
            if not attr.is_list:
                scalar[name] = attr
            elif attr.ints is not None and len(attr.ints) == 1:
                scalar[name] = int_attribute(attr.ints[0])
            elif attr.bools is not None and len(attr.bools) == 1:
                scalar[name] = DeviceAttribute(bool_=attr.bools[0])
            elif attr.strings is not None and len(attr.strings) == 1:
                scalar[name] = string_attribute(attr.strings[0])
            elif attr.versions is not None and len(attr.versions) == 1:
                scalar[name] = DeviceAttribute(version=attr.versions[0])
        out.append(msgspec.structs.replace(device, attributes=scalar or None))
    return out


def has_list_attributes(device: Device) -> bool:
    """Whether the device has a list-type attribute (an advanced feature for the
    per-slice device limit, as taints and consumed counters are)."""
    for a in (device.attributes or {}).values():
        if a.ints is not None or a.bools is not None or a.strings is not None:
            return True
        if a.versions is not None:
            return True
    return False


# ------------------------------------------------------------------ capacities


def profile_capacities(profile: MigProfile) -> dict[str, int]:
    """A MIG profile's capacities (CommonCapacitiesMig), without memory slices."""
    return {
        CAP_MULTIPROCESSORS: profile.multiprocessors,
        CAP_COPY_ENGINES: profile.copy_engines,
        CAP_DECODERS: profile.decoders,
        CAP_ENCODERS: profile.encoders,
        CAP_JPEG_ENGINES: profile.jpeg_engines,
        CAP_OFA_ENGINES: profile.ofa_engines,
        CAP_MEMORY: profile.memory_bytes,
    }
