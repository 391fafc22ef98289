"""The reference driver's checkpoint, read so a node can switch from it to gpudra.

Both drivers keep their checkpoint at ``<kubelet-root>/plugins/gpu.nvidia.com/checkpoint.json``.
The reference's (``cmd/gpu-kubelet-plugin``: checkpoint.go, checkpointv.go,
prepared.go) is the Go JSON of::

    {"checksum": <uint>, "v1": {"preparedClaims": {<uid>: {"status", "preparedDevices"}}},
     "v2": {"checksum": <uint>, "preparedClaims": {<uid>: {"checkpointState", "status",
            "preparedDevices", "name", "namespace"}}, "nodeBootID": "..."}}

``v2`` is newer and holds every claim with its state (``PrepareStarted`` /
``PrepareCompleted``); ``v1`` holds only completed ones and is still written
for downgrades. Each checksum is the kubelet checkpointmanager's: FNV-32a over
``spew`` ``%#v`` of the JSON bytes (``([]uint8)[123 34 ...]``), for ``v1`` over
``{"checksum":0,"v1":...}``, for ``v2`` over ``v2`` with its checksum 0. The
bytes are the ones in the file (the Go encoder wrote them), never a re-encoding.

What is read becomes gpudra's model: each prepared device with its request,
pool and CDI device ids (the reference names them as gpudra does, in the same
spec file ``k8s.gpu.nvidia.com-claim_<uid>.yaml``), its GPU, MIG device
(destroyed on unprepare when DynamicMIG created it, as the reference does) or
VFIO binding; time-slicing to reset. A claim still ``PrepareStarted`` keeps
its allocation and is rolled back at start-up like one of gpudra's own. The
reference's MPS control daemons are Deployments in its namespace, which
gpudra cannot stop: they are named in a warning (docs/operations.md).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec

from services.core.kit.limits import too_deep
from services.core.kube.resource import AllocationResult
from services.core.model import nvidia
from services.core.model.schemas import NodeInventory
from services.preparer.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    CheckpointData,
    ClaimEntry,
    GpuKind,
    GroupState,
    MigState,
    PreparedDeviceState,
    VfioState,
)
from services.preparer.checkpointfile import CheckpointError
from services.preparer.inventory import DeviceNotFound, Target, locate

log = logging.getLogger(__name__)

MPS_DEPLOYMENT = "mps-control-daemon-{}"  # the reference's MpsControlDaemonNameFmt
ORIGIN = "reference checkpoint"
_CONFIG_KIND = {
    nvidia.GPU_TYPE: "GpuConfig",
    nvidia.MIG_TYPE: "MigDeviceConfig",
    nvidia.VFIO_TYPE: "VfioDeviceConfig",
}
_V2_HEAD = re.compile(r'^\{"checksum":[0-9]+')
_REFERENCE_HEAD = re.compile(rb'^\s*\{\s*"checksum"\s*:\s*[0-9]')
_WS = re.compile(r"[ \t\n\r]*")


# ------------------------------------------------------------------ checksum


def kubelet_checksum(data: bytes) -> int:
    """checkpointmanager/checksum.New(data) for a byte slice: FNV-32a of spew's ``%#v``."""
    h = 0x811C9DC5
    for byte in b"([]uint8)[" + " ".join(map(str, data)).encode() + b"]":
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


# ------------------------------------------------------------------ the Go types


class _Rec(msgspec.Struct, kw_only=True, frozen=True):
    pass


class _Device(_Rec, frozen=True, kw_only=True):
    """kubeletplugin.Device as the reference checkpoints it (Go field names)."""

    requests: list[str] | None = msgspec.field(default=None, name="Requests")
    pool_name: str = msgspec.field(default="", name="PoolName")
    device_name: str = msgspec.field(default="", name="DeviceName")
    cdi_device_ids: list[str] | None = msgspec.field(default=None, name="CDIDeviceIDs")


class _Info(_Rec, frozen=True, kw_only=True):
    uuid: str = ""
    pci_bus_id: str = msgspec.field(default="", name="pciBusID")


