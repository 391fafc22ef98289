"""What a consumable share of a device (KEP-5075) takes, checked before any side effect.

The scheduler's allocation says which share (``shareID``) of which device a
claim got and how much of each capacity it consumed. The preparer trusts none
of it blindly: it rebuilds the device exactly as this node publishes it
(services/core/model/shares.py renders the same policies for the publisher), checks
the consumed amounts against those policies, and checks that the shares
prepared (or being prepared) on the device plus this one fit its capacity.
Every refusal here is permanent: retrying cannot make a share fit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from services.core.kube import quantity
from services.core.kube.resource import Device, DeviceRequestAllocationResult
from services.core.model import configs, gpudevices, migpartitions, nvidia, shares
from services.core.model import featuregates as fg
from services.core.model.refusal import ClaimRefused
from services.core.model.schemas import NodeInventory
from services.preparer.checkpoint import ShareState
from services.preparer.inventory import Target

DAEMON_PREFIX = "shared-"


class ShareError(ClaimRefused, ValueError):
    """A share this node cannot prepare (permanent: which device, share and capacity)."""


@dataclass(frozen=True)
class SharePlan:
    """One share to prepare: the device as published, and what the share takes of it."""

    device: Device
    state: ShareState


def daemon_id(device_uuid: str) -> str:
    """One MPS control daemon per shared device, named after the device, not a claim."""
    return f"{DAEMON_PREFIX}{device_uuid}"


def published(target: Target, inv: NodeInventory, gates: fg.FeatureGates) -> Device:
    """The device as this node publishes it, before the shares policy is applied."""
    gpu = target.gpu
    if target.kind == nvidia.GPU_TYPE:
        if gates.enabled(fg.DYNAMIC_MIG) and migpartitions.dynamic_mig_capable(gpu):
            return migpartitions.partitionable_gpu_device(
                gpu, inv, migpartitions.PartitionModel.of(gpu)
            )
        return gpudevices.gpu_device(gpu, inv)
    if target.kind == nvidia.MIG_TYPE:
        if target.live is not None and not gates.enabled(fg.DYNAMIC_MIG):
            return gpudevices.static_mig_device(gpu, target.live, inv)
        assert target.profile is not None and target.placement is not None
        return migpartitions.partition_device(gpu, target.profile, target.placement, inv)
    raise ShareError(
        f"device {target.name!r} is a {target.kind} device: VFIO devices are never "
        "published with allowMultipleAllocations, so no share of one can be prepared"
    )


def plan(
    result: DeviceRequestAllocationResult,
    index: int,
    target: Target,
    inv: NodeInventory,
    gates: fg.FeatureGates,
    mode: shares.SharesMode,
    config: configs.ConfigGroup | None,
) -> SharePlan:
    """Check one ``shareID`` result; :class:`ShareError` says what is wrong with it."""
    where = (
        f"allocation.devices.results[{index}] (device {result.device!r}, share {result.share_id})"
    )
    if not mode.enabled:
        raise ShareError(
            f"{where}: the allocation gives a share of the device, but this node does not "
            f"publish it with allowMultipleAllocations (feature gate {fg.CONSUMABLE_SHARES} "
            f"or {shares.FLAG} is off)"
        )
    as_published = published(target, inv, gates)
    device = shares.advertise(as_published, mode)
    try:
        consumed = shares.check_consumed(device, result.consumed_capacity, where)
    except shares.SharesError as exc:
        raise ShareError(str(exc)) from exc
    sharing = getattr(config.config, "sharing", None) if config is not None else None
    if config is not None and sharing is not None:
        raise ShareError(
            f"{where}: {config.origin} {config.config.kind}.sharing.strategy "
            f"{sharing.strategy!r} cannot be mixed with consumable shares on one device "
            "(a shared device runs one MPS daemon that gives each share its own limits)"
        )
    uuid = target.live.uuid if target.live is not None else target.gpu.uuid
    assert result.share_id is not None
    state = ShareState(
        share_id=result.share_id,
        device_uuid=uuid,
        consumed={k: quantity.format_int(math.ceil(v)) for k, v in sorted(consumed.items())},
        daemon_id=daemon_id(uuid),
        memory_limit_mib=shares.memory_limit_mib(consumed),
        thread_percentage=shares.thread_percentage(device, consumed),
    )
    return SharePlan(device, state)


def check_fit(
    device_name: str,
    plan: SharePlan,
    others: Iterable[tuple[str, ShareState]],
) -> None:
    """The shares already on the device (``(who, state)``) plus this one fit its capacity."""
    held: dict[str, Fraction] = {}
    holders: list[str] = []
    for who, state in others:
        holders.append(who)
        for name, amount in state.consumed.items():
            held[name] = held.get(name, Fraction(0)) + quantity.parse(amount)
    for name, cap in (plan.device.capacity or {}).items():
        total = quantity.parse(cap.value)
        mine = quantity.parse(plan.state.consumed.get(name, "0"))
        taken = held.get(name, Fraction(0))
        if taken + mine > total:
            raise ShareError(
                f"device {device_name!r}: share {plan.state.share_id} needs {name} "
                f"{plan.state.consumed.get(name)}, but the shares prepared on it hold "
                f"{quantity.format_int(math.ceil(taken))} of {cap.value} "
                f"({', '.join(sorted(holders)) or 'none'})"
            )
