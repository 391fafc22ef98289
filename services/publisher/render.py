"""Render a node's inventory into the ResourceSlices the reference driver would publish.

Pure functions: inventory + feature gates + API-server version in, slices out.
Which devices a GPU contributes follows nvlib.go (GetPerGpuAllocatableDevices);
how they are grouped into slices follows driver.go (publishResources), with the
API limits of CONTRACTS.md section 4 applied on top:

* without DynamicMIG: every device of the node, in as few slices as the device
  limit allows (the reference puts them all in one slice);
* DynamicMIG on a 1.34 API server: one slice per GPU holding its counter set and
  its devices;
* DynamicMIG on 1.35+: first the counter sets (at most 8 per slice), then one
  devices-only slice per GPU.

A slice holds at most 64 devices as soon as any device has taints, consumes
counters (the 1.35 rule, also valid on 1.34) or has a list-type attribute (1.36+,
``ResourceSliceMaxDevicesWithAdvancedFeatures``), else 128.

With DRAListTypeAttributes the standard ``numaNode`` is a one-element list, as the
reference publishes it (:func:`services.core.model.deviceattrs.list_type_attributes`), on an
API server that can store lists (1.36 and later); an older one gets the int.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from services.core.kube.resource import (
    CounterSet,
    Device,
    ObjectMeta,
    OwnerReference,
    ResourcePool,
    ResourceSlice,
    ResourceSliceSpec,
)
from services.core.model import computedomain as cd
from services.core.model import (
    deviceattrs,
    domainnode,
    featuregates,
    gpudevices,
    gpuhealth,
    migpartitions,
    nvidia,
    shares,
)
from services.core.model.featuregates import FeatureGates
from services.core.model.schemas import Gpu, NodeInventory, NodePreparedDevices
from services.core.model.shares import DISABLED, SharesMode

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64  # any device with taints, consumesCounters or a list attribute
MAX_COUNTER_SETS = 8
SPLIT_LAYOUT_MINOR = 35  # from 1.35 a slice holds devices or sharedCounters, not both
LIST_ATTRIBUTES_MINOR = 36  # list-type attributes exist from 1.36 (alpha there and in 1.37)
_MAX_OBJECT_NAME = 253
T = TypeVar("T")


class RenderError(ValueError):
    """An inventory that cannot be published as it is; nothing of it is written."""


@dataclass(frozen=True)
class RenderOptions:
    gates: FeatureGates = field(default_factory=FeatureGates)
    kube_minor: int = SPLIT_LAYOUT_MINOR
    extra_non_fatal_xids: frozenset[int] = frozenset()
    shares: SharesMode = DISABLED

    @property
    def split_layout(self) -> bool:
        return self.kube_minor >= SPLIT_LAYOUT_MINOR

    @property
    def list_attributes(self) -> bool:
        """numaNode as a list: the driver's gate is on and the API server has list-type
        attributes at all (whether its own gate is on shows only when it refuses a write:
        services/publisher/reconcile.py then publishes the int)."""
        return (
            self.gates.enabled(featuregates.DRA_LIST_TYPE_ATTRIBUTES)
            and self.kube_minor >= LIST_ATTRIBUTES_MINOR
        )


@dataclass(frozen=True)
class SliceContent:
    """What one slice carries, before pool bookkeeping (name, generation, count) is added."""

    devices: list[Device] | None = None
    shared_counters: list[CounterSet] | None = None


@dataclass
class _GpuGroup:
    devices: list[Device]
    counter_sets: list[CounterSet]


# ------------------------------------------------------------------ devices per GPU


@dataclass(frozen=True)
class Holdings:
    """What this node's prepared claims hold, by PCI bus id (the preparer's KV ``prepared``).

    A GPU and its VFIO twin are mutually exclusive: while one side of a GPU is
    prepared the other side is withdrawn from the slices, and it comes back
    after unprepare (the reference's RemoveSiblingDevices /
    discoverSiblingAllocatables). Here the rule holds for MIG devices too (the
    reference leaves them as a TODO), and whatever the feature gates say: a GPU
    bound to vfio-pci cannot serve CUDA, whichever gate let it get there. A
    device that is itself held is never withdrawn, even when (inconsistently)
    both sides are held.
    """

    as_vfio: frozenset[str] = frozenset()  # GPUs passed through by their VFIO twin
    as_nvidia: frozenset[str] = frozenset()  # GPUs held as a full GPU or by a MIG device

    @classmethod
    def of(cls, prepared: NodePreparedDevices | None) -> Holdings:
        if prepared is None:
            return NO_HOLDINGS
        vfio = {d.pci_bus_id for d in prepared.devices if d.kind == nvidia.VFIO_TYPE}
        other = {d.pci_bus_id for d in prepared.devices if d.kind != nvidia.VFIO_TYPE}
        return cls(frozenset(vfio), frozenset(other))

    def withdraws_nvidia_side(self, gpu: Gpu) -> bool:
        return gpu.pci_bus_id in self.as_vfio and gpu.pci_bus_id not in self.as_nvidia

    def withdraws_vfio_twin(self, gpu: Gpu) -> bool:
        return gpu.pci_bus_id in self.as_nvidia and gpu.pci_bus_id not in self.as_vfio


NO_HOLDINGS = Holdings()


def _nvidia_side(gpu: Gpu, inv: NodeInventory, opts: RenderOptions) -> _GpuGroup:
    """The GPU's full-GPU, static MIG or dynamic-MIG devices and its counter sets,
    published as consumable shares when ``opts.shares`` says so (as the reference does)."""
    group = _nvidia_devices(gpu, inv, opts)
    if opts.shares.enabled:
        group.devices[:] = [shares.advertise(d, opts.shares) for d in group.devices]
    return group


def _nvidia_devices(gpu: Gpu, inv: NodeInventory, opts: RenderOptions) -> _GpuGroup:
    if opts.gates.enabled(featuregates.DYNAMIC_MIG) and migpartitions.dynamic_mig_capable(gpu):
        model = migpartitions.PartitionModel.of(gpu)
        devices = []
        if not gpu.mig_enabled or migpartitions.supports_mig_toggle(gpu):
            devices.append(migpartitions.partitionable_gpu_device(gpu, inv, model))
        devices += migpartitions.partition_devices(gpu, inv)
        return _GpuGroup(devices, migpartitions.counter_sets(gpu, model))
    if not gpu.mig_enabled:
        return _GpuGroup([gpudevices.gpu_device(gpu, inv)], [])
    return _GpuGroup([gpudevices.static_mig_device(gpu, mig, inv) for mig in gpu.mig_devices], [])


def _gpu_group(
    gpu: Gpu, inv: NodeInventory, opts: RenderOptions, vfio_index: int, holdings: Holdings
) -> _GpuGroup:
    gates = opts.gates
    withdrawn = holdings.withdraws_nvidia_side(gpu)
    group = _GpuGroup([], []) if withdrawn else _nvidia_side(gpu, inv, opts)
    devices = group.devices
    # Every GPU has its twin under PassthroughSupport, in MIG mode too, as in the
    # reference: its enumerateGpuVfioDevices skips a PCI GPU only when its full-GPU
    # device says VFIO is off, and a GPU in MIG mode has no full-GPU device there.
    # Its MIG devices and its twin exclude each other as a GPU and its twin do
    # (Holdings here, the preparer's hold keys), which the reference leaves open.
    vfio_ok = gates.enabled(featuregates.PASSTHROUGH_SUPPORT)
    if vfio_ok and gpu.vfio is not None and not holdings.withdraws_vfio_twin(gpu):
        devices.append(gpudevices.vfio_device(gpu, vfio_index))
    if opts.list_attributes:
        devices[:] = deviceattrs.list_type_attributes(devices)
    if gates.enabled(featuregates.NVML_DEVICE_HEALTH_CHECK):
        taints = gpuhealth.health_taints(gpu, (d.name for d in devices), opts.extra_non_fatal_xids)
        for device in devices:
            device.taints = taints.get(device.name)
    devices.sort(key=lambda d: d.name)
    return group


def publishable(gpu: Gpu, gates: FeatureGates) -> bool:
    """Whether a GPU's devices are published at all.

    * NVML failed on a GPU that still answers: parts of its record are stale or
      guessed, so none of it is published (the reference refuses to enumerate
      such a GPU); the next clean scan brings it back.
    * A lost GPU (NVML_ERROR_GPU_IS_LOST) keeps its last identity in the
      inventory. With NVMLDeviceHealthCheck its devices stay published, each
      tainted ``gpu-lost`` (NoSchedule), as the reference does: users see why
      it is unusable and claims on it keep their device. Without the gate
      nothing could keep the scheduler off it, so it is withdrawn.
    * A GPU lost before discovery ever saw it answer has no identity to publish.
    """
    if gpu.health.lost:
        known = bool(gpu.uuid and gpu.pci_bus_id) and gpu.minor >= 0
        return known and gates.enabled(featuregates.NVML_DEVICE_HEALTH_CHECK)
    return not gpu.error


def _groups(inv: NodeInventory, opts: RenderOptions, holdings: Holdings) -> list[_GpuGroup]:
    """One group per publishable GPU, in PCI address order (the reference's slice order)."""
    groups = []
    for vfio_index, gpu in enumerate(nvidia.vfio_order(inv.gpus)):
        if not publishable(gpu, opts.gates):
            continue
        try:
            groups.append(_gpu_group(gpu, inv, opts, vfio_index, holdings))
        except nvidia.InventoryError as exc:
            raise RenderError(f"node {inv.node!r}: {exc}") from exc
    return groups


# ------------------------------------------------------------------ slices


def _device_limit(devices: Sequence[Device], lists: bool = True) -> int:
    """``lists``: whether devices may have list attributes (only looked for then)."""
    advanced = any(d.taints or d.consumes_counters for d in devices) or (
        lists and any(map(deviceattrs.has_list_attributes, devices))
    )
    return MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES


def _chunks(items: Sequence[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def render_contents(
    inv: NodeInventory, opts: RenderOptions, holdings: Holdings = NO_HOLDINGS
) -> list[SliceContent]:
    """The node's slices, in order, without pool bookkeeping."""
    groups = _groups(inv, opts, holdings)
    contents: list[SliceContent] = []
    if not opts.gates.enabled(featuregates.DYNAMIC_MIG):
        devices = [d for g in groups for d in g.devices]
        limit = _device_limit(devices, opts.list_attributes)
        contents = [SliceContent(devices=chunk) for chunk in _chunks(devices, limit)]
    elif opts.split_layout:
        counter_sets = [c for g in groups for c in g.counter_sets]
        contents = [
            SliceContent(shared_counters=c) for c in _chunks(counter_sets, MAX_COUNTER_SETS)
        ]
        for g in groups:
            limit = _device_limit(g.devices, opts.list_attributes)
            contents += [SliceContent(devices=chunk) for chunk in _chunks(g.devices, limit)]
    else:
        for g in groups:
            limit = _device_limit(g.devices, lists=False)  # 1.34 has no list attributes
            if len(g.devices) > limit:
                raise RenderError(
                    f"node {inv.node!r}: {len(g.devices)} devices of one GPU do not fit one "
                    f"1.34 slice beside their counter set (limit {limit})"
                )
            contents.append(SliceContent(devices=g.devices, shared_counters=g.counter_sets or None))
    contents = [c for c in contents if c.devices or c.shared_counters]
    return contents or [SliceContent()]  # an empty pool still says "this node has no GPUs"


def slice_name(node: str, index: int, driver: str = nvidia.DRIVER_NAME) -> str:
    """``<node>-<driver>-<index>``; long node names are cut and disambiguated by a hash."""
    suffix = f"-{driver}-{index}"
    if len(node) + len(suffix) <= _MAX_OBJECT_NAME:
        return node + suffix
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    keep = _MAX_OBJECT_NAME - len(suffix) - len(digest) - 1
    return f"{node[:keep].rstrip('.-')}-{digest}{suffix}"


def node_owner(node: str, uid: str) -> OwnerReference:
    """The Node owns its slices: they go when the Node object goes."""
    return OwnerReference(api_version="v1", kind="Node", name=node, uid=uid, controller=True)


def build_slices(
    node: str,
    contents: Sequence[SliceContent],
    *,
    generation: int = 0,
    owner: OwnerReference | None = None,
    driver: str = nvidia.DRIVER_NAME,
) -> list[ResourceSlice]:
    """Full ResourceSlice objects for a node's pool of ``driver`` at ``generation``."""
    pool_size = len(contents)
    return [
        ResourceSlice(
            metadata=ObjectMeta(
                name=slice_name(node, i, driver), owner_references=[owner] if owner else None
            ),
            spec=ResourceSliceSpec(
                driver=driver,
                pool=ResourcePool(name=node, generation=generation, resource_slice_count=pool_size),
                node_name=node,
                devices=content.devices,
                shared_counters=content.shared_counters,
            ),
        )
        for i, content in enumerate(contents)
    ]


def render_domain_contents(
    inv: NodeInventory, gates: FeatureGates | None = None
) -> list[SliceContent] | None:
    """The compute-domain.nvidia.com pool of any node: ``channel-0`` and ``daemon-0``,
    the same on every node (no clique attribute, as the reference; a node outside a
    fabric publishes them too, and its daemon idles).

    None (no pool) while the node cannot serve the driver (services.core.model.domainnode:
    its NVLink fabric names no one clique, or its driver is too old for the IMEX
    daemons' DNS names), where the reference's plugin refuses to start, so it publishes
    nothing and no claim is scheduled there. The pool comes back once the node can.
    """
    if domainnode.refusal(inv, gates or FeatureGates()):
        return None
    return [SliceContent(devices=cd.node_devices())]


def render_slices(
    inv: NodeInventory,
    opts: RenderOptions,
    *,
    generation: int = 0,
    owner: OwnerReference | None = None,
    holdings: Holdings = NO_HOLDINGS,
) -> list[ResourceSlice]:
    """What the publisher would write for ``inv`` into an empty cluster."""
    contents = render_contents(inv, opts, holdings)
    return build_slices(inv.node, contents, generation=generation, owner=owner)
