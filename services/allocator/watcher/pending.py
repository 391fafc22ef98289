"""Claims stuck pending: which ones, and why, from the watcher's caches.

A claim is *waiting* when it is not allocated, nobody has reserved it, and an
unscheduled pod that uses it (``spec.resourceClaims`` by name, or a claim
generated from a template and named in ``status.resourceClaimStatuses``) has
existed longer than the threshold. Only claims that concern our driver are
considered: a request names a DeviceClass whose selectors mention
``gpu.nvidia.com``, or a DeviceClass that does not exist.

To say why, our allocation engine runs over the cluster as the caches see it
(DeviceClasses, ResourceSlices, Nodes, DeviceTaintRules, and the claims already allocated) and
tries every node in name order, exactly as ``gpudra allocate`` does offline.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

import msgspec

from services.allocator.structured.features import Features
from services.allocator.structured.pools import Node
from services.allocator.structured.requests import alternatives
from services.allocator.structured.snapshot import ClaimOutcome, Inputs, OfflineAllocator
from services.allocator.watcher.extended import extended_claim
from services.allocator.watcher.kubeobjects import NodeObject, Pod
from services.allocator.watcher.lifecycle import DRIVER
from services.core.kube.resource import (
    AllocationResult,
    DeviceClass,
    DeviceTaintRule,
    ResourceClaim,
    ResourceSlice,
)

EVENT_MESSAGE_LIMIT = 1024  # bytes: core/v1 Event message limit (NoteLengthLimit)
REUSE_S = 60.0  # longest a claim's "no node fits" is told again without running the engine
# Claim shapes one engine may learn before the next explanation builds it afresh: it
# keeps, per shape, which nodes it did not fit and its selectors' result per device
# (about 100 bytes each: some 100 MB at 32 shapes over 5,000 nodes of 8 GPUs).
SHAPES_KEPT = 32


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 API timestamp as Unix time; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# The driver's name as a CEL string literal, in either quote style.
_NAMES_DRIVER = re.compile(rf"""(["']){re.escape(DRIVER)}\1""")


def concerns_driver(claim: ResourceClaim, classes: Mapping[str, DeviceClass]) -> bool:
    for request in (claim.spec.devices.requests if claim.spec.devices else None) or []:
        for spec in alternatives(request):
            device_class = classes.get(spec.class_name)
            if device_class is None:
                return True
            for selector in device_class.spec.selectors or []:
                if selector.cel and _NAMES_DRIVER.search(selector.cel.expression):
                    return True
    return False


def is_unallocated(claim: ResourceClaim) -> bool:
    status = claim.status
    return status is None or (status.allocation is None and not status.reserved_for)


@dataclass(frozen=True, slots=True)
class Waiting:
    claim: ResourceClaim
    pod: Pod
    waited: float  # seconds


class PodClock:
    """How long each unscheduled pod has waited: since its creation, or since we first
    saw it if that is earlier (a clock behind the API server's never makes it negative)."""

    def __init__(self) -> None:
        self.first_seen: dict[str, float] = {}

    def since(self, pod: Pod, now: float) -> float:
        uid = pod.metadata.uid or f"{pod.metadata.namespace}/{pod.metadata.name}"
        seen = self.first_seen.setdefault(uid, now)
        created = parse_time(pod.metadata.creation_timestamp)
        start = min(seen, created) if created is not None else seen
        return now - start

    def forget_except(self, uids: set[str]) -> None:
        for uid in set(self.first_seen) - uids:
            del self.first_seen[uid]


def waiting_claims(
    pods: Iterable[Pod],
    claims: Mapping[str, ResourceClaim],
    classes: Mapping[str, DeviceClass],
    clock: PodClock,
    threshold: float,
    now: float | None = None,
) -> list[Waiting]:
    """Claims (once each) whose unscheduled pod has waited at least ``threshold`` seconds."""
    now = time.time() if now is None else now
    found: dict[str, Waiting] = {}
    live: set[str] = set()
    for pod in pods:
        if pod.spec.node_name or pod.metadata.deletion_timestamp:
            continue
        live.add(pod.metadata.uid or f"{pod.metadata.namespace}/{pod.metadata.name}")
        waited = clock.since(pod, now)
        if waited < threshold:
            continue
        for name in pod.claim_names():
            claim = claims.get(f"{pod.metadata.namespace}/{name}")
            if claim is None or not claim.metadata.uid or claim.metadata.uid in found:
                continue
            if is_unallocated(claim) and concerns_driver(claim, classes):
                found[claim.metadata.uid] = Waiting(claim, pod, waited)
    clock.forget_except(live)
    return list(found.values())


def waiting_extended(
    pods: Iterable[Pod],
    classes: Mapping[str, DeviceClass],
    clock: PodClock,
    threshold: float,
    now: float | None = None,
) -> list[Waiting]:
    """Unscheduled pods waiting at least ``threshold`` seconds for extended resources
    our driver serves (``nvidia.com/gpu``), each with the claim the scheduler would
    create for it (it creates none until it has found the devices)."""
    now = time.time() if now is None else now
    found = []
    for pod in pods:
        if pod.spec.node_name or pod.metadata.deletion_timestamp or not pod.metadata.uid:
            continue
        if pod.status is not None and pod.status.extended_resource_claim_status is not None:
            continue  # the scheduler made its claim: explained as any claim
        claim = extended_claim(pod, classes)
        if claim is None or not concerns_driver(claim, classes):
            continue
        waited = clock.since(pod, now)
        if waited >= threshold:
            found.append(Waiting(claim, pod, waited))
    return found


class ClusterAllocator:
    """Our engine over a snapshot of the caches, kept while the devices stay the same.

    The engine (slices indexed by node, each node's candidates, selector results per
    device) is built once per version of the devices: classes, slices, nodes, taint
    rules. Allocations change with every scheduled or deleted claim; they are applied
    to the kept engine instead of rebuilding it (bench/scale.py: the rebuild was 27 ms
    of each 46 ms explanation at 5,000 nodes). When only slices changed, the new
    engine keeps what the old one learnt of the nodes whose slices did not
    (OfflineAllocator.carry). :meth:`update` and :meth:`explain` take turns (the
    watcher awaits each explanation before the next update).
    """

    def __init__(self, features: Features) -> None:
        self.features = features
        self._others: object = None
        self._slices_version: object = None
        self._allocations: object = None
        self._allocator: OfflineAllocator | None = None
        self._nodes: list[Node | None] = []
        self._slices: dict[str, ResourceSlice] = {}  # by name, as the engine has them
        self._in_use: dict[str, AllocationResult] = {}  # claim uid -> its allocation

    def update(
        self,
        others: object,
        slices_version: object,
        allocations: object,
        classes: Iterable[DeviceClass],
        slices: Iterable[ResourceSlice],
        claims: Iterable[ResourceClaim],
        nodes: Iterable[NodeObject],
        taint_rules: Iterable[DeviceTaintRule] = (),
    ) -> None:
        """Take a snapshot (call from the event loop: the caches change there).

        ``others`` (the classes', nodes' and taint rules' versions), ``slices_version``
        and ``allocations`` are versions: the engine is rebuilt from scratch when the
        first changes, rebuilt keeping what still holds when the second does, and
        follows the claims' allocations when only the third does.
        """
        old = self._allocator
        if old is not None and len(old.shapes) > SHAPES_KEPT:
            old = self._allocator = None  # what it keeps grows with the shapes: start over
        if old is not None and others == self._others:
            if slices_version == self._slices_version:
                if allocations != self._allocations:
                    self._follow(claims)
                    self._allocations = allocations
                return
        else:
            old = None
        now = {s.metadata.name: s for s in slices}
        changed = _changed_nodes(self._slices, now, old) if old is not None else None
        allocated = [c for c in claims if c.status and c.status.allocation]  # read once
        before, self._in_use = self._in_use, _in_use(allocated)
        inputs = Inputs(
            classes={c.metadata.name: c for c in classes},
            slices=list(now.values()),
            claims=allocated,
            nodes={
                n.metadata.name: Node(
                    n.metadata.name, dict(n.metadata.labels or {}), n.declared_features
                )
                for n in nodes
            },
            taint_rules=list(taint_rules),
        )
        allocator = OfflineAllocator(inputs, self.features, explain=True)
        listed = allocator.nodes(None)
        if old is not None and changed is not None and _names(listed) == _names(self._nodes):
            allocator.carry(old, changed)
            allocator.moved(*_moved(before, self._in_use))
        else:
            self._nodes = listed
        self._allocator, self._slices = allocator, now
        self._others, self._slices_version, self._allocations = (
            others,
            slices_version,
            allocations,
        )

    def _follow(self, claims: Iterable[ResourceClaim]) -> None:
        """The kept engine, told which allocations appeared and which went."""
        assert self._allocator is not None
        now = _in_use(claims)
        freed, added = _moved(self._in_use, now)
        if freed:
            self._allocator.use(now.values(), freed, added)
        else:
            for allocation in added:
                self._allocator.add(allocation)
        self._in_use = now

    def explain(self, claim: ResourceClaim) -> ClaimOutcome:
        """Allocate ``claim`` on the snapshot (any thread); nothing is kept."""
        allocator = self._allocator
        if allocator is None:
            raise RuntimeError("ClusterAllocator.explain before update")
        return allocator.allocate(claim, self._nodes, commit=False)


def _changed_nodes(
    before: Mapping[str, ResourceSlice], now: Mapping[str, ResourceSlice], old: OfflineAllocator
) -> set[str | None] | None:
    """The nodes whose view the changed slices touch; None when one of them is not a
    node's own (every node sees it, or a selector decides)."""
    gone = [s for name, s in before.items() if now.get(name) is not s]
    came = [s for name, s in now.items() if before.get(name) is not s]
    nodes: set[str | None] = set()
    for slice_ in gone + came:
        node = slice_.spec.node_name
        if not node or slice_.spec.per_device_node_selection:
            return None
        nodes.add(node)
        nodes |= old.engine.nodes_seeing({(slice_.spec.driver, slice_.spec.pool.name)})
    return nodes


def _names(nodes: list[Node | None]) -> list[str | None]:
    return [n.name if n else None for n in nodes]


def _in_use(claims: Iterable[ResourceClaim]) -> dict[str, AllocationResult]:
    return {
        c.metadata.uid or f"{c.metadata.namespace}/{c.metadata.name}": c.status.allocation
        for c in claims
        if c.status and c.status.allocation
    }


def _moved(
    before: Mapping[str, AllocationResult], now: Mapping[str, AllocationResult]
) -> tuple[list[AllocationResult], list[AllocationResult]]:
    """The allocations that went, and those that came (a claim's changed one is both)."""
    freed = [a for uid, a in before.items() if not _same(now.get(uid), a)]
    added = [a for uid, a in now.items() if not _same(before.get(uid), a)]
    return freed, added


def _same(a: AllocationResult | None, b: AllocationResult | None) -> bool:
    return a is b or a == b


class Reuse:
    """Outcomes of claims that fit nowhere, by what decides them, to tell claims like them.

    Most pending claims in a large cluster come from a few templates: the same spec in
    the same namespace gets the same answer while the devices (classes, slices, nodes,
    taint rules) are the same. Running the engine over every node for each of them cost
    the whole cluster per claim (bench/scale.py: 175 ms per explanation at 1,000 nodes).
    Allocations are left out of the key, since every scheduled claim changes them: a
    reused "no node fits" is at most ``ttl`` seconds old (a claim that fits meanwhile is
    scheduled, and no longer explained). Outcomes that fit are never reused: the next
    claim like it may not fit where this one would.
    """

    def __init__(self, ttl: float = REUSE_S) -> None:
        self.ttl = ttl
        self._found: dict[bytes, tuple[object, float, ClaimOutcome]] = {}

    @staticmethod
    def _key(claim: ResourceClaim) -> bytes:
        return (claim.metadata.namespace or "").encode() + b"/" + msgspec.json.encode(claim.spec)

    def get(self, claim: ResourceClaim, devices: object, now: float) -> ClaimOutcome | None:
        found = self._found.get(self._key(claim))
        if found is None or found[0] != devices or now - found[1] > self.ttl:
            return None
        return found[2]

    def put(self, claim: ResourceClaim, devices: object, now: float, outcome: ClaimOutcome) -> None:
        if outcome.status == "allocated":
            return
        if len(self._found) >= 1024:  # a sweep now and then keeps only the fresh ones
            self._found = {k: v for k, v in self._found.items() if now - v[1] <= self.ttl}
        self._found[self._key(claim)] = (devices, now, outcome)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to write on the claim's Kubernetes Event."""

    reason: str
    type: str  # Normal or Warning
    message: str
    status: str


def verdict(outcome: ClaimOutcome) -> Verdict:
    if outcome.status == "allocated":
        results = (
            outcome.allocation.devices.results
            if outcome.allocation and outcome.allocation.devices
            else None
        )
        names = ", ".join(f"{r.pool}/{r.device}" for r in results or [])
        message = (
            f"gpudra allocator: the claim fits on node {outcome.node or '(any)'} ({names}); "
            "it is pending for a reason other than its devices"
        )
        return Verdict("AllocationExplained", "Normal", truncate(message), outcome.status)
    lines = outcome.explanation.lines() if outcome.explanation else []
    if outcome.status == "error":
        head = "gpudra allocator: allocation fails"
        if not lines:
            lines = [outcome.error or "unknown error"]
    else:
        nodes = outcome.explanation.nodes if outcome.explanation else 0
        head = f"gpudra allocator: no node can allocate the claim ({nodes} node(s) tried)"
    body = "; ".join(line.strip() for line in lines)
    return Verdict(
        "Unschedulable", "Warning", truncate(f"{head}: {body}" if body else head), outcome.status
    )


def truncate(message: str, limit: int = EVENT_MESSAGE_LIMIT) -> str:
    """At most ``limit`` UTF-8 bytes, ending in "..." when cut."""
    data = message.encode()
    if len(data) <= limit:
        return message
    return data[: limit - 3].decode(errors="ignore") + "..."
