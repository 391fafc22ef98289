"""The simulated NVML state of one node, as it is stored in the KV bucket ``simnvml``.

This is the simulator's own storage (only the discovery package reads or
writes it): what would be the GPU driver's state on a real node. Every process
that changes it (discovery, ``gpudra sim``, MIG requests from the preparer)
does so through :mod:`services.discovery.simstore` with compare-and-set, so
concurrent writers never lose an update.

UUIDs are derived from (fleet, seed, node, GPU index), so a fleet started
again with the same seed on the same node has the same GPU UUIDs; MIG UUIDs also fold in
a per-GPU creation counter, because NVML gives a re-created MIG device a new
UUID.
"""

from __future__ import annotations

import hashlib
import time

import msgspec

from services.core.model.schemas import SchemaError, decode, encode
from services.discovery.fleet import Fleet

SIM_SCHEMA_VERSION = 1
EVENT_LOG_LIMIT = 64  # events kept in the state; older ones are dropped


class SimComputeInstance(msgspec.Struct, kw_only=True):
    id: int
    profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_* index
    uuid: str  # the MIG device's UUID


class SimGpuInstance(msgspec.Struct, kw_only=True):
    id: int
    profile_id: int  # GI profile id (19, 14, ...)
    start: int
    size: int
    compute_instances: list[SimComputeInstance] = []


class SimFabric(msgspec.Struct, kw_only=True):
    """What nvmlDeviceGetGpuFabricInfo answers for a GPU in an NVLink fabric."""

    cluster_uuid: str
    clique_id: int
    state: int = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
    status: int = 0  # NVML_SUCCESS


class SimGpu(msgspec.Struct, kw_only=True):
    index: int
    minor: int
    uuid: str
    model: str  # a table under profiles/
    pci_bus_id: str
    pcie_root: str | None = None
    numa_node: int = -1
    iommu_group: int
    mig_enabled: bool = False
    mig_pending: bool = False
    gpu_instances: list[SimGpuInstance] = []
    lost: bool = False
    mig_serial: int = 0  # MIG devices ever created here; part of their UUIDs
    xid_events: bool = True  # False: registering for its XID events fails (unmonitored)
    fabric: SimFabric | None = None  # None: GetGpuFabricInfo is NOT_SUPPORTED


class SimEvent(msgspec.Struct, kw_only=True):
    seq: int
    gpu_index: int
    xid: int
    gi_id: int | None = None
    ci_id: int | None = None
    timestamp: float


class SimNodeState(msgspec.Struct, kw_only=True):
    schema_version: int = SIM_SCHEMA_VERSION
    node: str
    fleet: str
    seed: int
    driver_version: str
    cuda_driver_version: int
    iommu_fd: bool = False
    gpus: list[SimGpu]
    events: list[SimEvent] = []
    next_event_seq: int = 1
    updated_at: float = msgspec.field(default_factory=time.time)

    def last_event_seq(self) -> int:
        return self.next_event_seq - 1


def encode_state(state: SimNodeState) -> bytes:
    return encode(state)


def decode_state(data: bytes) -> SimNodeState:
    """Raises SchemaError on anything that is not a SimNodeState."""
    state = decode(data, SimNodeState)
    if state.schema_version != SIM_SCHEMA_VERSION:
        raise SchemaError(f"simulated NVML state schema {state.schema_version} is not supported")
    return state


def copy_state(state: SimNodeState) -> SimNodeState:
    return decode(encode(state), SimNodeState)


def derived_uuid(prefix: str, *parts: object) -> str:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` from a stable hash of ``parts``."""
    h = hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_uuid(fleet: str, seed: int, node: str, index: int) -> str:
    return derived_uuid("GPU", "gpu", fleet, seed, node, index)


def mig_uuid(fleet: str, seed: int, node: str, index: int, serial: int) -> str:
    return derived_uuid("MIG", "mig", fleet, seed, node, index, serial)


def fabric_cluster_uuid(fleet: str, seed: int) -> str:
    """The NVLink cluster UUID every node of one fleet and seed shares (one rack)."""
    h = hashlib.sha256(f"fabric:{fleet}:{seed}".encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _fabric(fleet: Fleet, seed: int) -> SimFabric | None:
    if fleet.nvlink_fabric is None:
        return None
    return SimFabric(
        cluster_uuid=fabric_cluster_uuid(fleet.name, seed),
        clique_id=fleet.nvlink_fabric.clique_id,
    )


def new_state(node: str, fleet: Fleet, seed: int) -> SimNodeState:
    """The node as it boots: GPUs from the fleet, MIG mode off (layouts applied by the sim)."""
    gpus = [
        SimGpu(
            index=i,
            minor=i if g.minor is None else g.minor,
            uuid=gpu_uuid(fleet.name, seed, node, i),
            model=g.model,
            pci_bus_id=g.pci_bus_id,
            pcie_root=g.pcie_root,
            numa_node=g.numa_node,
            iommu_group=g.iommu_group,
            fabric=_fabric(fleet, seed),
        )
        for i, g in enumerate(fleet.gpus)
    ]
    return SimNodeState(
        node=node,
        fleet=fleet.name,
        seed=seed,
        driver_version=fleet.driver_version,
        cuda_driver_version=fleet.cuda_driver_version_int(),
        iommu_fd=fleet.iommu_fd,
        gpus=gpus,
    )
