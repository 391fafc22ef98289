"""Allocate claims from files, one after another, the way ``gpudra allocate`` reports them.

Claims that already carry ``status.allocation`` are in use from the start. The
others are allocated in input order, each seeing the ones before it. With a
node, only that node is tried; without, every node the inputs name, in name
order, and the first that fits wins. Because allocations only ever add load,
a claim shape that did not fit a node never fits it later: such (shape, node)
pairs are remembered and skipped, which keeps large what-if runs fast. When
allocations go (:meth:`OfflineAllocator.use`), only the nodes that could see a
freed device forget theirs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import msgspec

from services.allocator.structured import taintrules
from services.allocator.structured.engine import Engine
from services.allocator.structured.errors import AllocationError, claim_label
from services.allocator.structured.explain import (
    Cause,
    Explainer,
    Explanation,
    error_explanation,
)
from services.allocator.structured.features import Features
from services.allocator.structured.pools import Node
from services.allocator.structured.requests import alternatives
from services.allocator.structured.search import allocate
from services.allocator.structured.state import AllocatedState
from services.core.kube.resource import (
    AllocationResult,
    DeviceClass,
    DeviceTaintRule,
    ResourceClaim,
    ResourceSlice,
    to_builtins,
)

HOSTNAME_LABEL = "kubernetes.io/hostname"

Status = Literal["allocated", "unschedulable", "error"]


@dataclass(slots=True)
class Inputs:
    classes: dict[str, DeviceClass] = field(default_factory=dict)
    slices: list[ResourceSlice] = field(default_factory=list)
    claims: list[ResourceClaim] = field(default_factory=list)
    nodes: dict[str, Node] = field(default_factory=dict)
    taint_rules: list[DeviceTaintRule] = field(default_factory=list)

    def node_names(self) -> list[str]:
        """Every node the inputs mention (Node objects and slice/device node names), sorted."""
        names = set(self.nodes)
        for slice_ in self.slices:
            if slice_.spec.node_name:
                names.add(slice_.spec.node_name)
            for device in slice_.spec.devices or []:
                if device.node_name:
                    names.add(device.node_name)
        return sorted(names)

    def node(self, name: str) -> Node:
        """A Node object as given, or a node known only by name with the
        ``kubernetes.io/hostname`` label its kubelet would give it."""
        return self.nodes.get(name) or Node(name, {HOSTNAME_LABEL: name})


@dataclass(slots=True)
class ClaimOutcome:
    claim: ResourceClaim
    status: Status
    node: str | None = None
    allocation: AllocationResult | None = None
    error: str | None = None
    explanation: Explanation | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.claim.metadata.namespace or "default",
            "name": self.claim.metadata.name,
            "status": self.status,
            "node": self.node,
            "allocation": to_builtins(self.allocation) if self.allocation else None,
            "error": self.error,
            "explanation": asdict(self.explanation) if self.explanation else None,
        }


STUDIES = 8  # claim shapes whose explanations are kept node by node (~2 KB a node each)
LOG_KEPT = 4096  # node changes logged beyond four per node before the log starts again


@dataclass(slots=True)
class _Study:
    """One claim shape's explanation over one node list, kept as each node's part and
    their sum. Explanation messages name the requests, never the claim, so claims of
    the same shape share it; a watcher explaining the same few templates over 5,000
    nodes classifies only the nodes whose devices' use changed."""

    nodes: list[Node | None]
    total: Explainer
    parts: dict[str | None, tuple[int, Explainer]] = field(default_factory=dict)
    seen: int = -1  # the change log's length when every part was up to date (-1: never)


