"""The NVIDIA device model: what the reference driver (kubernetes-sigs/dra-driver-nvidia-gpu)
publishes for a GPU, a MIG device, a dynamic-MIG partition and a VFIO twin.

One place for each fact: the driver name, device types, device and counter names,
attribute and capacity names, taint keys and DeviceClasses. The publisher turns an
inventory into devices with the builders here; the preparer maps a device name
back to what it denotes with :func:`parse_device_name`. Every rule follows the
reference code (``cmd/gpu-kubelet-plugin``: deviceinfo.go, mig.go, partitions.go,
nvlib.go, device_health.go); where it differs from CONTRACTS.md the code wins and
the docstring says so.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import msgspec

from services.core.kube import quantity
from services.core.kube.resource import (
    CELDeviceSelector,
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceClass,
    DeviceClassSpec,
    DeviceCounterConsumption,
    DeviceSelector,
    DeviceTaint,
    ObjectMeta,
)
from services.core.model.schemas import Gpu, MigDevice, MigPlacement, MigProfile, NodeInventory, Xid

DRIVER_NAME = "gpu.nvidia.com"

DeviceType = Literal["gpu", "mig", "vfio"]
GPU_TYPE: DeviceType = "gpu"
MIG_TYPE: DeviceType = "mig"  # static and dynamic MIG look the same to users
VFIO_TYPE: DeviceType = "vfio"

# ------------------------------------------------------------------ attribute names
# Bare names belong to the driver's domain; the reference publishes the PCI facts
# under Kubernetes' standard domain (k8s.io/dynamic-resource-allocation/deviceattribute).
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


@functools.lru_cache(maxsize=256)
def memory_slice_counter(index: int) -> str:
    """Counter name of one memory slice in a GPU's counter set (``memory-slice-<i>``)."""
    return f"memory-slice-{index}"


@functools.lru_cache(maxsize=256)
def counter_name(capacity_name: str) -> str:
    """The counter a capacity becomes (``copyEngines`` -> ``copy-engines``), as camelToDNSName."""
    hyphenated = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", capacity_name)
    hyphenated = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1-\2", hyphenated)
    return rfc1123(hyphenated)


# ------------------------------------------------------------------ taints
TAINT_XID = f"{DRIVER_NAME}/xid"
TAINT_GPU_LOST = f"{DRIVER_NAME}/gpu-lost"
# A GPU whose health cannot be watched (its event registration failed or is unsupported).
TAINT_UNMONITORED = f"{DRIVER_NAME}/unmonitored"
# Application errors after which the GPU is still healthy: their taint has effect None.
NON_FATAL_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# ------------------------------------------------------------------ NVML facts
# CI profile 1_SLICE_REV1: the reference skips it when enumerating partitions.
CI_PROFILE_1_SLICE_REV1 = 7
# Architectures at or after Hopper toggle MIG mode without a GPU reset
# (nvml.DEVICE_ARCH_UNKNOWN is numerically above Hopper, so it counts too).
_MIG_TOGGLE_ARCHITECTURES = frozenset({"Hopper", "Blackwell", "Rubin", "Unknown"})


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


def counter_set_name(minor: int) -> str:
    return rfc1123(f"{gpu_device_name(minor)}-counter-set")


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


# ------------------------------------------------------------------ values

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


# Attribute, capacity and counter values repeat across devices; the objects are
# never mutated, so one instance per value serves them all (rendering a
# thousand nodes is dominated by object construction otherwise).
@functools.lru_cache(maxsize=4096)
def _string(value: str) -> DeviceAttribute:
    return DeviceAttribute(string=value)


@functools.lru_cache(maxsize=256)
def _int(value: int) -> DeviceAttribute:
    return DeviceAttribute(int_=value)


@functools.lru_cache(maxsize=4096)
def _capacity(value: int) -> DeviceCapacity:
    return DeviceCapacity(value=quantity.format_int(value))


@functools.lru_cache(maxsize=4096)
def _counter(value: int) -> Counter:
    return Counter(value=quantity.format_int(value))


# ------------------------------------------------------------------ attributes


