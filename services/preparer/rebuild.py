"""After a quarantined checkpoint: what is prepared, rebuilt from what is on the node.

A claim's CDI spec (``k8s.gpu.nvidia.com-claim_<uid>.yaml``, written by gpudra
or by the reference, which names it the same way) is written only when its
prepare completes, and its device names are ``<uid>-<device>``. So each spec
on disk is a claim that was prepared, and its devices are known; the
inventory says what hardware they are (MIG device, VFIO twin), the claims
bucket gives the request names when the claim is still there, and MPS
daemons named ``<uid>-...`` are the claim's.

Rebuilt claims stay prepared (their running containers keep their devices,
a restarted container finds its spec) and are unprepared like any other. What
a spec cannot say: the config that was applied. Time-slicing is reset on
unprepare to ``Default`` for the claim's full GPUs (harmless where none was
set). Without the rebuild, start-up clean-up would delete every spec and
destroy the dynamic MIG devices of running pods.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec
import yaml

from services.core.kube import quantity
from services.core.kube.resource import DeviceRequestAllocationResult, ResourceClaim
from services.core.model import nvidia, shares
from services.core.model.schemas import NodeInventory
from services.preparer import cdi, shareplan
from services.preparer.checkpoint import (
    PREPARE_COMPLETED,
    ClaimEntry,
    GroupState,
    MigState,
    MpsState,
    PreparedDeviceState,
    ShareState,
    VfioState,
)
from services.preparer.inventory import DeviceNotFound, locate

log = logging.getLogger(__name__)
ORIGIN = "rebuilt from the node"


def spec_devices(root: Path, uid: str) -> list[str]:
    """The device names (``<device>`` of ``<uid>-<device>``) in a claim's CDI spec."""
    path = cdi.spec_path(root, uid)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        log.warning("unreadable claim spec", extra={"path": str(path), "error": str(exc)})
        return []
    prefix = cdi.device_name(uid, "")
    names = [d.get("name", "") for d in (spec or {}).get("devices") or [] if isinstance(d, dict)]
    return [n.removeprefix(prefix) for n in names if isinstance(n, str) and n.startswith(prefix)]


def rebuild_claim(
    uid: str,
    devices: Sequence[str],
    *,
    node: str,
    inventory: NodeInventory | None,
    claim: ResourceClaim | None,
    daemons: Sequence[MpsState],
    dynamic_mig: bool,
) -> ClaimEntry:
    """A completed claim holding ``devices`` (names), as far as the node can tell.

    ``claim``: the claim as the claims bucket has it, if it does (request
    names, namespace and name); ``daemons``: the MPS daemons named after it.
    """
    requests = _requests(claim, node)
    shared = _shares(claim, node)
    states = [
        _shared(
            _device(uid, name, node, inventory, requests.get(name), dynamic_mig),
            shared.get(name),
            uid,
            inventory,
        )
        for name in devices
    ]
    gpus = sorted({d.gpu_uuid for d in states if d.kind == nvidia.GPU_TYPE and d.gpu_uuid})
    groups = [GroupState(kind="", origin=ORIGIN, time_slice_gpus=gpus)]
    groups += [GroupState(kind="", origin=ORIGIN, mps=daemon) for daemon in daemons]
    meta = claim.metadata if claim is not None else None
    return ClaimEntry(
        state=PREPARE_COMPLETED,
        namespace=(meta.namespace or "") if meta else "",
        name=meta.name if meta else "",
        allocation=claim.status.allocation if claim is not None and claim.status else None,
        devices=states,
        groups=groups,
    )


def _shares(claim: ResourceClaim | None, node: str) -> Mapping[str, DeviceRequestAllocationResult]:
    """``<device>-<shareID>`` (a share's part of its CDI name) -> its allocation result."""
    allocation = claim.status.allocation if claim is not None and claim.status else None
    results = allocation.devices.results if allocation and allocation.devices else None
    return {
        f"{r.device}-{r.share_id}": r
        for r in results or []
        if r.driver == nvidia.DRIVER_NAME and r.pool == node and r.share_id
    }


def _shared(
    state: PreparedDeviceState,
    result: DeviceRequestAllocationResult | None,
    uid: str,
    inv: NodeInventory | None,
) -> PreparedDeviceState:
    """A consumable share's device, its share and its device's daemon (kept by start-up)."""
    if result is None or result.share_id is None:
        return state
    try:
        target = locate(inv, result.device) if inv is not None else None
    except DeviceNotFound:
        target = None
    if target is None:
        return state
    device_uuid = target.live.uuid if target.live is not None else target.gpu.uuid
    consumed = dict(result.consumed_capacity or {})
    try:
        amounts = {k: quantity.parse(v) for k, v in consumed.items()}
    except quantity.QuantityError:
        amounts = {}
    share = ShareState(
        share_id=result.share_id,
        device_uuid=device_uuid,
        consumed=consumed,
        daemon_id=shareplan.daemon_id(device_uuid),
        memory_limit_mib=shares.memory_limit_mib(amounts),
    )
    gpu = target.gpu
    return msgspec.structs.replace(
        state,
        name=result.device,
        kind=target.kind,
        requests=[result.request] if result.request else state.requests,
        cdi_device_ids=[cdi.device_id(uid, result.device, result.share_id)],
        gpu_uuid=gpu.uuid,
        gpu_minor=gpu.minor,
        pci_bus_id=gpu.pci_bus_id,
        share=share,
    )


def _requests(claim: ResourceClaim | None, node: str) -> Mapping[str, str]:
    allocation = claim.status.allocation if claim is not None and claim.status else None
    results = allocation.devices.results if allocation and allocation.devices else None
    return {
        r.device: r.request
        for r in results or []
        if r.driver == nvidia.DRIVER_NAME and r.pool == node
    }


def _device(
    uid: str,
    name: str,
    node: str,
    inv: NodeInventory | None,
    request: str | None,
    dynamic_mig: bool,
) -> PreparedDeviceState:
    try:
        kind = nvidia.parse_device_name(name).kind
    except ValueError:
        kind = nvidia.GPU_TYPE  # not a name we publish; kept so unprepare removes its spec
    state = PreparedDeviceState(
        name=name,
        kind=kind,
        requests=[request] if request else [],
        pool=node,
        cdi_device_ids=[cdi.device_id(uid, name)],
    )
    try:
        target = locate(inv, name) if inv is not None else None
    except DeviceNotFound as exc:
        log.warning("rebuilt device not in the inventory", extra={"uid": uid, "error": str(exc)})
        target = None
    if target is None:
        return state
    gpu = target.gpu
    state = msgspec.structs.replace(
        state, gpu_uuid=gpu.uuid, gpu_minor=gpu.minor, pci_bus_id=gpu.pci_bus_id
    )
    if target.kind == nvidia.MIG_TYPE and target.live is not None:
        return msgspec.structs.replace(
            state, mig=MigState.of(gpu, target.live, created=dynamic_mig)
        )
    if target.kind == nvidia.VFIO_TYPE and gpu.vfio is not None:
        vfio = VfioState(pci_bus_id=gpu.pci_bus_id, iommu_group=gpu.vfio.iommu_group)
        return msgspec.structs.replace(state, vfio=vfio)
    return state