class _MigLive(_Rec, frozen=True, kw_only=True):
    parent_minor: int = msgspec.field(default=-1, name="parentMinor")
    gi_id: int = msgspec.field(default=-1, name="giId")
    ci_id: int = msgspec.field(default=-1, name="ciId")
    mig_uuid: str = msgspec.field(default="", name="migUUID")
    parent_uuid: str = msgspec.field(default="", name="parentUUID")
    parent_pci_bus_id: str = msgspec.field(default="", name="parentPCIBusID")


class _Gpu(_Rec, frozen=True, kw_only=True):
    info: _Info | None = None
    device: _Device | None = None


class _Mig(_Rec, frozen=True, kw_only=True):
    concrete: _MigLive | None = None
    device: _Device | None = None


class _Prepared(_Rec, frozen=True, kw_only=True):
    gpu: _Gpu | None = None
    mig: _Mig | None = None
    vfio: _Gpu | None = None  # the same shape: info (uuid, pciBusID) and device


class _ConfigState(_Rec, frozen=True, kw_only=True):
    mps_control_daemon_id: str = msgspec.field(default="", name="mpsControlDaemonID")
    time_slice_applied: bool | None = msgspec.field(default=None, name="timeSliceApplied")


class _Group(_Rec, frozen=True, kw_only=True):
    devices: list[_Prepared] | None = None
    config_state: _ConfigState = msgspec.field(default_factory=_ConfigState, name="configState")


class _Claim(_Rec, frozen=True, kw_only=True):
    checkpoint_state: str = msgspec.field(default=PREPARE_COMPLETED, name="checkpointState")
    status: dict[str, Any] | None = None
    prepared_devices: list[_Group] | None = msgspec.field(default=None, name="preparedDevices")
    name: str = ""
    namespace: str = ""


class _Version(_Rec, frozen=True, kw_only=True):
    prepared_claims: dict[str, _Claim] | None = msgspec.field(default=None, name="preparedClaims")
    node_boot_id: str = msgspec.field(default="", name="nodeBootID")


@dataclass(frozen=True)
class ReferenceCheckpoint:
    """The claims of a verified reference checkpoint, from ``v2`` when it has one."""

    version: str  # "v2" or "v1"
    node_boot_id: str
    claims: dict[str, _Claim]


# ------------------------------------------------------------------ reading


def looks_like_reference(raw: bytes) -> bool:
    """A JSON object that starts with a numeric checksum: the reference's, maybe truncated."""
    return bool(_REFERENCE_HEAD.match(raw))


def read(raw: bytes, source: str) -> ReferenceCheckpoint:
    """Verify and decode; CheckpointError for anything that cannot be trusted."""
    where = f"{source}: the reference driver's checkpoint"
    try:
        text = raw.decode()
        parts = _top_level(text)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{where} is not valid JSON (truncated?): {exc}") from exc
    except RecursionError as exc:  # json's scanner, like msgspec, stops near 1,000 levels
        raise CheckpointError(str(too_deep(where))) from exc
    if not re.fullmatch(r"[0-9]+", parts.get("checksum", "")):
        raise CheckpointError(f"{where} has no numeric checksum")
    if "v1" not in parts and "v2" not in parts and set(parts) != {"checksum"}:
        newer = ", ".join(sorted(set(parts) - {"checksum"}))
        raise CheckpointError(
            f"{where} has neither v1 nor v2 but {newer}: written by a newer version "
            "than gpudra reads"
        )
    _verify(where, "v1", int(parts["checksum"]), '{"checksum":0' + _member("v1", parts) + "}")
    if "v2" in parts:
        body = parts["v2"]
        head = _V2_HEAD.match(body)
        if head is None:
            raise CheckpointError(f"{where}: v2 does not start with its checksum")
        stored = int(head[0].removeprefix('{"checksum":'))
        _verify(where, "v2", stored, '{"checksum":0' + body[head.end() :])
    chosen = "v2" if "v2" in parts else "v1"
    try:
        version = msgspec.json.decode(parts.get(chosen, "{}"), type=_Version)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CheckpointError(f"{where}: {chosen}: {exc}") from exc
    except RecursionError as exc:
        raise CheckpointError(str(too_deep(f"{where}: {chosen}"))) from exc
    claims = dict(version.prepared_claims or {})
    if chosen == "v1":  # v1 only ever holds completed claims
        done = PREPARE_COMPLETED
        claims = {u: msgspec.structs.replace(c, checkpoint_state=done) for u, c in claims.items()}
    return ReferenceCheckpoint(chosen, version.node_boot_id, claims)