def _pci_attributes(gpu: Gpu) -> dict[str, DeviceAttribute]:
    attrs = {ATTR_PCI_BUS_ID: _string(gpu.pci_bus_id)}
    if gpu.pcie_root:
        attrs[ATTR_PCIE_ROOT] = _string(gpu.pcie_root)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs[ATTR_NUMA_NODE] = _int(gpu.numa_node)
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
        ATTR_PRODUCT_NAME: _string(gpu.product_name),
        ATTR_BRAND: _string(gpu.brand),
        ATTR_ARCHITECTURE: _string(gpu.architecture),
        **_versions(gpu, inv),
        **_pci_attributes(gpu),
    }
    if gpu.addressing_mode:
        attrs[ATTR_ADDRESSING_MODE] = _string(gpu.addressing_mode)
    return attrs


def gpu_attributes(gpu: Gpu, inv: NodeInventory) -> dict[str, DeviceAttribute]:
    """A full GPU's attributes (GpuInfo.Attributes)."""
    return {
        ATTR_TYPE: _string(GPU_TYPE),
        ATTR_UUID: _string(gpu.uuid),
        **_gpu_facts(gpu, inv),
    }


def mig_attributes(gpu: Gpu, profile: str, inv: NodeInventory) -> dict[str, DeviceAttribute]:
    """What static and dynamic MIG devices share (CommonAttributesMig): the parent's facts."""
    return {
        ATTR_TYPE: _string(MIG_TYPE),
        ATTR_PARENT_UUID: _string(gpu.uuid),
        ATTR_PROFILE: _string(profile),
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
                scalar[name] = _int(attr.ints[0])
            elif attr.bools is not None and len(attr.bools) == 1:
                scalar[name] = DeviceAttribute(bool_=attr.bools[0])
            elif attr.strings is not None and len(attr.strings) == 1:
                scalar[name] = _string(attr.strings[0])
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


def _capacities(values: dict[str, int]) -> dict[str, DeviceCapacity]:
    return {name: _capacity(v) for name, v in values.items()}


def _find_profile(gpu: Gpu, gi_profile_id: int, name: str) -> MigProfile:
    for profile in gpu.mig_profiles:
        if profile.gi_profile_id == gi_profile_id:
            return profile
    raise InventoryError(
        f"gpu {gpu.index}: MIG device profile {name!r} (gi_profile_id {gi_profile_id}) "
        "is not among the GPU's mig_profiles"
    )


# ------------------------------------------------------------------ devices


def gpu_device(gpu: Gpu, inv: NodeInventory) -> Device:
    """A full GPU as published without DynamicMIG (GpuInfo.GetDevice)."""
    return Device(
        name=gpu_device_name(gpu.minor),
        attributes=gpu_attributes(gpu, inv),
        capacity={CAP_MEMORY: _capacity(gpu.memory_bytes)},
    )


def static_mig_device(gpu: Gpu, mig: MigDevice, inv: NodeInventory) -> Device:
    """An existing MIG device (MigDeviceInfo.GetDevice): uuid, profile capacities, memory slices."""
    profile = _find_profile(gpu, mig.gi_profile_id, mig.profile)
    attrs = mig_attributes(gpu, mig.profile, inv)
    attrs[ATTR_UUID] = _string(mig.uuid)
    capacity = _capacities(profile_capacities(profile))
    for i in range(mig.placement.start, mig.placement.start + mig.placement.size):
        capacity[memory_slice_capacity(i)] = _capacity(1)
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
        ATTR_TYPE: _string(VFIO_TYPE),
        ATTR_UUID: _string(vfio_uuid(gpu.pci_bus_id)),
        ATTR_DEVICE_ID: _string(gpu.vfio.device_id),
        ATTR_VENDOR_ID: _string(gpu.vfio.vendor_id),
        ATTR_PRODUCT_NAME: _string(gpu.vfio.product_name),  # the PCI database's name
        ATTR_IOMMU_FD_ENABLED: DeviceAttribute(bool_=gpu.vfio.iommu_fd_enabled),
        ATTR_PCI_BUS_ID: _string(gpu.pci_bus_id),
    }
    if gpu.pcie_root:
        attrs[ATTR_PCIE_ROOT] = _string(gpu.pcie_root)
    if gpu.vfio.numa_node >= 0:
        attrs[ATTR_NUMA_NODE] = _int(gpu.vfio.numa_node)
    return Device(
        name=vfio_device_name(index),
        attributes=attrs,
        capacity={CAP_ADDRESSABLE_MEMORY: _capacity(gpu.vfio.addressable_memory_bytes)},
    )


