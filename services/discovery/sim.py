"""A simulated NVML that behaves like the real one, over a :class:`SimNodeState`.

Queries answer from the GPU model tables; MIG calls follow NVML's rules and
return its errors: a placement that is not one of the profile's valid starts
is INVALID_ARGUMENT, one that overlaps a live GPU instance (or would exceed the
compute slices, the profile's instance count or the GPU's media/copy engines)
is INSUFFICIENT_RESOURCES, MIG calls on a GPU with MIG mode off are
NOT_SUPPORTED, destroying a GPU instance that still holds a compute instance is
IN_USE, and every query on a lost GPU is GPU_IS_LOST. GPU-instance ids follow
NVML's numbering by placement (0 for the whole GPU, 1-2 for halves, 3-6 for
quarters, 7-14 for eighths).

The object is not shared between processes: the state is. Mutations change
the in-memory state; :mod:`services.discovery.simstore` writes it back with
compare-and-set.
"""

from __future__ import annotations

import queue
import time
import uuid

from services.core.model.schemas import VfioInfo
from services.discovery import backend as nv
from services.discovery import pciids
from services.discovery.fleet import Fleet, parse_mig_layout
from services.discovery.models import MIB, GpuModel, MigProfileSpec, MigSpec, ModelError, get_model
from services.discovery.simstate import (
    EVENT_LOG_LIMIT,
    SIM_SCHEMA_VERSION,
    SimComputeInstance,
    SimEvent,
    SimGpu,
    SimGpuInstance,
    SimNodeState,
    mig_uuid,
    new_state,
)

NVIDIA_VENDOR_ID = 0x10DE
# GPUs whose NVML answers nvmlDeviceGetGpuFabricInfo (Hopper and newer).
FABRIC_ARCHITECTURES = frozenset({"Hopper", "Blackwell"})


class SimStateError(ValueError):
    """A stored simulated state that cannot be used (e.g. an unknown GPU model)."""


