"""The preparer's own checks of a claim before any side effect (issue 9: zero trust on the bus).

Whoever can write the ``claims`` bucket or send a prepare request could
otherwise have the preparer hand out a GPU: so a claim is prepared only if

a. it exists with the UID the kubelet gave (else it was replaced);
b. it is allocated, every device result of our driver is in this node's pool
   (our publisher names a node's pool after the node), the allocation's
   nodeSelector, when set, selects this node by name, and the kubelet will
   unprepare it (not every result of ours skips NodeUnprepareResources);
c. it is reserved for at least one pod that runs on this node (same UID as
   the reservation says, bound to this node, not finished).

Each function returns the reason a check failed (None: it passed), so that
the caller can re-read the claim from the API server before refusing. Every
reason names what was expected and what was found.
"""

from __future__ import annotations

from services.core.kube.pods import Pod
from services.core.kube.resource import (
    DeviceRequestAllocationResult,
    NodeSelector,
    NodeSelectorRequirement,
    ResourceClaim,
    ResourceClaimConsumerReference,
)
from services.core.model import nvidia
from services.core.model.schemas import ClaimRef

DRIVER = nvidia.DRIVER_NAME
# DeviceRequestAllocationResult.skipNodeOperations (Kubernetes 1.37, DRAOptionalNodeOperations).
SKIP_UNPREPARE = "NodeUnprepareResources"
SKIP_ALL = "*"


def identity(claim: ResourceClaim, ref: ClaimRef) -> str | None:
    """a: the claim found under the kubelet's namespace/name is the one it means."""
    if claim.metadata.uid != ref.uid:
        return (
            f"claim was replaced (the kubelet asked for uid {ref.uid}, "
            f"the claim now has uid {claim.metadata.uid})"
        )
    return None


def our_results(claim: ResourceClaim, driver: str = DRIVER) -> list[DeviceRequestAllocationResult]:
    """This driver's device results (other drivers' are theirs to prepare)."""
    allocation = claim.status.allocation if claim.status else None
    devices = allocation.devices if allocation else None
    return [r for r in (devices.results if devices else None) or [] if r.driver == driver]


def allocation(claim: ResourceClaim, node: str, driver: str = DRIVER) -> str | None:
    """b: allocated, our devices in this node's pool, the nodeSelector naming this node."""
    allocated = claim.status.allocation if claim.status else None
    if allocated is None:
        return "the claim is not allocated (status.allocation is empty)"
    results = our_results(claim, driver)
    if not results:
        return f"allocation has no devices of driver {driver} (empty request)"
    for r in results:
        if r.pool != node:
            return (
                f"device {r.device!r} (request {r.request!r}) is in pool {r.pool!r}, "
                f"not on this node {node!r}"
            )
    selector = allocated.node_selector
    if selector is not None and not selects(selector, node):
        return (
            f"the allocation's nodeSelector does not select this node {node!r} "
            f"(it selects {describe_selector(selector)})"
        )
    return never_unprepared(results, driver)


def never_unprepared(results: list[DeviceRequestAllocationResult], driver: str) -> str | None:
    """Why a prepare would never be undone: every result of ours skips NodeUnprepareResources.

    The kubelet (1.37, DRAOptionalNodeOperations) leaves out a driver's
    NodeUnprepareResources when each of its results in the claim names that
    operation or ``*`` in ``skipNodeOperations`` (copied from the device's slice).
    gpudra's slices never do: every device it prepares leaves a CDI spec, a hold
    on the device and possibly a MIG device, an MPS daemon or a vfio-pci binding
    that only unprepare takes back, so such results come from a slice gpudra did not
    write, and preparing them would hold the devices forever. A result that skips
    only some operations, or a claim where some result of ours skips none, is
    prepared as any other (the kubelet asks for it, and unprepares it).
    """
    skipping = [
        r
        for r in results
        if SKIP_UNPREPARE in (r.skip_node_operations or [])
        or SKIP_ALL in (r.skip_node_operations or [])
    ]
    if not results or len(skipping) < len(results):
        return None
    named = ", ".join(f"{r.device!r} {r.skip_node_operations}" for r in skipping)
    return (
        f"every device of driver {driver} in the allocation skips NodeUnprepareResources "
        f"(skipNodeOperations: {named}), so the kubelet would never unprepare it; "
        f"{driver}'s slices never say that (each of its devices needs unprepare to take "
        "back its CDI spec and hold): the slice that published them was written or changed "
        "by someone else"
    )


def selects(selector: NodeSelector, node: str) -> bool:
    """Some term names this node: its ``metadata.name`` field requirements all hold for
    ``node`` and one of them is ``In`` with ``node`` among the values.

    The scheduler writes exactly such a term for devices of a node-local slice (ours
    always are). Label expressions are not evaluated: the preparer reads no Node
    object, and labels may have changed since the scheduler matched them.
    """
    for term in selector.node_selector_terms:
        names = [r for r in term.match_fields or [] if r.key == "metadata.name"]
        if names and all(_holds(r, node) for r in names) and any(r.operator == "In" for r in names):
            return True
    return False


def _holds(req: NodeSelectorRequirement, node: str) -> bool:
    values = req.values or []
    if req.operator == "In":
        return node in values
    if req.operator == "NotIn":
        return node not in values
    return req.operator == "Exists"


def describe_selector(selector: NodeSelector) -> str:
    terms = []
    for term in selector.node_selector_terms:
        reqs = [*(term.match_fields or []), *(term.match_expressions or [])]
        terms.append(" and ".join(f"{r.key} {r.operator} {r.values or []}" for r in reqs) or "{}")
    return " or ".join(terms) or "no term"


def reserving_pods(claim: ResourceClaim) -> list[ResourceClaimConsumerReference]:
    """The pods in status.reservedFor (core group, resource ``pods``)."""
    consumers = (claim.status.reserved_for if claim.status else None) or []
    return [c for c in consumers if c.resource == "pods" and not c.api_group]


def pod_mismatch(
    pod: Pod | None, consumer: ResourceClaimConsumerReference, namespace: str, node: str
) -> str | None:
    """c, for one reservation: why this pod does not make the claim usable here."""
    who = f"pod {namespace}/{consumer.name}"
    if pod is None:
        return f"{who}: not found"
    if pod.metadata.uid != consumer.uid:
        return f"{who}: uid is {pod.metadata.uid}, the reservation names {consumer.uid}"
    if pod.spec.node_name != node:
        where = f"node {pod.spec.node_name!r}" if pod.spec.node_name else "no node (unscheduled)"
        return f"{who}: runs on {where}, not on this node {node!r}"
    if pod.terminal():
        return f"{who}: has finished (phase {pod.status.phase if pod.status else ''})"
    return None


def not_reserved(claim: ResourceClaim) -> str:
    """The reason for a claim whose status.reservedFor names no pod."""
    others = (claim.status.reserved_for if claim.status else None) or []
    if not others:
        return "the claim is not reserved for any pod (status.reservedFor is empty)"
    names = ", ".join(f"{c.resource}/{c.name}" for c in others)
    return f"the claim is reserved for no pod (status.reservedFor names only {names})"


def running_here(pod: Pod | None, consumer: ResourceClaimConsumerReference) -> bool:
    """The reserving pod still looks alive on this node to the API server: not finished,
    not being deleted. (Not proof that its containers run: see Engine.unprepare.)"""
    return (
        pod is not None
        and pod.metadata.uid == consumer.uid
        and not pod.terminal()
        and pod.metadata.deletion_timestamp is None
    )
