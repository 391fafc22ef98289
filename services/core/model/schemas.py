"""Every payload that crosses the bus: msgspec Structs, msgpack on the wire.

Each top-level message carries ``schema_version``. Readers ignore unknown
fields (msgspec's default), so adding a field with a default never breaks an
older reader or an older stored value; a version they do not know is refused
(a newer writer may mean something else by the same fields), as is a payload
nested too deeply to decode.
"""

from __future__ import annotations

import time
from typing import Literal, TypeVar

import msgspec

SCHEMA_VERSION = 1

T = TypeVar("T")


class SchemaError(ValueError):
    """A bus payload that could not be decoded into the expected schema."""


def encode(msg: msgspec.Struct) -> bytes:
    return msgspec.msgpack.encode(msg)


def decode(data: bytes, kind: type[T]) -> T:
    """Decode ``data`` as ``kind``; raise :class:`SchemaError` saying why not."""
    try:
        value = msgspec.msgpack.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SchemaError(f"invalid {kind.__name__}: {exc}") from exc
    except RecursionError as exc:
        raise SchemaError(f"invalid {kind.__name__}: nested too deeply to read") from exc
    version = getattr(value, "schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"{kind.__name__}: schema_version {version} is not one this build reads "
            f"({SCHEMA_VERSION})"
        )
    return value


def now() -> float:
    return time.time()


# ---------------------------------------------------------------- inventory


class MigPlacement(msgspec.Struct, frozen=True):
    """A GPU-instance placement: ``start`` and ``size`` in memory slices."""

    start: int
    size: int


class MigProfile(msgspec.Struct, frozen=True, kw_only=True):
    """A MIG profile the GPU supports (GPU-instance profile + its full CI)."""

    name: str  # e.g. "1g.10gb"
    gi_profile_id: int
    ci_profile_id: int
    slices: int  # compute (GPC) slices, the "Ng" in the name
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: list[MigPlacement]


class MigDevice(msgspec.Struct, frozen=True, kw_only=True):
    """An existing MIG device (one GPU instance with one compute instance)."""

    uuid: str
    profile: str
    gi_profile_id: int
    gi_id: int
    ci_id: int
    placement: MigPlacement


class Xid(msgspec.Struct, frozen=True):
    xid: int
    timestamp: float
    gi_id: int | None = None  # set when NVML attributes the XID to a MIG device
    ci_id: int | None = None


class GpuHealth(msgspec.Struct, frozen=True, kw_only=True):
    xids: list[Xid] = []
    lost: bool = False
    # Discovery could not register for the GPU's XID events (the reference's
    # "unmonitored" health event): its health is unknown, not good.
    unmonitored: bool = False


class GpuFabric(msgspec.Struct, frozen=True, kw_only=True):
    """The GPU's multi-node NVLink facts, as nvmlDeviceGetGpuFabricInfo reports them.

    Absent (None on the Gpu) where NVML says NOT_SUPPORTED: a GPU outside any
    NVLink fabric. ``state`` is nvmlGpuFabricState_t (3: COMPLETED), ``status``
    the nvmlReturn_t of the fabric probe (0: success).
    """

    cluster_uuid: str  # "8c6a1c1e-....", all zeros when the fabric manager set none
    clique_id: int
    state: int
    status: int


class VfioInfo(msgspec.Struct, frozen=True, kw_only=True):
    """PCI facts the VFIO twin of a GPU is published with."""

    vendor_id: str  # "0x10de"
    device_id: str  # "0x2330"
    numa_node: int
    iommu_group: int
    iommu_fd_enabled: bool
    addressable_memory_bytes: int
    # The PCI ID database's name for vendor_id/device_id (the reference's VFIO
    # productName, e.g. "GH100 [H100 SXM5 80GB]"); go-nvlib's word when unknown.
    product_name: str = "UNKNOWN_DEVICE"


