"""Build a node's :class:`NodeInventory` from any NVML backend, one GPU at a time.

NVML errors on one GPU never spoil the rest: the failing query is recorded in
that GPU's ``error`` and its value is taken from the previous scan where there
was one. A GPU that answers GPU_IS_LOST keeps its last known identity (so the
publisher can still name and taint it) and is reported as lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from services.core.model.schemas import (
    Gpu,
    GpuFabric,
    MigDevice,
    MigPlacement,
    MigProfile,
    NodeInventory,
)
from services.discovery import backend as nv
from services.discovery.backend import Backend
from services.discovery.models import MIB

log = logging.getLogger(__name__)
T = TypeVar("T")


class ScanError(RuntimeError):
    """The node as a whole could not be scanned (e.g. the device count failed)."""


@dataclass
class Scan:
    inventory: NodeInventory  # health fields are left at their defaults
    lost: set[int] = field(default_factory=set)  # indices NVML reports as lost
    unmonitored: set[int] = field(default_factory=set)  # indices whose events are not watched


def format_cuda_version(version: int) -> str:
    """NVML's 12080 -> "12.8" (as the reference driver formats it)."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def scan(be: Backend, node: str, previous: NodeInventory | None = None) -> Scan:
    try:
        count = be.device_count()
    except nv.NvmlError as exc:
        raise ScanError(f"device count: {exc}") from exc
    before = {g.index: g for g in previous.gpus} if previous else {}
    driver = _node_query("driver version", be.driver_version, previous, "driver_version")
    cuda = _node_query(
        "CUDA driver version",
        lambda: format_cuda_version(be.cuda_driver_version()),
        previous,
        "cuda_driver_version",
    )
    gpus: list[Gpu] = []
    lost: set[int] = set()
    for index in range(count):
        gpu, is_lost = scan_gpu(be, index, before.get(index))
        gpus.append(gpu)
        if is_lost:
            lost.add(index)
    inventory = NodeInventory(
        node=node,
        driver_version=driver,
        cuda_driver_version=cuda,
        gpus=gpus,
        backend=be.name,
    )
    return Scan(inventory, lost, set(be.unmonitored()))


def scan_gpu(be: Backend, index: int, previous: Gpu | None) -> tuple[Gpu, bool]:
    """One GPU's record and whether NVML says it is lost; never raises."""
    try:
        return _GpuScan(be, index, previous).run(), False
    except nv.GpuLost as exc:
        log.warning("GPU lost", extra={"gpu": index, "error": str(exc)})
        return _lost(index, previous, exc), True


