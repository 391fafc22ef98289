"""What preparing one claim will do, decided before anything is done.

The plan reads the claim's results, the node's inventory and the configs, and
checks all it can without a side effect: the allocation (ours, on this node),
every device found, every config resolved and valid for its devices, each share's
fit, each MPS config's limits read once (by device UUID or index) for the daemon
that will carry them. A claim whose plan fails changes nothing on the node.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import Counter

from services.core.kube.resource import (
    AllocationResult,
    DeviceRequestAllocationResult,
    ResourceClaim,
)
from services.core.model import configs, nvidia
from services.core.model import featuregates as fg
from services.core.model.schemas import NodeInventory
from services.core.model.shares import SharesMode
from services.preparer import shareplan, verify
from services.preparer.context import Context
from services.preparer.inventory import Target, locate
from services.preparer.transaction import PrepareError

log = logging.getLogger(__name__)

LIMITS_CAPPED = Counter(
    "gpudra_preparer_memory_limits_capped_total",
    "MPS pinned-memory limits above the memory of their device, capped to it.",
)


@dataclass(frozen=True)
class MpsPlan:
    """One config group's MPS daemon: the devices it serves and their limits."""

    daemon_id: str
    device_uuids: list[str]  # sorted, as the reference hands them to its daemon
    gpu_uuids: list[str]
    active_thread_percentage: int | None
    pinned_memory_limits_mib: dict[str, int]
    multi_user: bool


@dataclass
class Plan:
    allocation: AllocationResult
    results: list[DeviceRequestAllocationResult]
    targets: dict[str, Target]  # device name -> where it is
    groups: list[configs.ConfigGroup]
    shares: dict[str, shareplan.SharePlan] = field(default_factory=dict)  # share id -> plan
    mps: dict[int, MpsPlan] = field(default_factory=dict)  # group index -> its daemon

    def side_effects(self, gates: fg.FeatureGates) -> bool:
        """Whether preparing changes the node beyond the claim's own files (which start-up
        removes when no completed entry owns them): then a crash must find PrepareStarted."""
        for t in self.targets.values():
            if t.kind == nvidia.VFIO_TYPE or (
                t.kind == nvidia.MIG_TYPE and gates.enabled(fg.DYNAMIC_MIG)
            ):
                return True
        return any(getattr(g.config, "sharing", None) is not None for g in self.groups)


def for_claim(ctx: Context, uid: str, claim: ResourceClaim) -> Plan:
    """The claim checked and planned, or the refusal of the first thing that cannot be.

    The allocation is checked here although the claim source checked it, so that no
    way of reading a claim can skip it (verify.py)."""
    problem = verify.allocation(claim, ctx.settings.node)
    if problem is not None:
        raise PrepareError(problem)
    results = verify.our_results(claim)
    allocation = claim.status.allocation if claim.status else None
    assert allocation is not None  # checked by verify.allocation
    inv = ctx.inventory.require()
    targets = locate_all(inv, results)
    with ctx.steps.step("config.resolve"):
        settings = ctx.settings
        return make(uid, allocation, results, targets, inv, settings.gates, settings.shares)


def locate_all(
    inv: NodeInventory, results: Sequence[DeviceRequestAllocationResult]
) -> dict[str, Target]:
    """Where each allocated device is on the node (DeviceNotFound for one that is not)."""
    return {r.device: locate(inv, r.device) for r in results}


def make(
    uid: str,
    allocation: AllocationResult,
    results: Sequence[DeviceRequestAllocationResult],
    targets: dict[str, Target],
    inv: NodeInventory,
    gates: fg.FeatureGates,
    shares: SharesMode,
) -> Plan:
    """The claim's plan, or the refusal (a ClaimRefused) of the first thing that cannot be."""
    kinds = {name: t.kind for name, t in targets.items()}
    config_list = allocation.devices.config if allocation.devices else None
    groups = configs.resolve(config_list, results, kinds, gates)
    plan = Plan(allocation, list(results), targets, groups)
    plan.mps = {i: _mps(uid, g, targets) for i, g in enumerate(groups) if _is_mps(g)}
    group_of = {id(r): g for g in groups for r in g.results}
    for index, r in enumerate(results):
        if r.share_id is not None:
            plan.shares[r.share_id] = shareplan.plan(
                r, index, targets[r.device], inv, gates, shares, group_of.get(id(r))
            )
    return plan


def _is_mps(group: configs.ConfigGroup) -> bool:
    sharing = getattr(group.config, "sharing", None)
    return sharing is not None and sharing.strategy == configs.MPS


def _mps(uid: str, group: configs.ConfigGroup, targets: Mapping[str, Target]) -> MpsPlan:
    """The group's daemon; per-device limits name devices by UUID or index (of the sorted
    UUIDs), read here once, before any side effect."""
    sharing = getattr(group.config, "sharing")  # noqa: B009 - _is_mps checked it
    mps_config = sharing.mps_config or configs.MpsConfig()
    members = [targets[r.device] for r in group.results]
    uuids = sorted(t.live.uuid if t.live else t.gpu.uuid for t in members)
    where = f"{group.origin} {group.config.kind}.sharing.mpsConfig"
    asked = configs.per_device_limits(mps_config, uuids, where)
    limits, lowered = configs.capped(asked, _memory_mib(members))
    for cap in lowered:  # a ceiling the device already meets: kept, and said (configs.capped)
        LIMITS_CAPPED.inc()
        log.warning(
            "pinned memory limit above the device's memory; capped to it",
            extra={"uid": uid, "field": where, "device": cap.uuid,
                   "asked_mib": cap.asked_mib, "applied_mib": cap.device_mib},
        )  # fmt: skip
    return MpsPlan(
        daemon_id=mps_daemon_id(uid, uuids),
        device_uuids=uuids,
        gpu_uuids=sorted({t.gpu.uuid for t in members}),
        active_thread_percentage=mps_config.default_active_thread_percentage,
        pinned_memory_limits_mib=limits,
        multi_user=bool(mps_config.multi_user),
    )


def _memory_mib(members: Sequence[Target]) -> dict[str, int]:
    """Each device's memory in MiB, by the UUID its limit names: a MIG device's is its
    profile's (one not made yet goes by its GPU's UUID: the smallest of those counts)."""
    out: dict[str, int] = {}
    for t in members:
        uuid = t.live.uuid if t.live else t.gpu.uuid
        mib = (t.profile.memory_bytes if t.profile else t.gpu.memory_bytes) // configs.MIB
        out[uuid] = min(mib, out.get(uuid, mib))
    return out


def mps_daemon_id(claim_uid: str, uuids: Sequence[str]) -> str:
    """``<claimUID>-<5 hex of sha256(sorted uuids)>``, as the reference names daemons."""
    digest = hashlib.sha256(",".join(sorted(uuids)).encode()).hexdigest()
    return f"{claim_uid}-{digest[:5]}"