class SimNvml:
    """The NVML backend over a simulated node; see the module docstring."""

    def __init__(self, state: SimNodeState | None = None, *, deliver_past_events: bool = False):
        self._state: SimNodeState | None = None
        self._events: queue.Queue[nv.NvmlEvent] = queue.Queue()
        self._delivered = 0
        self._initialized = False
        self._deliver_past = deliver_past_events
        if state is not None:
            self.load(state)

    # ------------------------------------------------------------ state

    @property
    def state(self) -> SimNodeState:
        if self._state is None:
            raise nv.Uninitialized("no simulated state loaded")
        return self._state

    def load(self, state: SimNodeState) -> None:
        """Take a new state (e.g. another process changed it); queue its new XIDs."""
        check_state(state)
        first = self._state is None
        self._state = state
        if first and not self._deliver_past:
            self._delivered = state.last_event_seq()
        for event in state.events:
            if event.seq > self._delivered:
                self._events.put(self._to_nvml_event(event))
                self._delivered = event.seq

    @classmethod
    def boot(cls, node: str, fleet: Fleet, seed: int) -> SimNvml:
        """A node as it comes up: fleet GPUs, static MIG layouts created in order."""
        sim = cls(new_state(node, fleet, seed))
        sim.init()
        for index, gpu in enumerate(fleet.gpus):
            if gpu.mig is None:
                continue
            sim.set_mig_mode(index, True)
            for item in gpu.mig:
                name, start = parse_mig_layout(item)
                spec = sim._mig_spec(index).by_name(name)
                if spec is None:
                    raise nv.InvalidArgument(f"GPU {index}: no MIG profile {name!r}")
                gi_id, _ = sim.create_gpu_instance(index, spec.id, start)
                sim.create_compute_instance(index, gi_id)
        return sim

    # ------------------------------------------------------------ lifecycle

    @property
    def name(self) -> str:
        return f"simulated:{self.state.fleet}"

    def init(self) -> None:
        _ = self.state
        self._initialized = True

    def shutdown(self) -> None:
        self._initialized = False

    # ------------------------------------------------------------ system

    def driver_version(self) -> str:
        return self.state.driver_version

    def cuda_driver_version(self) -> int:
        return self.state.cuda_driver_version

    def device_count(self) -> int:
        return len(self.state.gpus)

    # ------------------------------------------------------------ per device

    def uuid(self, index: int) -> str:
        return self._gpu(index).uuid

    def minor(self, index: int) -> int:
        return self._gpu(index).minor

    def product_name(self, index: int) -> str:
        return self._model(index).product_name

    def brand(self, index: int) -> str:
        return self._model(index).brand

    def architecture(self, index: int) -> str:
        return self._model(index).architecture

    def cuda_compute_capability(self, index: int) -> tuple[int, int]:
        return self._model(index).cuda_compute_capability

    def memory_total(self, index: int) -> int:
        return self._model(index).memory_mib * MIB

    def pci_info(self, index: int) -> nv.PciInfo:
        gpu, model = self._gpu(index), self._model(index)
        return nv.PciInfo(
            bus_id=gpu.pci_bus_id, device_id=model.pci_device_id, vendor_id=NVIDIA_VENDOR_ID
        )

    def addressing_mode(self, index: int) -> str | None:
        return self._model(index).addressing_mode

    def pcie_root(self, index: int) -> str | None:
        return self._gpu(index).pcie_root

    def numa_node(self, index: int) -> int | None:
        numa = self._gpu(index).numa_node
        return numa if numa >= 0 else None

    def vfio_info(self, index: int) -> VfioInfo | None:
        gpu, model = self._gpu(index), self._model(index)
        return VfioInfo(
            vendor_id=f"0x{NVIDIA_VENDOR_ID:04x}",
            device_id=f"0x{model.pci_device_id:04x}",
            numa_node=gpu.numa_node,
            iommu_group=gpu.iommu_group,
            iommu_fd_enabled=self.state.iommu_fd,
            addressable_memory_bytes=model.addressable_memory_mib * MIB,
            product_name=pciids.builtin().device_name(NVIDIA_VENDOR_ID, model.pci_device_id),
        )

    def gpu_fabric_info(self, index: int) -> nv.FabricInfo:
        fabric = self._gpu(index).fabric
        if fabric is None and self._model(index).architecture in FABRIC_ARCHITECTURES:
            # What a real H100 outside a fabric answered (an HGX host, driver 580.159.04):
            # success, state NOT_SUPPORTED, a zero cluster UUID.
            return nv.FabricInfo(
                cluster_uuid=str(uuid.UUID(int=0)),
                clique_id=0,
                state=nv.FABRIC_STATE_NOT_SUPPORTED,
                status=0,
            )
        if fabric is None:  # NVML has the call for Hopper and newer only
            raise nv.NotSupported(f"GPU {index} is not attached to an NVLink fabric")
        return nv.FabricInfo(
            cluster_uuid=fabric.cluster_uuid,
            clique_id=fabric.clique_id,
            state=fabric.state,
            status=fabric.status,
        )

    # ------------------------------------------------------------ MIG queries

    def mig_mode(self, index: int) -> tuple[bool, bool]:
        self._mig_spec(index)
        gpu = self._gpu(index)
        return gpu.mig_enabled, gpu.mig_pending

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        self._mig_spec(index)
        gpu = self._gpu(index)
        if not enabled and gpu.gpu_instances:
            raise nv.InUse(f"GPU {index}: {len(gpu.gpu_instances)} GPU instances exist")
        gpu.mig_enabled = gpu.mig_pending = enabled
        self._touch()

    def gpu_instance_profiles(self, index: int) -> list[nv.GpuInstanceProfile]:
        """In NVML's enumeration order (by NVML_GPU_INSTANCE_PROFILE_* index)."""
        profiles = sorted(self._mig_spec(index).profiles, key=lambda p: p.nvml_profile)
        return [_profile_info(p) for p in profiles]

    def mig_devices(self, index: int) -> list[nv.MigInstance]:
        self._mig_spec(index)
        gpu = self._gpu(index)
        if not gpu.mig_enabled:
            return []
        return [
            nv.MigInstance(
                gi_id=gi.id,
                ci_id=ci.id,
                gi_profile_id=gi.profile_id,
                placement=nv.Placement(gi.start, gi.size),
                uuid=ci.uuid,
            )
            for gi in sorted(gpu.gpu_instances, key=lambda g: g.start)
            for ci in gi.compute_instances
        ]

    # ------------------------------------------------------------ MIG changes

    def create_gpu_instance(
        self, index: int, profile_id: int, placement_start: int | None
    ) -> tuple[int, nv.Placement]:
        mig, gpu = self._mig_on(index)
        profile = mig.by_id(profile_id)
        if profile is None:
            raise nv.InvalidArgument(f"GPU {index}: no GPU instance profile id {profile_id}")
        if placement_start is not None and placement_start not in profile.starts:
            raise nv.InvalidArgument(
                f"GPU {index}: {profile.name} cannot start at {placement_start} "
                f"(valid: {profile.starts})"
            )
        _check_capacity(index, mig, gpu, profile)
        used = _used_slices(gpu)
        starts = profile.starts if placement_start is None else [placement_start]
        for start in starts:
            if used.isdisjoint(range(start, start + profile.size)):
                gi = SimGpuInstance(
                    id=_gi_id(mig, start, profile.size),
                    profile_id=profile.id,
                    start=start,
                    size=profile.size,
                )
                gpu.gpu_instances.append(gi)
                self._touch()
                return gi.id, nv.Placement(start, profile.size)
        where = "any placement" if placement_start is None else f"placement {placement_start}"
        raise nv.InsufficientResources(
            f"GPU {index}: {profile.name} at {where} overlaps existing GPU instances"
        )

    def create_compute_instance(self, index: int, gi_id: int) -> tuple[int, str]:
        mig, gpu = self._mig_on(index)
        gi = _find_gi(index, gpu, gi_id)
        if gi.compute_instances:
            raise nv.InsufficientResources(
                f"GPU {index} GI {gi_id}: its compute slices are taken by CI "
                f"{gi.compute_instances[0].id}"
            )
        profile = mig.by_id(gi.profile_id)
        assert profile is not None  # checked when the GI was created
        state = self.state
        ci = SimComputeInstance(
            id=0,
            profile=profile.ci_profile,
            uuid=mig_uuid(state.fleet, state.seed, state.node, index, gpu.mig_serial),
        )
        gpu.mig_serial += 1
        gi.compute_instances.append(ci)
        self._touch()
        return ci.id, ci.uuid

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        _, gpu = self._mig_on(index)
        gi = _find_gi(index, gpu, gi_id)
        remaining = [c for c in gi.compute_instances if c.id != ci_id]
        if len(remaining) == len(gi.compute_instances):
            raise nv.NotFound(f"GPU {index} GI {gi_id}: no compute instance {ci_id}")
        gi.compute_instances = remaining
        self._touch()

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        _, gpu = self._mig_on(index)
        gi = _find_gi(index, gpu, gi_id)
        if gi.compute_instances:
            raise nv.InUse(f"GPU {index} GI {gi_id}: compute instances still exist")
        gpu.gpu_instances = [g for g in gpu.gpu_instances if g.id != gi_id]
        self._touch()

    # ------------------------------------------------------------ events and faults

    def unmonitored(self) -> dict[int, str]:
        return {
            g.index: "NVML_ERROR_NOT_SUPPORTED: no XID events (simulated)"
            for g in self.state.gpus
            if not g.xid_events
        }

    def wait_event(self, timeout_s: float) -> nv.NvmlEvent | None:
        try:
            return self._events.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            return None

    def inject_xid(self, index: int, xid: int, gi_id: int | None, ci_id: int | None) -> int:
        """Record an XID as the driver would raise it; returns its event sequence number."""
        state = self.state
        if not 0 <= index < len(state.gpus):
            raise nv.InvalidArgument(f"no GPU {index} (node has {len(state.gpus)})")
        if (gi_id is None) != (ci_id is None):
            raise nv.InvalidArgument("an XID on a MIG device needs both gi and ci")
        if gi_id is not None:
            gi = _find_gi(index, state.gpus[index], gi_id)
            if all(c.id != ci_id for c in gi.compute_instances):
                raise nv.NotFound(f"GPU {index} GI {gi_id}: no compute instance {ci_id}")
        event = SimEvent(
            seq=state.next_event_seq,
            gpu_index=index,
            xid=xid,
            gi_id=gi_id,
            ci_id=ci_id,
            timestamp=time.time(),
        )
        state.next_event_seq += 1
        state.events = [*state.events, event][-EVENT_LOG_LIMIT:]
        self._touch()
        return event.seq

    def set_lost(self, index: int, lost: bool) -> None:
        """Make a GPU fall off the bus (every query fails) or come back after a reset."""
        state = self.state
        if not 0 <= index < len(state.gpus):
            raise nv.InvalidArgument(f"no GPU {index} (node has {len(state.gpus)})")
        state.gpus[index].lost = lost
        self._touch()

    # ------------------------------------------------------------ helpers

    def _gpu(self, index: int) -> SimGpu:
        if not self._initialized:
            raise nv.Uninitialized("call init() first")
        gpus = self.state.gpus
        if not 0 <= index < len(gpus):
            raise nv.InvalidArgument(f"no GPU {index} (device count {len(gpus)})")
        if gpus[index].lost:
            raise nv.GpuLost(f"GPU {index} ({gpus[index].pci_bus_id}) has fallen off the bus")
        return gpus[index]

    def _model(self, index: int) -> GpuModel:
        return get_model(self._gpu(index).model)

    def _mig_spec(self, index: int) -> MigSpec:
        model = self._model(index)
        if model.mig is None:
            raise nv.NotSupported(f"GPU {index} ({model.product_name}) has no MIG support")
        return model.mig

    def _mig_on(self, index: int) -> tuple[MigSpec, SimGpu]:
        mig, gpu = self._mig_spec(index), self._gpu(index)
        if not gpu.mig_enabled:
            raise nv.NotSupported(f"GPU {index}: MIG mode is disabled")
        return mig, gpu

    def _touch(self) -> None:
        self.state.updated_at = time.time()

    def _to_nvml_event(self, event: SimEvent) -> nv.NvmlEvent:
        gpus = self.state.gpus
        uuid = gpus[event.gpu_index].uuid if 0 <= event.gpu_index < len(gpus) else ""
        return nv.NvmlEvent(
            gpu_uuid=uuid,
            xid=event.xid,
            gi_id=event.gi_id,
            ci_id=event.ci_id,
            timestamp=event.timestamp,
        )