class _GpuScan:
    def __init__(self, be: Backend, index: int, previous: Gpu | None) -> None:
        self.be, self.index, self.prev = be, index, previous
        self.errors: list[str] = []

    def query(self, what: str, call: Callable[[], T], fallback: T, *, required: bool = True) -> T:
        """``call()``, or ``fallback`` with the error noted (GpuLost propagates)."""
        try:
            return call()
        except nv.GpuLost:
            raise
        except nv.NvmlError as exc:
            if required:
                self.errors.append(f"{what}: {exc}")
            log.warning(
                "NVML query failed", extra={"gpu": self.index, "query": what, "error": str(exc)}
            )
        except Exception as exc:  # a backend bug must not take the node's inventory down
            self.errors.append(f"{what}: {type(exc).__name__}: {exc}")
            log.exception("NVML query raised", extra={"gpu": self.index, "query": what})
        return fallback

    def run(self) -> Gpu:
        be, i = self.be, self.index
        uuid = self.query("uuid", lambda: be.uuid(i), self.prev.uuid if self.prev else "")
        if self.prev is not None and self.prev.uuid != uuid:
            self.prev = None  # a different GPU now has this index
        prev = self.prev
        cc = self.query("compute capability", lambda: be.cuda_compute_capability(i), None)
        pci = self.query("PCI info", lambda: be.pci_info(i), None)
        mig_mode = self._mig_mode()
        profiles = self._profiles() if mig_mode is not None else []
        enabled = bool(mig_mode and mig_mode[0])
        return Gpu(
            index=i,
            minor=self.query("minor number", lambda: be.minor(i), prev.minor if prev else -1),
            uuid=uuid,
            product_name=self.query(
                "name", lambda: be.product_name(i), _prev(prev, "product_name")
            ),
            brand=self.query("brand", lambda: be.brand(i), _prev(prev, "brand")),
            architecture=self.query(
                "architecture", lambda: be.architecture(i), _prev(prev, "architecture")
            ),
            cuda_compute_capability=(
                f"{cc[0]}.{cc[1]}" if cc else _prev(prev, "cuda_compute_capability")
            ),
            memory_bytes=self._memory(),
            pci_bus_id=pci.bus_id if pci else _prev(prev, "pci_bus_id"),
            pcie_root=self.query("PCIe root", lambda: be.pcie_root(i), None, required=False),
            numa_node=self.query("NUMA node", lambda: be.numa_node(i), None, required=False),
            addressing_mode=self.query(
                "addressing mode", lambda: be.addressing_mode(i), None, required=False
            ),
            mig_capable=mig_mode is not None,
            mig_enabled=enabled,
            mig_profiles=profiles,
            mig_devices=self._mig_devices(profiles) if enabled else [],
            vfio=self.query("VFIO facts", lambda: be.vfio_info(i), None, required=False),
            fabric=self._fabric(),
            error="; ".join(self.errors) or None,
        )

    def _memory(self) -> int:
        try:
            return self.be.memory_total(self.index)
        except nv.NotSupported:  # some platforms have no dedicated memory to report
            return 0
        except nv.GpuLost:
            raise
        except nv.NvmlError as exc:
            self.errors.append(f"memory: {exc}")
            return self.prev.memory_bytes if self.prev else 0

    def _fabric(self) -> GpuFabric | None:
        """The NVLink fabric facts; None for a GPU outside a fabric (NOT_SUPPORTED)."""
        try:
            info = self.be.gpu_fabric_info(self.index)
        except nv.NotSupported:
            return None
        except nv.GpuLost:
            raise
        except nv.NvmlError as exc:
            self.errors.append(f"fabric info: {exc}")
            return self.prev.fabric if self.prev else None
        if info.state == nv.FABRIC_STATE_NOT_SUPPORTED:
            return None  # Hopper outside a fabric answers so (a real HGX H100, driver 580)
        return GpuFabric(
            cluster_uuid=info.cluster_uuid,
            clique_id=info.clique_id,
            state=info.state,
            status=info.status,
        )

    def _mig_mode(self) -> tuple[bool, bool] | None:
        """(current, pending), or None for a GPU without MIG."""
        try:
            return self.be.mig_mode(self.index)
        except nv.NotSupported:
            return None
        except nv.GpuLost:
            raise
        except nv.NvmlError as exc:
            self.errors.append(f"MIG mode: {exc}")
            if self.prev is None or not self.prev.mig_capable:
                return None
            return self.prev.mig_enabled, self.prev.mig_enabled

    def _profiles(self) -> list[MigProfile]:
        fallback = self.prev.mig_profiles if self.prev else []
        found = self.query("MIG profiles", lambda: self.be.gpu_instance_profiles(self.index), None)
        if found is None:
            return fallback
        return [to_mig_profile(p) for p in found]

    def _mig_devices(self, profiles: Sequence[MigProfile]) -> list[MigDevice]:
        fallback = self.prev.mig_devices if self.prev else []
        found = self.query("MIG devices", lambda: self.be.mig_devices(self.index), None)
        if found is None:
            return fallback
        names = {p.gi_profile_id: p.name for p in profiles}
        out = []
        for m in sorted(found, key=lambda m: (m.placement.start, m.ci_id)):
            if m.gi_profile_id not in names:
                self.errors.append(f"MIG device {m.uuid}: unknown GI profile id {m.gi_profile_id}")
            out.append(
                MigDevice(
                    uuid=m.uuid,
                    profile=names.get(m.gi_profile_id, ""),
                    gi_profile_id=m.gi_profile_id,
                    gi_id=m.gi_id,
                    ci_id=m.ci_id,
                    placement=MigPlacement(m.placement.start, m.placement.size),
                )
            )
        return out