class OfflineAllocator:
    def __init__(self, inputs: Inputs, features: Features, explain: bool = True) -> None:
        self.inputs = inputs
        self.features = features
        self.explain = explain
        state = AllocatedState()
        for claim in inputs.claims:
            if claim.status and claim.status.allocation:
                state.add(claim.status.allocation, features.consumable_capacity)
        origins: dict[int, str] = {}
        slices = taintrules.apply(inputs.slices, inputs.taint_rules, features, origins)
        self.engine = Engine(inputs.classes, slices, features, state)
        self.engine.taint_origins = origins
        # (shape, node) -> the node's epoch when the shape did not fit there; a node's
        # epoch moves on when a device it sees is freed (use).
        self._misfits: dict[tuple[bytes, str | None], int] = {}
        self._epochs: dict[str | None, int] = {}
        # A node's other epoch moves on with any change in the use of a device it sees:
        # what an explanation kept of that node (_Study) is made again.
        self._changes: dict[str | None, int] = {}
        self._studies: dict[bytes, _Study] = {}  # by claim shape, the most recent last
        # Every move of a node's _changes epoch, in order (which also moves with
        # _epochs): a shape that fitted no node, or a study, looks again only at the
        # nodes logged since, not at every node (5,000 epoch checks were 3.4 ms).
        self._log: list[str | None] = []
        # Per claim shape that fitted none of a node list: that list, and the log's
        # length when that was found.
        self._settled: dict[bytes, tuple[list[Node | None], int]] = {}
        self._index: tuple[list[Node | None], dict[str | None, int]] = ([], {})
        # Every claim shape allocated or explained here: what is kept grows with them
        # (misfits, selector results), so a long-lived owner starts over past a bound.
        self.shapes: set[bytes] = set()
        # Per claim shape: the node list it was last tried on and how many of its
        # first nodes are known misfits, so a long run skips full nodes at once.
        self._frontier: dict[bytes, tuple[list[Node | None], int]] = {}

    def nodes(self, only: str | None) -> list[Node | None]:
        if only is not None:
            return [self.inputs.node(only)]
        names = self.inputs.node_names()
        return [self.inputs.node(n) for n in names] if names else [None]

    def run(self, only_node: str | None = None) -> list[ClaimOutcome]:
        nodes = self.nodes(only_node)
        return [
            self.allocate(claim, nodes)
            for claim in self.inputs.claims
            if not (claim.status and claim.status.allocation)
        ]

    def add(self, allocation: AllocationResult) -> None:
        """Another claim's allocation is now in use (what did not fit still does not)."""
        self.engine.commit(allocation)
        self._touch([allocation], self._changes)

    def use(
        self,
        allocations: Iterable[AllocationResult],
        freed: list[AllocationResult],
        added: list[AllocationResult],
    ) -> None:
        """The allocations in use are now ``allocations``: ``freed`` went, ``added`` came.

        The state starts over from ``allocations`` while the engine's per-device
        caches stay; nodes that could see a freed device try again every shape
        that did not fit them.
        """
        state = AllocatedState()
        for allocation in allocations:
            state.add(allocation, self.features.consumable_capacity)
        self.engine.use_state(state)
        self.moved(freed, added)

    def moved(self, freed: list[AllocationResult], added: list[AllocationResult]) -> None:
        """Allocations went and came (the state already says so): nodes that could see a
        freed device try again every shape that did not fit them, and nodes that see
        either are classified again in explanations."""
        self._touch(freed, self._epochs)
        self._touch(freed + added, self._changes)
        self._frontier.clear()

    def carry(self, old: OfflineAllocator, changed: set[str | None]) -> None:
        """Keep what ``old`` (built from the same classes, nodes and taint rules, over the
        same node list) learnt of every node but ``changed``, whose slices changed: the
        shapes that did not fit them and their parts of each explanation."""
        self.engine.seen_as_in(old.engine)
        self._misfits, self._epochs = old._misfits, old._epochs
        self._changes, self._studies = old._changes, old._studies
        self._log, self._settled, self._index = old._log, old._settled, old._index
        self.shapes = old.shapes
        for name in changed:
            self._epochs[name] = self._epochs.get(name, 0) + 1
        self._moved_on(changed)
        for study in self._studies.values():
            study.total.engine = self.engine  # parts of changed nodes are made again here

    def _touch(self, allocations: list[AllocationResult], epochs: dict[str | None, int]) -> None:
        """Move on the epoch of every node that sees a device of ``allocations``."""
        pools = {
            (r.driver, r.pool)
            for allocation in allocations
            for r in (allocation.devices.results if allocation.devices else None) or []
        }
        names = self.engine.nodes_seeing(pools)
        if epochs is self._changes:
            self._moved_on(names)
            return
        for name in names:
            epochs[name] = epochs.get(name, 0) + 1

    def _moved_on(self, names: Iterable[str | None]) -> None:
        """Move on the _changes epoch of ``names`` and log them; a log grown past the
        nodes several times over starts again (everything is looked at once more)."""
        for name in names:
            self._changes[name] = self._changes.get(name, 0) + 1
            self._log.append(name)
        if len(self._log) > LOG_KEPT + 4 * len(self._index[1]):
            self._log.clear()
            self._settled.clear()
            for study in self._studies.values():
                study.seen = -1

    def _since(self, nodes: list[Node | None], seen: int) -> list[int]:
        """Indexes in ``nodes`` of the nodes logged since the log was ``seen`` long."""
        known, index = self._index
        if known is not nodes:
            index = {(n.name if n else None): i for i, n in enumerate(nodes)}
            self._index = (nodes, index)
        return sorted({index[name] for name in self._log[seen:] if name in index})

    def allocate(
        self, claim: ResourceClaim, nodes: list[Node | None], commit: bool = True
    ) -> ClaimOutcome:
        """``claim`` on the first of ``nodes`` where it fits; with ``commit`` its devices
        are in use from then on (what-if runs), without it nothing is kept (explanations).
        """
        blocked = self.precheck(claim)
        if blocked is not None:
            outcome = ClaimOutcome(claim, "unschedulable")
            if self.explain:
                outcome.explanation = Explanation(nodes=0, claim=[blocked])
            return outcome
        shape = msgspec.json.encode(claim.spec)
        self.shapes.add(shape)
        settled, seen = self._settled.get(shape, (None, 0))
        known, skip = self._frontier.get(shape, (nodes, 0))
        if known is not nodes:
            skip = 0
        if settled is nodes:  # it fitted no node then: only those logged since may differ
            tried: Iterable[int] = self._since(nodes, seen)
        else:
            tried = range(skip, len(nodes))
        logged = len(self._log)
        for index in tried:
            node = nodes[index]
            name = node.name if node else None
            key = (shape, name)
            if self._misfits.get(key, -1) == self._epochs.get(name, 0):
                if index == skip:
                    skip += 1
                continue
            try:
                allocation = allocate(self.engine, claim, node)
            except AllocationError as exc:
                outcome = ClaimOutcome(claim, "error", error=str(exc))
                if self.explain:
                    outcome.explanation = error_explanation(self.engine, claim, str(exc), node)
                return outcome
            if allocation is not None:
                self._frontier[shape] = (nodes, skip)
                if commit:
                    self.add(allocation)
                return ClaimOutcome(claim, "allocated", node=name, allocation=allocation)
            self._misfits[key] = self._epochs.get(name, 0)
            if index == skip:
                skip += 1
        self._frontier[shape] = (nodes, skip)
        self._settled[shape] = (nodes, logged)
        outcome = ClaimOutcome(claim, "unschedulable")
        if self.explain:
            outcome.explanation = self._explained(claim, shape, nodes)
        return outcome

    def _explained(
        self, claim: ResourceClaim, shape: bytes, nodes: list[Node | None]
    ) -> Explanation:
        """Why ``claim`` fits none of ``nodes``: the shape's study brought up to date,
        each node classified again only when the use of a device it sees changed."""
        study = self._studies.pop(shape, None)
        if study is None or study.nodes is not nodes:
            study = _Study(nodes, Explainer(self.engine, claim))
        self._studies[shape] = study
        if len(self._studies) > STUDIES:
            del self._studies[next(iter(self._studies))]
        total = study.total
        looked = range(len(nodes)) if study.seen < 0 else self._since(nodes, study.seen)
        for index in looked:  # every node was tried (or known not to fit)
            node = nodes[index]
            name = node.name if node else None
            epoch = self._changes.get(name, 0)
            held = study.parts.get(name)
            if held is not None and held[0] == epoch:
                continue
            part = total.part(node)
            if held is not None:
                total.merge(held[1], -1)
            total.merge(part)
            study.parts[name] = (epoch, part)
        study.seen = len(self._log)
        return total.explanation()

    def precheck(self, claim: ResourceClaim) -> Cause | None:
        """kube-scheduler's PreFilter: what keeps the pod waiting before any node is tried.

        A missing DeviceClass (it may still be created), subrequests with
        DRAPrioritizedList off, or a claim being deleted make the claim
        unschedulable, not an error.
        """
        label = claim_label(claim)
        if claim.metadata.deletion_timestamp:
            return Cause("claim-deleting", 1, f"resourceclaim {label} is being deleted")
        for request in (claim.spec.devices.requests if claim.spec.devices else None) or []:
            if request.first_available and not self.features.prioritized_list:
                return Cause(
                    "prioritized-list-disabled",
                    1,
                    f"resource claim {label}, request {request.name}: has subrequests, "
                    "but the DRAPrioritizedList feature is disabled",
                )
            for spec in alternatives(request):
                if spec.class_name and spec.class_name not in self.engine.classes:
                    missing = f"device class {spec.class_name} does not exist"
                    return Cause("class-missing", 1, f"request {spec.result_name}: {missing}")
        return None


def describe(outcome: ClaimOutcome) -> list[str]:
    """The outcome for people: a headline, then one line per cause."""
    label = claim_label(outcome.claim)
    if outcome.status == "allocated":
        devices = outcome.allocation.devices if outcome.allocation else None
        names = ", ".join(
            f"{r.request}={r.pool}/{r.device}" for r in (devices.results if devices else None) or []
        )
        where = f" on {outcome.node}" if outcome.node else ""
        return [f"{label}: allocated{where}: {names}"]
    head = f"{label}: {outcome.status}" + (f": {outcome.error}" if outcome.error else "")
    lines = [head]
    if outcome.explanation:
        lines += ["  " + line for line in outcome.explanation.lines()]
    return lines
