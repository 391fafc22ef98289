"""Which lifecycle events a claim change means, decided from what was seen before.

The watcher keeps one :class:`Tracked` record per claim that has devices of
our driver. Comparing a claim's new state with that record gives the events,
so a replayed listing (restart, 410 relist) repeats nothing:

* ``allocated``: the claim has an allocation with results for our driver and
  was not tracked (or its devices changed);
* ``reserved``: ``status.reservedFor`` gained a consumer;
* ``released``: once per allocation, when the claim stops being in use:
  ``reservedFor`` became empty, or the allocation was removed first;
* ``deleted``: a tracked claim was deleted (also after its deallocation,
  unless the watcher restarted in between: the bucket, its memory across
  restarts, holds only allocated claims).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from services.core.kube.resource import (
    DeviceRequestAllocationResult,
    NodeSelector,
    ResourceClaim,
)
from services.core.model import nvidia
from services.core.model.computedomain import CD_DRIVER
from services.core.model.schemas import ClaimRef, DeviceRef

DRIVER = nvidia.DRIVER_NAME
#: Both kubelet plugin drivers' claims have a lifecycle on the bus: a ComputeDomain
#: claim's trail, like a GPU claim's, runs from ``allocated`` to ``deleted``.
DRIVERS = frozenset({DRIVER, CD_DRIVER})
HOSTNAME_LABEL = "kubernetes.io/hostname"


def our_results(claim: ResourceClaim) -> list[DeviceRequestAllocationResult]:
    allocation = claim.status.allocation if claim.status else None
    devices = allocation.devices if allocation else None
    return [r for r in (devices.results if devices else None) or [] if r.driver in DRIVERS]


def consumers(claim: ResourceClaim) -> frozenset[str]:
    reserved = (claim.status.reserved_for if claim.status else None) or []
    return frozenset(c.uid or f"{c.resource}/{c.name}" for c in reserved)


def claim_ref(claim: ResourceClaim) -> ClaimRef:
    meta = claim.metadata
    return ClaimRef(uid=meta.uid or "", namespace=meta.namespace or "", name=meta.name)


def device_refs(claim: ResourceClaim) -> list[DeviceRef]:
    return [DeviceRef(request=r.request, pool=r.pool, device=r.device) for r in our_results(claim)]


def _single_node(selector: NodeSelector | None) -> str | None:
    """The one node a selector names: ``metadata.name In [n]`` or the hostname label."""
    if selector is None or len(selector.node_selector_terms) != 1:
        return None
    term = selector.node_selector_terms[0]
    for req in term.match_fields or []:
        if req.key == "metadata.name" and req.operator == "In" and len(req.values or []) == 1:
            return (req.values or [""])[0]
    for req in term.match_expressions or []:
        if req.key == HOSTNAME_LABEL and req.operator == "In" and len(req.values or []) == 1:
            return (req.values or [""])[0]
    return None


def allocation_node(claim: ResourceClaim) -> str:
    """The node the claim is allocated on: its node selector, else our pool's name.

    Our driver names each node's pool after the node, so the pool is the
    fallback when the selector is not a single node (e.g. a network device).
    """
    allocation = claim.status.allocation if claim.status else None
    node = _single_node(allocation.node_selector if allocation else None)
    if node:
        return node
    results = our_results(claim)
    return results[0].pool if results else ""


@dataclass(frozen=True, slots=True)
class Tracked:
    """What the watcher last reported for one claim."""

    ref: ClaimRef
    node: str
    devices: tuple[tuple[str, str, str], ...]  # (request, pool, device)
    consumers: frozenset[str] = frozenset()
    released: bool = False
    resource_version: str | None = None


@dataclass(slots=True)
class Step:
    """The events one claim change means, and the record to keep afterwards."""

    events: list[str] = field(default_factory=list)
    tracked: Tracked | None = None
    store: bool = False  # write the claim into the claims bucket
    forget: bool = False  # remove it from the claims bucket


def _devices(claim: ResourceClaim) -> tuple[tuple[str, str, str], ...]:
    return tuple((r.request, r.pool, r.device) for r in our_results(claim))


def track(claim: ResourceClaim, *, released: bool = False) -> Tracked:
    return Tracked(
        ref=claim_ref(claim),
        node=allocation_node(claim),
        devices=_devices(claim),
        consumers=consumers(claim),
        released=released,
        resource_version=claim.metadata.resource_version,
    )


def observe(previous: Tracked | None, claim: ResourceClaim) -> Step:
    """The step for ``claim`` as it is now, given what was reported before."""
    step = Step()
    if not our_results(claim):
        if previous is not None and previous.devices:
            if not previous.released:
                step.events.append("released")
            step.forget = True
            # Still tracked (without devices) so that its deletion is reported.
            step.tracked = replace(previous, devices=(), consumers=frozenset(), released=True)
        return step
    now = track(claim)
    if previous is not None and previous.devices != now.devices:
        if not previous.released:
            step.events.append("released")
        previous = None  # a new allocation (after a deallocation, maybe one we missed)
    if previous is None:
        step.events.append("allocated")
        previous = replace(now, consumers=frozenset())
    released = previous.released
    if now.consumers - previous.consumers:
        step.events.append("reserved")
        released = False
    if previous.consumers and not now.consumers:
        step.events.append("released")
        released = True
    step.tracked = replace(now, released=released)
    step.store = previous.resource_version != now.resource_version or "allocated" in step.events
    return step


def deleted(previous: Tracked | None) -> Step:
    if previous is None:
        return Step()
    return Step(events=["deleted"], forget=True)