def to_mig_profile(p: nv.GpuInstanceProfile) -> MigProfile:
    return MigProfile(
        name=p.name,
        gi_profile_id=p.id,
        ci_profile_id=p.ci_profile,
        slices=p.slices,
        memory_bytes=p.memory_mib * MIB,
        multiprocessors=p.multiprocessors,
        copy_engines=p.copy_engines,
        decoders=p.decoders,
        encoders=p.encoders,
        jpeg_engines=p.jpeg_engines,
        ofa_engines=p.ofa_engines,
        placements=[MigPlacement(pl.start, pl.size) for pl in p.placements],
    )


def _prev(prev: Gpu | None, attr: str) -> str:
    return str(getattr(prev, attr)) if prev is not None else ""


def _lost(index: int, prev: Gpu | None, exc: nv.NvmlError) -> Gpu:
    if prev is not None:
        return msgspec.structs.replace(prev, error=str(exc))
    return Gpu(
        index=index,
        minor=-1,
        uuid="",
        product_name="",
        brand="",
        architecture="",
        cuda_compute_capability="",
        memory_bytes=0,
        pci_bus_id="",
        error=str(exc),
    )


def _node_query(
    what: str, call: Callable[[], str], previous: NodeInventory | None, attr: str
) -> str:
    try:
        return call()
    except nv.NvmlError as exc:
        log.warning("NVML query failed", extra={"query": what, "error": str(exc)})
        return str(getattr(previous, attr)) if previous is not None else ""


# ---------------------------------------------------------------- change descriptions


def gpu_label(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}" if gpu.minor >= 0 else f"GPU index {gpu.index}"


def describe_changes(old: NodeInventory | None, new: NodeInventory) -> list[str]:
    """Short human-readable lines saying what changed between two scans."""
    if old is None:
        return [f"inventory created: {len(new.gpus)} GPUs ({new.backend})"]
    out: list[str] = []
    for attr in ("backend", "driver_version", "cuda_driver_version"):
        a, b = getattr(old, attr), getattr(new, attr)
        if a != b:
            out.append(f"{attr.replace('_', ' ')}: {a} -> {b}")
    before = {g.index: g for g in old.gpus}
    after = {g.index: g for g in new.gpus}
    for index in sorted(before.keys() - after.keys()):
        out.append(f"{gpu_label(before[index])}: removed")
    for index in sorted(after):
        if index not in before:
            out.append(f"{gpu_label(after[index])}: added ({after[index].uuid})")
        elif before[index] != after[index]:
            out.extend(_gpu_changes(before[index], after[index]))
    return out


def _gpu_changes(a: Gpu, b: Gpu) -> list[str]:
    label = gpu_label(b)
    out: list[str] = []
    if a.uuid != b.uuid:
        out.append(f"{label}: uuid {a.uuid} -> {b.uuid}")
    if a.mig_enabled != b.mig_enabled:
        out.append(f"{label}: MIG mode {'enabled' if b.mig_enabled else 'disabled'}")
    old_migs = {m.uuid: m for m in a.mig_devices}
    new_migs = {m.uuid: m for m in b.mig_devices}
    for uuid in new_migs.keys() - old_migs.keys():
        m = new_migs[uuid]
        out.append(
            f"{label}: MIG {m.profile} created at {m.placement.start} (GI {m.gi_id}, {uuid})"
        )
    for uuid in old_migs.keys() - new_migs.keys():
        m = old_migs[uuid]
        out.append(f"{label}: MIG {m.profile} destroyed at {m.placement.start} (GI {m.gi_id})")
    seen = {(x.xid, x.timestamp) for x in a.health.xids}
    for x in b.health.xids:
        if (x.xid, x.timestamp) not in seen:
            where = f" on GI {x.gi_id}/CI {x.ci_id}" if x.gi_id is not None else ""
            out.append(f"{label}: XID {x.xid}{where}")
    if a.health.lost != b.health.lost:
        out.append(f"{label}: {'lost' if b.health.lost else 'recovered'}")
    if a.health.unmonitored != b.health.unmonitored:
        out.append(f"{label}: {'unmonitored' if b.health.unmonitored else 'monitored'}")
    if a.error != b.error:
        out.append(f"{label}: NVML error: {b.error}" if b.error else f"{label}: NVML error cleared")
    if not out:
        changed = [f for f in Gpu.__struct_fields__ if getattr(a, f) != getattr(b, f)]
        out.append(f"{label}: {', '.join(changed)} changed")
    return out
