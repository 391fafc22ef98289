"""The per-device rules of one request: the one place that says why a device is not taken.

The search (:mod:`.search`) asks them in kube-scheduler's order and stops at
the first :class:`Rejection`; the explainer (:mod:`.explain`) asks the same
rules in the same order and counts the rejections by cause. So a rule changes
in one place, and an explanation can never disagree with the decision it
explains. A selector's CEL error is a rejection here too: the search turns it
into an error that stops the claim, the explainer into a cause with a
"did you mean".
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Protocol

from services.allocator.cel.env import CelEnvironment
from services.allocator.cel.selector import CelError, Selector
from services.allocator.structured import capacity as cap
from services.allocator.structured.counters import Counters, GroupIntersection
from services.allocator.structured.features import Features
from services.allocator.structured.pools import Node, NodeSelectorError, Pool, node_matches
from services.allocator.structured.requests import RequestSpec
from services.allocator.structured.state import AllocatedState, DeviceID
from services.allocator.structured.variant import Variant
from services.allocator.structured.view import Candidate
from services.core.kube.resource import Device, DeviceClass, DeviceTaint, Toleration

OPTIONAL_NODE_OPERATIONS = "DRAOptionalNodeOperations"


class RulesEngine(Protocol):
    """What the rules read of the engine (:class:`.engine.Engine` is one), and nothing more.

    A protocol rather than the class, so that the rules depend neither on the engine
    nor on the search that asks them; they judge a device against the allocated state
    and never change it."""

    @property
    def features(self) -> Features: ...
    @property
    def variant(self) -> Variant: ...
    @property
    def state(self) -> AllocatedState: ...
    @property
    def env(self) -> CelEnvironment: ...
    @property
    def capacity_rules(self) -> cap.Rules: ...
    @property
    def taint_origins(self) -> Mapping[int, str]: ...

    def selector_matches(self, selector: Selector, candidate: Candidate) -> bool: ...
    def available_for(self, candidate: Candidate) -> Counters: ...
    def group_baseline(self, pool: Pool) -> Mapping[str, GroupIntersection]: ...


@dataclass(frozen=True, slots=True)
class Rejection:
    code: str  # stable cause, e.g. "class-selector-false"
    message: str  # for people, e.g. "DeviceClass gpu.nvidia.com selector is false: ..."
    cel_error: CelError | None = None  # a selector that could not be evaluated
    selector: Selector | None = None  # that selector, compiled (its references)
    search_error: str = ""  # how the search reports it when it must stop the claim


def taint_tolerated(taint: DeviceTaint, toleration: Toleration) -> bool:
    """resourceclaim.ToleratesTaint."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in (None, "", "Equal"):
        return (toleration.value or "") == (taint.value or "")
    return toleration.operator == "Exists"


def blocking_taint(device: Device, request: RequestSpec, every: bool = False) -> DeviceTaint | None:
    """The first NoSchedule/NoExecute taint the request does not tolerate (``every``: 1.34,
    a taint of any effect)."""
    for taint in device.taints or []:
        if (every or taint.effect in ("NoSchedule", "NoExecute")) and not any(
            taint_tolerated(taint, t) for t in request.tolerations
        ):
            return taint
    return None