def _member(key: str, parts: dict[str, str]) -> str:
    return f',"{key}":{parts[key]}' if key in parts else ""


def _verify(where: str, version: str, stored: int, data: str) -> None:
    computed = kubelet_checksum(data.encode())
    if stored != computed:
        raise CheckpointError(
            f"{where}: {version} checksum mismatch (stored {stored}, computed {computed})"
        )


def _top_level(text: str) -> dict[str, str]:
    """The members of the top-level object, each value as the exact text in the file."""
    decoder = json.JSONDecoder()
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        raise ValueError("not a JSON object")
    i = _skip(text, i + 1)
    members: dict[str, str] = {}
    while text[i : i + 1] != "}":
        if text[i : i + 1] != '"':
            raise ValueError(f"expected a member name at offset {i}")
        key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        i = _skip(text, i)
        if text[i : i + 1] != ":":
            raise ValueError(f"expected ':' at offset {i}")
        start = _skip(text, i + 1)
        _, end = decoder.raw_decode(text, start)
        members[key] = text[start:end]
        i = _skip(text, end)
        if text[i : i + 1] == ",":
            i = _skip(text, i + 1)
        elif text[i : i + 1] != "}":
            raise ValueError(f"expected ',' or '}}' at offset {i}")
    if text[_skip(text, i + 1) :]:
        raise ValueError("data after the object")
    return members