# ------------------------------------------------------------------ dynamic MIG (KEP-4815)


def dynamic_mig_capable(gpu: Gpu) -> bool:
    """Whether DynamicMIG manages this GPU (isDynamicMIGCapable; vGPU guests are not modelled)."""
    return gpu.mig_capable and (supports_mig_toggle(gpu) or gpu.mig_enabled)


def supports_mig_toggle(gpu: Gpu) -> bool:
    """Hopper and newer switch MIG mode without a reset; Ampere does not."""
    return gpu.architecture in _MIG_TOGGLE_ARCHITECTURES


def partition_profiles(gpu: Gpu) -> list[MigProfile]:
    """The profiles DynamicMIG offers (inspectMigProfilesAndPlacements skips CI 1_SLICE_REV1)."""
    return [p for p in gpu.mig_profiles if p.ci_profile_id != CI_PROFILE_1_SLICE_REV1]


@dataclass(frozen=True)
class PartitionModel:
    """A GPU's counter-set facts: per-capacity maxima over every profile, and its memory slices."""

    max_capacities: dict[str, int]
    memory_slices: int

    @classmethod
    def of(cls, gpu: Gpu) -> PartitionModel:
        maxima: dict[str, int] = {}
        slices = 0
        for profile in partition_profiles(gpu):
            if not profile.placements:  # the reference only sees profiles through placements
                continue
            slices = max(slices, *(p.size for p in profile.placements))
            for name, value in profile_capacities(profile).items():
                maxima[name] = max(maxima.get(name, value), value)
        return cls(maxima, slices)

    def all_counters(self) -> dict[str, Counter]:
        """Every counter of the set: what the full GPU has, and consumes."""
        return consumed_counters(self.max_capacities, 0, self.memory_slices)


def consumed_counters(values: dict[str, int], start: int, size: int) -> dict[str, Counter]:
    """One counter per capacity (addCountersForMemSlices), plus ``memory-slice-<i>``=1 per slice."""
    return dict(_consumed_counters(tuple(values.items()), start, size))


@functools.lru_cache(maxsize=4096)
def _consumed_counters(
    values: tuple[tuple[str, int], ...], start: int, size: int
) -> dict[str, Counter]:
    out = {counter_name(name): _counter(v) for name, v in values}
    for i in range(start, start + size):
        out[memory_slice_counter(i)] = _counter(1)
    return out


def counter_sets(gpu: Gpu, model: PartitionModel) -> list[CounterSet]:
    """The GPU's one counter set (PartSharedCounterSets); none without MIG profile data."""
    if not model.max_capacities:
        return []
    return [CounterSet(name=counter_set_name(gpu.minor), counters=model.all_counters())]


def partitionable_gpu_device(gpu: Gpu, inv: NodeInventory, model: PartitionModel) -> Device:
    """The full GPU under DynamicMIG (PartGetDevice): max capacities, consumes every counter."""
    if not model.max_capacities:
        return gpu_device(gpu, inv)
    consumes = DeviceCounterConsumption(
        counter_set=counter_set_name(gpu.minor),
        counters=model.all_counters(),
    )
    return Device(
        name=gpu_device_name(gpu.minor),
        attributes=gpu_attributes(gpu, inv),
        capacity=_capacities(model.max_capacities),
        consumes_counters=[consumes],
    )


def partition_device(
    gpu: Gpu, profile: MigProfile, placement: MigPlacement, inv: NodeInventory
) -> Device:
    """An abstract MIG device (MigSpec.PartGetDevice): no uuid, no memory-slice capacities."""
    return partition_devices(gpu, inv, [(profile, [placement])])[0]