class DeviceRules:
    """Whether one request may take one device, rule by rule."""

    def __init__(
        self,
        engine: RulesEngine,
        spec: RequestSpec,
        device_class: DeviceClass,
        node: Node | None,
        claim_label: str,
    ) -> None:
        self.engine = engine
        self.features = engine.features
        self.spec = spec
        self.device_class = device_class
        self.node = node
        self.claim_label = claim_label

    def in_use(self, candidate: Candidate, allocating: Set[DeviceID]) -> Rejection | None:
        """Taken by another claim (or, for adminAccess, already by this one)."""
        if candidate.id in allocating:
            return Rejection("already-allocated", "already allocated to this claim")
        if not self.spec.admin and candidate.id in self.engine.state.devices:
            return Rejection("already-allocated", "already allocated to another claim")
        return None

    def selectable(self, candidate: Candidate) -> Rejection | None:
        """isSelectable: binding conditions, class selectors, request selectors, the node."""
        device = candidate.device
        if not self.features.binding_conditions and device.binding_conditions:
            return Rejection("binding-conditions", "device needs binding conditions (gate off)")
        class_name = self.device_class.metadata.name
        for i, selector in enumerate(self.device_class.spec.selectors or []):
            expression = selector.cel.expression if selector.cel else ""
            found = self._selector(
                expression, i, candidate, f"DeviceClass {class_name}", "class-selector-false",
                f"class {class_name}",
            )  # fmt: skip
            if found is not None:
                return found
        for i, selector in enumerate(self.spec.selectors):
            expression = selector.cel.expression if selector.cel else ""
            found = self._selector(
                expression, i, candidate, f"request {self.spec.result_name}",
                "request-selector-false", f"claim {self.claim_label}",
            )  # fmt: skip
            if found is not None:
                return found
        if candidate.slice.spec.per_device_node_selection:
            try:
                if not node_matches(
                    self.node, device.node_name, device.all_nodes, device.node_selector
                ):
                    return Rejection("node-mismatch", "device is not available on this node")
            except NodeSelectorError as exc:
                return Rejection("node-selector-invalid", str(exc), search_error=str(exc))
        return None

    def _selector(
        self,
        expression: str,
        index: int,
        candidate: Candidate,
        owner: str,
        code: str,
        search_owner: str,
    ) -> Rejection | None:
        compiled = self.engine.env.compile(expression)
        try:
            if self.engine.selector_matches(compiled, candidate):
                return None
        except CelError as exc:
            if exc.kind == "compile":
                stop = f"{search_owner}: selector #{index}: CEL compile error: {exc.message}"
            elif self.engine.variant.cel_error_names_device:
                # 1.37: the device named, and cel.EnhanceRuntimeError's hint for "no such key".
                hint = ""
                if "no such key:" in exc.message:
                    hint = (
                        ". consider using CEL optional chaining (.? followed by orValue()) or "
                        "guarding the check with has() for optional fields"
                    )
                stop = (
                    f"{search_owner}: selector #{index} on device {'/'.join(candidate.id)}: "
                    f"CEL runtime error: {exc.message}{hint}"
                )
            else:
                stop = f"{search_owner}: selector #{index}: CEL runtime error: {exc.message}"
            message = f"{owner} selector: CEL error: {exc.message}"
            return Rejection("cel-error", message, exc, compiled, search_error=stop)
        return Rejection(code, f"{owner} selector is false: {expression}")

    def capacity(
        self, candidate: Candidate, allocating: cap.Consumed | None, static: bool = False
    ) -> Rejection | None:
        """Consumable capacity: what the request asks for still fits the device (``static``:
        fits the device's capacity alone). Raises cap.CapacityError (1.37: stops the claim)."""
        if not self.features.consumable_capacity:
            return None
        consumed = {} if static else self.engine.state.consumed.get(candidate.id, {})
        try:
            fits = cap.fits(
                consumed,
                self.spec.capacity,
                candidate.device.capacity or {},
                allocating,
                self.engine.capacity_rules,
            )
        except cap.UnknownCapacity:
            return Rejection("capacity-unknown", "device lacks a requested capacity")
        return None if fits else Rejection("capacity-exhausted", "not enough capacity left")

    def node_operations(self, candidate: Candidate) -> Rejection | None:
        """1.37 experimental: a slice that skips node operations (skipNodeOperations) needs
        DRAOptionalNodeOperations and a node that declares that feature."""
        variant = self.engine.variant
        skips = candidate.slice.spec.skip_node_operations
        if not skips or variant.channel != "experimental" or variant.minor < 37:
            return None
        if not self.features.optional_node_operations:
            return Rejection(
                "node-operations-disabled",
                f"its slice skips node operations ({', '.join(skips)}) but "
                "DRAOptionalNodeOperations is off",
            )
        declared = self.node.declared_features if self.node is not None else frozenset()
        if OPTIONAL_NODE_OPERATIONS not in declared:
            return Rejection(
                "node-operations-undeclared",
                f"its slice skips node operations ({', '.join(skips)}) and the node does not "
                f"declare {OPTIONAL_NODE_OPERATIONS} (status.declaredFeatures)",
            )
        return None

    def partitionable(self, candidate: Candidate) -> Rejection | None:
        if candidate.device.consumes_counters and not self.features.partitionable_devices:
            return Rejection(
                "partitionable-disabled",
                "device consumes counters but DRAPartitionableDevices is off",
            )
        return None

    def counters(self, candidate: Candidate, used: Counters) -> Rejection | None:
        """The pool's counters, less what is allocated and ``used`` here, cover the device.

        As upstream, every counter of the pool is checked, not only the device's
        own: a pool already over its counters takes nothing more.
        """
        available = self.engine.available_for(candidate)
        adds: dict[tuple[str, str], int] = {}
        for set_name, name, value in candidate.counters:
            adds[(set_name, name)] = adds.get((set_name, name), 0) + value
        for set_name, counters in available.items():
            taken = used.get(set_name, {})
            for name, value in counters.items():
                if value < taken.get(name, 0) + adds.get((set_name, name), 0):
                    message = f"counter {name} of counter set {set_name} is exhausted"
                    return Rejection("counters-exhausted", message)
        return None

    def taint(self, candidate: Candidate) -> Rejection | None:
        if not self.features.device_taints:
            return None
        taint = blocking_taint(candidate.device, self.spec, self.engine.variant.every_taint_blocks)
        if taint is None:
            return None
        shown = f"{taint.key}={taint.value}" if taint.value else taint.key
        rule = self.engine.taint_origins.get(id(taint))
        origin = f" (from DeviceTaintRule {rule})" if rule else ""
        return Rejection("tainted", f"taint {shown}:{taint.effect}{origin} not tolerated")

    def first(self, candidate: Candidate) -> Rejection | None:
        """The first rule that rejects the device for this request alone (the explainer's view)."""
        return (
            self.in_use(candidate, frozenset())
            or self.selectable(candidate)
            or self._capacity_for_explanation(candidate)
            or self.node_operations(candidate)
            or self.partitionable(candidate)
            or self.compatibility(candidate)
            or (self.counters(candidate, {}) if candidate.device.consumes_counters else None)
            or self.taint(candidate)
        )

    def _capacity_for_explanation(self, candidate: Candidate) -> Rejection | None:
        try:
            return self.capacity(candidate, None)
        except cap.CapacityError as exc:
            return Rejection("capacity-error", str(exc), search_error=str(exc))

    def compatibility(self, candidate: Candidate) -> Rejection | None:
        """1.37 (DRADeviceCompatibilityGroups): the device's compatibility groups share
        none with those of the allocated devices drawing on the same counter set."""
        variant = self.engine.variant
        if not (
            self.features.compatibility_groups
            and variant.channel == "experimental"
            and candidate.device.consumes_counters
        ):
            return None
        baseline = self.engine.group_baseline(candidate.pool)
        for consumption in candidate.device.consumes_counters or []:
            current = baseline.get(consumption.counter_set)
            groups = frozenset(consumption.compatibility_groups or ())
            if current is not None and not current.admits(groups):
                mine = ", ".join(sorted(groups)) or "none"
                theirs = ", ".join(sorted(current.groups)) or "none"
                return Rejection(
                    "compatibility-groups",
                    f"compatibility groups [{mine}] do not fit [{theirs}] of the allocated "
                    f"devices on counter set {consumption.counter_set}",
                )
        return None