class Gpu(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str  # "9.0"
    memory_bytes: int
    pci_bus_id: str  # "0000:3b:00.0"
    pcie_root: str | None = None
    numa_node: int | None = None  # PCI device's NUMA node; None or <0: unknown
    addressing_mode: str | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_profiles: list[MigProfile] = []
    mig_devices: list[MigDevice] = []
    vfio: VfioInfo | None = None
    fabric: GpuFabric | None = None
    health: GpuHealth = GpuHealth()
    error: str | None = None  # NVML failed on this GPU; the rest is best effort


class NodeInventory(msgspec.Struct, frozen=True, kw_only=True):
    """What one node's NVML says, as the publisher and preparer read it."""

    schema_version: int = SCHEMA_VERSION
    node: str
    driver_version: str  # "570.124.06"
    cuda_driver_version: str  # "12.8"
    gpus: list[Gpu]
    backend: str = "nvml"  # "nvml" or "simulated:<fleet>"

    def digest(self) -> str:
        """A stable hash of the content, for change detection."""
        import hashlib

        return hashlib.sha256(msgspec.msgpack.encode(self)).hexdigest()[:16]


class InventoryChanged(msgspec.Struct, frozen=True, kw_only=True):
    schema_version: int = SCHEMA_VERSION
    node: str
    digest: str
    revision: int  # KV revision of the stored inventory
    changes: list[str] = []
    timestamp: float = msgspec.field(default_factory=now)


HealthKind = Literal["xid", "gpu-lost", "recovered", "nvml-error"]


class HealthEvent(msgspec.Struct, frozen=True, kw_only=True):
    """``dra.health.<node>``: one new fact about one GPU's health, from the node's discovery.

    ``message`` is a log line that names the GPU; ``reason`` says what happened
    without naming it (``XID 79: GPU has fallen off the bus``): the words the
    kubelet plugin gives the kubelet as the health message of the GPU's devices.
    An XID that NVML attributed to a MIG device carries its ``gi_id`` and
    ``ci_id``, as :class:`Xid` does in the inventory.
    """

    schema_version: int = SCHEMA_VERSION
    node: str
    gpu_uuid: str
    gpu_index: int
    kind: HealthKind
    xid: int | None = None
    message: str = ""
    timestamp: float = msgspec.field(default_factory=now)
    reason: str = ""
    gi_id: int | None = None
    ci_id: int | None = None


class SimMigRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``dra.sim.<node>``: a MIG change on a simulated GPU (what NVML calls do on a real node).

    Discovery, run with ``--fleet``, answers it with a :class:`SimMigReply`.
    ``create`` makes a GPU instance of ``gi_profile_id`` at ``placement_start``
    (None: the first free valid one) plus its full compute instance, enabling
    MIG mode first if needed; ``destroy`` removes ``ci_id`` then ``gi_id``
    (already gone is fine); ``mig-mode`` sets MIG mode to ``mig_enabled``.
    """

    schema_version: int = SCHEMA_VERSION
    op: Literal["create", "destroy", "mig-mode"]
    gpu_uuid: str
    gi_profile_id: int | None = None
    placement_start: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    mig_enabled: bool | None = None


class SimMigReply(msgspec.Struct, frozen=True, kw_only=True):
    schema_version: int = SCHEMA_VERSION
    device: MigDevice | None = None  # create: the new MIG device
    error: str = ""  # empty on success
    nvml_error: str = ""  # the NVML return code name, e.g. NVML_ERROR_INSUFFICIENT_RESOURCES


class PluginPresence(msgspec.Struct, frozen=True, kw_only=True):
    """Written by the kubelet plugin while the kubelet has it registered."""

    schema_version: int = SCHEMA_VERSION
    node: str
    driver: str
    endpoint: str
    registered_at: float = msgspec.field(default_factory=now)


# ---------------------------------------------------------------- ComputeDomains

DomainNodeState = Literal["Ready", "NotReady", "Failed"]


class DomainMember(msgspec.Struct, frozen=True, kw_only=True):
    """KV ``domains``, key ``<uid>.member.<node>``: one node's IMEX daemon in a domain.

    Written only by that node's daemon, with compare-and-set on its own key, so
    concurrent joins never lose a peer. ``status`` is the daemon's readiness,
    ``reason`` why it is not Ready (a daemon that cannot start says so here, and
    the controller carries it to the ComputeDomain's Events).
    """

    schema_version: int = SCHEMA_VERSION
    domain_uid: str
    node: str
    ip_address: str
    clique_id: str  # "" on a node outside an NVLink fabric
    status: DomainNodeState = "NotReady"
    reason: str = ""
    pod: str = ""  # the daemon pod "<namespace>/<name>", when it runs in one
    updated_at: float = msgspec.field(default_factory=now)


class DomainIndex(msgspec.Struct, frozen=True, kw_only=True):
    """KV ``domains``, key ``<uid>.index.<node>``: the node's index within its clique.

    Assigned once by the controller (the lowest free one in the clique; -1 outside
    a fabric) and kept while the node stays a member, so a daemon restart never
    renumbers the IMEX peers (NVIDIA/k8s-dra-driver-gpu#1418).
    """

    schema_version: int = SCHEMA_VERSION
    domain_uid: str
    node: str
    clique_id: str
    index: int


class DomainStatusEvent(msgspec.Struct, frozen=True, kw_only=True):
    """``dra.domain.<uid>.status``: the controller's view of a domain, on every change."""

    schema_version: int = SCHEMA_VERSION
    domain_uid: str
    namespace: str
    name: str
    status: Literal["Ready", "NotReady"]
    ready_nodes: list[str] = []
    not_ready_nodes: list[str] = []
    timestamp: float = msgspec.field(default_factory=now)


# ---------------------------------------------------------------- claims


class ClaimRef(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    namespace: str
    name: str


class DeviceRef(msgspec.Struct, frozen=True, kw_only=True):
    """One allocated or prepared device, named so that an auditor can find the hardware.

    ``gpu_uuid`` and ``pci_bus_id`` are the physical GPU's (for a MIG device
    its parent's, for a VFIO device the GPU it passes through); ``uuid`` is
    the device's own when it has one of its own (a MIG device's ``MIG-...``).
    Empty when the emitter could not see the device (e.g. gone from the node).
    """

    request: str
    pool: str
    device: str
    cdi_device_ids: list[str] = []
    gpu_uuid: str = ""
    pci_bus_id: str = ""
    uuid: str = ""


class PodRef(msgspec.Struct, frozen=True, kw_only=True):
    """A consumer the claim is reserved for (``status.reservedFor``), usually a pod."""

    resource: str = "pods"
    name: str
    uid: str = ""


ClaimEventName = Literal[
    "allocated",
    "reserved",
    "released",
    "deleted",
    "pending",
    "prepare.requested",
    "prepared",
    "prepare.failed",
    "unprepare.requested",
    "unprepared",
    "unprepare.failed",
]


class ClaimEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a claim's life, as auditors replay it from the CLAIMS stream.

    ``seq`` numbers the claim's events on one node (the allocator's and that node's
    preparer's; those about no node on their own) 1, 2, 3, ... in the order the
    stream stored them (see :mod:`services.core.bus.claimtrail`): a missing number
    is a lost event. ``actor`` is the service, ``instance`` the
    process (pod or host, and pid); ``pods`` the consumers a ``reserved``
    event reserves the claim for. ``traceparent`` is the W3C trace context of
    the operation that emitted it (also in the message's headers).
    """

    schema_version: int = SCHEMA_VERSION
    event: ClaimEventName
    claim: ClaimRef
    node: str
    actor: str  # which service said it
    instance: str = ""  # which process of it: "<pod or host>/<pid>"
    seq: int = 0  # the claim's event number on its node, from 1 (0: emitted before numbering)
    devices: list[DeviceRef] = []
    pods: list[PodRef] = []
    outcome: Literal["ok", "error"] = "ok"
    error: str = ""
    duration_ms: float | None = None
    trace_id: str = ""
    traceparent: str = ""
    timestamp: float = msgspec.field(default_factory=now)


class HeldDevice(msgspec.Struct, frozen=True, kw_only=True):
    device: str  # "gpu-3", "gpu-vfio-1", "gpu-0-mig-1g10gb-19-0"
    kind: Literal["gpu", "mig", "vfio"]
    pci_bus_id: str  # the physical GPU
    claim_uid: str


class NodePreparedDevices(msgspec.Struct, frozen=True, kw_only=True):
    """KV ``prepared`` (key = node), written by the preparer: what prepared claims hold.

    A GPU and its VFIO twin are mutually exclusive: while a GPU (or a MIG device
    on it) is prepared its VFIO twin must not be offered, and while the VFIO
    twin is prepared neither the GPU nor its MIG devices may be.
    """

    schema_version: int = SCHEMA_VERSION
    node: str
    devices: list[HeldDevice] = []
    updated_at: float = msgspec.field(default_factory=now)


# ---------------------------------------------------------------- node prepare requests


class PreparedDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One kubelet ``Device`` entry: the wire shape of NodePrepareResourceResponse."""

    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str]
    share_id: str | None = None


class ClaimResult(msgspec.Struct, frozen=True, kw_only=True):
    devices: list[PreparedDevice] = []
    error: str = ""


class NodeRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``dra.node.<node>.prepare`` / ``.unprepare``: the claims of one kubelet call."""

    schema_version: int = SCHEMA_VERSION
    node: str
    claims: list[ClaimRef]
    deadline: float  # unix time by which the kubelet stops waiting
    # claim UID -> W3C traceparent of the front's send span for that claim: one
    # request carries several claims, each in its own trace (a header holds one).
    traceparents: dict[str, str] = {}


class NodeReply(msgspec.Struct, frozen=True, kw_only=True):
    """Per-claim results keyed by claim UID; every requested claim has an entry."""

    schema_version: int = SCHEMA_VERSION
    claims: dict[str, ClaimResult]