def partition_devices(
    gpu: Gpu,
    inv: NodeInventory,
    offers: Iterable[tuple[MigProfile, Iterable[MigPlacement]]] | None = None,
) -> list[Device]:
    """Every abstract MIG device of a GPU (default: each partition profile x placement).

    A rendered pool is a value: attribute, capacity and counter maps are built
    once per profile (counters once per profile and placement, across GPUs and
    nodes) and shared by the devices that have them, so nothing may change a
    rendered device's maps in place (replace them instead).
    """
    if offers is None:
        offers = [(p, p.placements) for p in partition_profiles(gpu)]
    set_name = counter_set_name(gpu.minor)
    devices = []
    for profile, placements in offers:
        values = profile_capacities(profile)
        key = tuple(values.items())
        attrs = mig_attributes(gpu, profile.name, inv)
        capacity = _capacities(values)
        for placement in placements:
            consumes = DeviceCounterConsumption(
                counter_set=set_name,
                counters=_consumed_counters(key, placement.start, placement.size),
            )
            name = mig_device_name(gpu.minor, profile.name, profile.gi_profile_id, placement.start)
            devices.append(
                Device(name=name, attributes=attrs, capacity=capacity, consumes_counters=[consumes])
            )
    return devices


# ------------------------------------------------------------------ health

# What an XID means, in the words of NVIDIA's Xid catalog (docs.nvidia.com/deploy/
# xid-errors), for the XIDs datacenter GPUs (Ampere and later) report. People
# read these: the kubelet's device health message (pod status), discovery's
# health events. An XID not listed is named by its number alone.
XID_DESCRIPTIONS: dict[int, str] = {
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    38: "Driver firmware error",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "Video processor exception",
    69: "Graphics Engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    137: "NVLink FLA privilege error",
    140: "Unrecovered ECC Error",
}
# The reason of a GPU NVML cannot reach any more (NVML_ERROR_GPU_IS_LOST).
GPU_LOST_REASON = "GPU is lost: NVML cannot reach it (NVML_ERROR_GPU_IS_LOST)"


def xid_reason(xid: int) -> str:
    """``XID 79: GPU has fallen off the bus``; an XID the catalog above lacks: ``XID 150``."""
    description = XID_DESCRIPTIONS.get(xid)
    return f"XID {xid}: {description}" if description else f"XID {xid}"


def nvml_error_reason(error: str) -> str:
    """Why a GPU's health is unknown: the NVML queries that failed on it."""
    return f"NVML error: {error}"


def xid_taint(xid: int, extra_non_fatal_xids: Iterable[int] = ()) -> DeviceTaint:
    """healthEventToTaint for an XID: effect None for application errors, else NoSchedule."""
    non_fatal = xid in NON_FATAL_XIDS or xid in set(extra_non_fatal_xids)
    return DeviceTaint(key=TAINT_XID, value=str(xid), effect="None" if non_fatal else "NoSchedule")


def xid_target(gpu: Gpu, xid: Xid) -> str | None:
    """The device an XID lands on: the MIG device of its GI and CI, else the full GPU.

    As the reference's placement map (device_health.go, getDevicePlacementMap),
    keyed by the exact (GPU, GI, CI): a full GPU under (0xFFFFFFFF, 0xFFFFFFFF),
    a static MIG device under its own GI and CI ids. Any other pair is dropped
    (None), among them an XID for a whole GPU instance (its GI with CI
    0xFFFFFFFF, which discovery records as no CI). An XID with neither on a GPU
    in MIG mode names the full GPU, which is not published: it taints nothing.
    """
    if xid.gi_id is None:
        return gpu_device_name(gpu.minor) if xid.ci_id is None else None
    for mig in gpu.mig_devices:
        if mig.gi_id == xid.gi_id and mig.ci_id == xid.ci_id:
            return mig_device_name(gpu.minor, mig.profile, mig.gi_profile_id, mig.placement.start)
    return None


def health_taints(
    gpu: Gpu, device_names: Iterable[str], extra_non_fatal_xids: Iterable[int] = ()
) -> dict[str, list[DeviceTaint]]:
    """Taints per device of one GPU (NVMLDeviceHealthCheck), for its GPU, MIG and VFIO devices.

    One taint per key and device, in the order the reference adds them
    (AddOrUpdateTaint appends a new key): ``unmonitored`` (effect None) on
    every NVML device of a GPU whose event registration failed, as the
    reference marks it when it starts watching; the device's most recent XID,
    which sets value and effect; ``gpu-lost``. Neither of the first two lands
    on the VFIO twin (the reference watches NVML devices only). A lost GPU
    taints every device of it with ``gpu-lost``, its VFIO twin included: a GPU
    that fell off the bus is no use to a VM either (moot while the gates that
    publish twins and taints cannot be combined; see featuregates.EXCLUSIVE).
    """
    names = list(device_names)
    out: dict[str, list[DeviceTaint]] = {}
    if gpu.health.unmonitored:
        unmonitored = DeviceTaint(key=TAINT_UNMONITORED, effect="None")
        for name in names:
            if not _VFIO_NAME.match(name):
                out[name] = [unmonitored]
    for xid in sorted(gpu.health.xids, key=lambda x: x.timestamp):
        target = xid_target(gpu, xid)
        if target in names:
            kept = [t for t in out.get(target, []) if t.key != TAINT_XID]
            out[target] = [*kept, xid_taint(xid.xid, extra_non_fatal_xids)]
    if gpu.health.lost:
        lost = DeviceTaint(key=TAINT_GPU_LOST, effect="NoSchedule")
        for name in names:
            out.setdefault(name, []).append(lost)
    return out