def _skip(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return m.end() if m else i


# ------------------------------------------------------------------ conversion


@dataclass
class Converted:
    data: CheckpointData
    mps_deployments: list[str] = field(default_factory=list)  # the reference's, left running


def convert(
    ref: ReferenceCheckpoint,
    *,
    boot_id: str,
    inventory: NodeInventory | None,
    dynamic_mig: bool,
) -> Converted:
    """gpudra's checkpoint for what the reference had prepared (see the module docstring)."""
    out = Converted(CheckpointData(node_boot_id=boot_id))
    if ref.node_boot_id and ref.node_boot_id != boot_id:
        log.warning(
            "the reference's checkpoint is from another boot; nothing in it exists any more",
            extra={"stored": ref.node_boot_id, "current": boot_id},
        )
        return out
    claims: dict[str, ClaimEntry] = {}
    for uid, claim in sorted(ref.claims.items()):
        claims[uid] = _claim(uid, claim, inventory, dynamic_mig, out.mps_deployments)
    out.data = CheckpointData(node_boot_id=boot_id, claims=claims)
    return out


def _claim(
    uid: str,
    claim: _Claim,
    inv: NodeInventory | None,
    dynamic_mig: bool,
    mps_deployments: list[str],
) -> ClaimEntry:
    allocation = _allocation(uid, claim.status)
    entry = ClaimEntry(
        state=PREPARE_STARTED,
        namespace=claim.namespace,
        name=claim.name,
        allocation=allocation,
    )
    if claim.checkpoint_state != PREPARE_COMPLETED:
        return entry  # rolled back from its allocation at start-up, like gpudra's own
    devices: list[PreparedDeviceState] = []
    groups: list[GroupState] = []
    for index, group in enumerate(claim.prepared_devices or []):
        members = [_device(d, index, inv, dynamic_mig) for d in group.devices or []]
        devices += members
        groups.append(_group(group, members))
        if group.config_state.mps_control_daemon_id:
            mps_deployments.append(MPS_DEPLOYMENT.format(group.config_state.mps_control_daemon_id))
    return msgspec.structs.replace(entry, state=PREPARE_COMPLETED, devices=devices, groups=groups)


def _allocation(uid: str, status: dict[str, Any] | None) -> AllocationResult | None:
    raw = (status or {}).get("allocation")
    if raw is None:
        return None
    try:
        return msgspec.convert(raw, AllocationResult)
    except msgspec.ValidationError as exc:
        log.warning("reference claim allocation unreadable", extra={"uid": uid, "error": str(exc)})
        return None


def _group(group: _Group, members: Sequence[PreparedDeviceState]) -> GroupState:
    """Time-slicing to reset on unprepare when the reference applied it (or could have: nil)."""
    kinds = {d.kind for d in members}
    kind = _CONFIG_KIND[cast(GpuKind, next(iter(kinds)))] if len(kinds) == 1 else ""
    applied = group.config_state.time_slice_applied is not False
    gpus = sorted({d.gpu_uuid for d in members if d.kind == nvidia.GPU_TYPE and d.gpu_uuid})
    return GroupState(kind=kind, origin=ORIGIN, time_slice_gpus=gpus if applied else [])


def _device(
    prepared: _Prepared, group: int, inv: NodeInventory | None, dynamic_mig: bool
) -> PreparedDeviceState:
    kind, checkpointed = _kind(prepared)
    name = checkpointed.device_name
    target = _locate(inv, name)
    base = PreparedDeviceState(
        name=name,
        kind=kind,
        requests=list(checkpointed.requests or []),
        pool=checkpointed.pool_name,
        cdi_device_ids=list(checkpointed.cdi_device_ids or []),
        gpu_uuid=target.gpu.uuid if target else "",
        gpu_minor=target.gpu.minor if target else -1,
        pci_bus_id=target.gpu.pci_bus_id if target else "",
        group=group,
    )
    if prepared.gpu is not None and prepared.gpu.info is not None:
        full = prepared.gpu.info
        minor = nvidia.parse_device_name(name).minor if _ours(name) else None
        return msgspec.structs.replace(
            base,
            gpu_uuid=full.uuid or base.gpu_uuid,
            gpu_minor=base.gpu_minor if minor is None else minor,
            pci_bus_id=base.pci_bus_id or _pci_of(inv, full.uuid),
        )
    if prepared.mig is not None and prepared.mig.concrete is not None:
        return _mig_device(base, prepared.mig.concrete, target, dynamic_mig)
    info = prepared.vfio.info if prepared.vfio is not None else None
    bus = (info.pci_bus_id if info else "") or base.pci_bus_id
    gpu = next((g for g in (inv.gpus if inv else []) if g.pci_bus_id == bus and bus), None)
    group_id = gpu.vfio.iommu_group if gpu is not None and gpu.vfio is not None else -1
    return msgspec.structs.replace(
        base,
        gpu_uuid=base.gpu_uuid or (gpu.uuid if gpu else ""),
        pci_bus_id=bus,
        vfio=VfioState(pci_bus_id=bus, iommu_group=group_id) if bus else None,
    )


def _kind(prepared: _Prepared) -> tuple[nvidia.DeviceType, _Device]:
    for kind, part in (
        (nvidia.GPU_TYPE, prepared.gpu),
        (nvidia.MIG_TYPE, prepared.mig),
        (nvidia.VFIO_TYPE, prepared.vfio),
    ):
        if part is not None and part.device is not None:
            return kind, part.device
    raise CheckpointError("reference checkpoint: a prepared device without gpu, mig or vfio")


def _mig_device(
    base: PreparedDeviceState,
    live: _MigLive,
    target: Target | None,
    dynamic_mig: bool,
) -> PreparedDeviceState:
    ident = nvidia.parse_device_name(base.name) if _ours(base.name) else None
    placement = target.placement if target is not None else None
    mig = MigState(
        uuid=live.mig_uuid,
        parent_uuid=live.parent_uuid,
        parent_minor=live.parent_minor,
        profile=target.profile.name if target is not None and target.profile else "",
        gi_profile_id=(ident.gi_profile_id or 0) if ident else 0,
        placement_start=(ident.placement_start or 0) if ident else 0,
        placement_size=placement.size if placement is not None else 0,
        gi_id=live.gi_id,
        ci_id=live.ci_id,
        created=dynamic_mig,  # the reference destroys MIG devices under DynamicMIG only
    )
    return msgspec.structs.replace(
        base,
        gpu_uuid=live.parent_uuid or base.gpu_uuid,
        gpu_minor=live.parent_minor,
        pci_bus_id=live.parent_pci_bus_id or base.pci_bus_id,
        mig=mig,
    )


def _ours(name: str) -> bool:
    try:
        nvidia.parse_device_name(name)
    except ValueError:
        return False
    return True


def _locate(inv: NodeInventory | None, name: str) -> Target | None:
    if inv is None:
        return None
    try:
        return locate(inv, name)
    except DeviceNotFound:
        return None


def _pci_of(inv: NodeInventory | None, gpu_uuid: str) -> str:
    return next((g.pci_bus_id for g in (inv.gpus if inv else []) if g.uuid == gpu_uuid), "")