def check_state(state: SimNodeState) -> None:
    """Reject a state that decodes but cannot be simulated, saying why."""
    if state.schema_version != SIM_SCHEMA_VERSION:
        raise SimStateError(f"schema version {state.schema_version} (want {SIM_SCHEMA_VERSION})")
    for i, gpu in enumerate(state.gpus):
        if gpu.index != i:
            raise SimStateError(f"gpus[{i}] has index {gpu.index}")
        try:
            get_model(gpu.model)
        except ModelError as exc:
            raise SimStateError(f"gpus[{i}]: {exc}") from exc


def _profile_info(p: MigProfileSpec) -> nv.GpuInstanceProfile:
    return nv.GpuInstanceProfile(
        name=p.name,
        id=p.id,
        ci_profile=p.ci_profile,
        slices=p.slices,
        memory_mib=p.memory_mib,
        multiprocessors=p.multiprocessors,
        copy_engines=p.copy_engines,
        decoders=p.decoders,
        encoders=p.encoders,
        jpeg_engines=p.jpeg_engines,
        ofa_engines=p.ofa_engines,
        instance_count=p.instances,
        placements=tuple(nv.Placement(s, p.size) for s in p.starts),
    )


def _gi_id(mig: MigSpec, start: int, size: int) -> int:
    """NVML's GI numbering: a binary tree over the memory slices (0 = whole GPU)."""
    return mig.memory_slices // size - 1 + start // size