# ------------------------------------------------------------------ device classes

GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
VFIO_CLASS = "vfio.gpu.nvidia.com"
GPU_EXTENDED_RESOURCE = "nvidia.com/gpu"


def _selector(device_type: DeviceType) -> DeviceSelector:
    # The chart quotes with single quotes; CONTRACTS.md shows double quotes (same CEL).
    expression = (
        f"device.driver == '{DRIVER_NAME}' && "
        f"device.attributes['{DRIVER_NAME}'].type == '{device_type}'"
    )
    return DeviceSelector(cel=CELDeviceSelector(expression=expression))


def device_classes() -> list[DeviceClass]:
    """The three DeviceClasses of the reference Helm chart (resource.k8s.io/v1)."""
    return [
        DeviceClass(
            metadata=ObjectMeta(name=GPU_CLASS),
            spec=DeviceClassSpec(
                selectors=[_selector(GPU_TYPE)], extended_resource_name=GPU_EXTENDED_RESOURCE
            ),
        ),
        DeviceClass(
            metadata=ObjectMeta(name=MIG_CLASS),
            spec=DeviceClassSpec(selectors=[_selector(MIG_TYPE)]),
        ),
        DeviceClass(
            metadata=ObjectMeta(name=VFIO_CLASS),
            spec=DeviceClassSpec(selectors=[_selector(VFIO_TYPE)]),
        ),
    ]


# ------------------------------------------------------------------ NVLink cliques

# The node label GPU Feature Discovery sets (and the reference's plugin, with
# gpuCliqueLabelEnabled): "<clusterUUID>.<cliqueID>", the node's NVLink clique.
GPU_CLIQUE_LABEL = "nvidia.com/gpu.clique"
FABRIC_STATE_COMPLETED = 3  # nvmlGpuFabricState_t
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"
_FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}


class CliqueError(ValueError):
    """The node's GPUs do not name one NVLink clique (or, strict, a fabric is unhealthy)."""


def node_clique_id(gpus: Iterable[Gpu], *, strict: bool = True) -> str:
    """The node's clique id, ``<clusterUUID>.<cliqueID>``, or "" for a node outside a fabric.

    As the reference's getCliqueID: GPUs that NVML says are not attached (no
    fabric, a zero cluster UUID) are skipped, and all others must agree. A GPU
    whose fabric registration has not completed or failed is skipped, or with
    ``strict`` (the reference's CrashOnNVLinkFabricErrors) refuses the node:
    guessing a clique would put it in the wrong IMEX domain.
    """
    ids: dict[str, list[int]] = {}
    for gpu in gpus:
        fabric = gpu.fabric
        if fabric is None or fabric.cluster_uuid == _ZERO_UUID:
            continue
        if fabric.state != FABRIC_STATE_COMPLETED or fabric.status != 0:
            if strict:
                state = _FABRIC_STATES.get(fabric.state, str(fabric.state))
                raise CliqueError(
                    f"GPU {gpu.index} ({gpu.uuid}): NVLink fabric state {state}, "
                    f"status {fabric.status} (want COMPLETED and 0)"
                )
            continue
        ids.setdefault(f"{fabric.cluster_uuid}.{fabric.clique_id}", []).append(gpu.index)
    if len(ids) > 1:
        seen = "; ".join(f"{k} on GPUs {v}" for k, v in sorted(ids.items()))
        raise CliqueError(f"the node's GPUs are in more than one NVLink clique: {seen}")
    return next(iter(ids), "")