def _used_slices(gpu: SimGpu) -> set[int]:
    return {s for gi in gpu.gpu_instances for s in range(gi.start, gi.start + gi.size)}


def _find_gi(index: int, gpu: SimGpu, gi_id: int) -> SimGpuInstance:
    for gi in gpu.gpu_instances:
        if gi.id == gi_id:
            return gi
    raise nv.NotFound(f"GPU {index}: no GPU instance {gi_id}")


_ENGINES = ("copy_engines", "decoders", "encoders", "jpeg_engines", "ofa_engines")


def _check_capacity(index: int, mig: MigSpec, gpu: SimGpu, new: MigProfileSpec) -> None:
    """Instance count, compute slices and engines left for one more ``new``."""
    live = [mig.by_id(gi.profile_id) for gi in gpu.gpu_instances]
    profiles = [p for p in live if p is not None]
    if sum(p.id == new.id for p in profiles) >= new.instances:
        raise nv.InsufficientResources(
            f"GPU {index}: at most {new.instances} x {new.name} at a time"
        )
    if sum(p.slices for p in profiles) + new.slices > mig.compute_slices:
        raise nv.InsufficientResources(f"GPU {index}: not enough compute slices for {new.name}")
    whole = max(mig.profiles, key=lambda p: p.size)
    for engine in _ENGINES:
        total = getattr(whole, engine)
        if sum(getattr(p, engine) for p in profiles) + getattr(new, engine) > total:
            raise nv.InsufficientResources(
                f"GPU {index}: {new.name} needs {engine.replace('_', ' ')} that are in use"
            )
