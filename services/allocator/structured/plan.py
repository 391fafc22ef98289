"""A claim checked and resolved before the search: each request's alternatives with
their class, rules and device count, the claim's constraints, and the errors
that stop the claim before any device is tried (upstream's Allocate up to the
search, in its order, so the first error is the one kube-scheduler reports).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.allocator.structured import capacity as cap
from services.allocator.structured.constraints import Constraint, DistinctAttribute, MatchAttribute
from services.allocator.structured.engine import Engine
from services.allocator.structured.errors import AllocationError, claim_label
from services.allocator.structured.requests import ALL, EXACT_COUNT, RequestSpec, alternatives
from services.allocator.structured.rules import DeviceRules
from services.allocator.structured.view import Candidate, NodeView
from services.core.kube.resource import DeviceClass, ResourceClaim

MAX_DEVICES = 32  # resourceapi.AllocationResultsMaxSize


@dataclass(slots=True)
class RequestData:
    """One request or subrequest as the search takes it."""

    spec: RequestSpec
    device_class: DeviceClass
    rules: DeviceRules
    num_devices: int
    all_devices: list[Candidate] = field(default_factory=list)
    has_subrequests: bool = False

    def selectable(self, candidate: Candidate) -> bool:
        """isSelectable; a selector that cannot be evaluated stops the claim."""
        rejection = self.rules.selectable(candidate)
        if rejection is None:
            return True
        if rejection.search_error:
            raise AllocationError(rejection.search_error)
        return False


class Plan:
    """The claim's requests (``data``, keyed by request and subrequest index) and
    constraints; building it raises :class:`AllocationError` where upstream stops."""

    def __init__(self, engine: Engine, claim: ResourceClaim, view: NodeView) -> None:
        self.engine = engine
        self.features = engine.features
        self.variant = engine.variant
        self.claim = claim
        self.label = claim_label(claim)
        self.view = view
        self.requests = (claim.spec.devices.requests if claim.spec.devices else None) or []
        self.data: dict[tuple[int, int], RequestData] = {}
        self.constraints: list[Constraint] = []
        self._requests()
        self._constraints()

    def _requests(self) -> None:
        minimum = 0
        for ri, request in enumerate(self.requests):
            if request.first_available and not self.features.prioritized_list:
                raise AllocationError(
                    f"claim {self.label}, request {request.name}: has subrequests, "
                    "but the DRAPrioritizedList feature is disabled"
                )
            specs = alternatives(request)
            counts = []
            for si, spec in enumerate(specs):
                data = self._validate(spec)
                data.has_subrequests = bool(request.first_available)
                self.data[(ri, si)] = data
                counts.append(data.num_devices)
            fewest = min(counts)
            if self.variant.per_request_limit_message and fewest > MAX_DEVICES - minimum:
                raise AllocationError(
                    f"claim {self.label}, request {request.name}: adding {fewest} devices "
                    f"exceeds the claim limit of {MAX_DEVICES}, with {minimum} already "
                    "accounted for"
                )
            minimum += fewest
        if minimum > MAX_DEVICES:
            raise AllocationError(
                f"claim {self.label}: number of requested devices {minimum} exceeds "
                f"the claim limit of {MAX_DEVICES}"
            )

    def _constraints(self) -> None:
        devices = self.claim.spec.devices
        sets = self.variant.list_constraints and self.features.list_type_attributes
        for i, constraint in enumerate((devices.constraints if devices else None) or []):
            if constraint.match_attribute is not None:
                self.constraints.append(
                    MatchAttribute(constraint.match_attribute, constraint.requests, sets)
                )
            elif constraint.distinct_attribute is not None and self.variant.distinct_constraints:
                self.constraints.append(
                    DistinctAttribute(
                        constraint.distinct_attribute,
                        constraint.requests,
                        sets,
                        per_request=self.variant.distinct_per_request,
                    )
                )
            else:
                raise AllocationError(
                    f"claim {self.label}, constraint #{i}: empty constraint "
                    "(unsupported constraint type?)"
                )

    def _validate(self, spec: RequestSpec) -> RequestData:
        if spec.derived_attributes and (
            self.variant.channel != "experimental" or not self.features.derived_attributes
        ):
            # 1.37: a request with derived attributes is refused unless the allocator
            # knows them (before 1.37 the field does not exist).
            raise AllocationError(
                f"claim {self.label}, request {spec.name}: cannot handle request with derived "
                "attributes, the feature is disabled"
            )
        for i, selector in enumerate(spec.selectors):
            if selector.cel is None:
                raise AllocationError(
                    f"claim {self.label}, request {spec.name}, selector #{i}: "
                    "CEL expression empty (unsupported selector type?)"
                )
        if not self.features.admin_access and spec.admin_access is not None:
            raise AllocationError(
                f"claim {self.label}, request {spec.name}: admin access is requested, "
                "but the feature is disabled"
            )
        if not spec.class_name:
            raise AllocationError(
                f"claim {self.label}, request {spec.name}: missing device class name "
                "(unsupported request type?)"
            )
        device_class = self.engine.classes.get(spec.class_name)
        if device_class is None:
            raise AllocationError(
                f"claim {self.label}, request {spec.name}: could not retrieve device class "
                f'{spec.class_name}: deviceclass.resource.k8s.io "{spec.class_name}" not found'
            )
        rules = DeviceRules(self.engine, spec, device_class, self.view.node, self.label)
        data = RequestData(spec, device_class, rules, 0)
        if spec.mode == EXACT_COUNT:
            data.num_devices = spec.count
        elif spec.mode == ALL:
            data.all_devices = self._all_devices(data)
            data.num_devices = len(data.all_devices)
        else:
            raise AllocationError(
                f"claim {self.label}, request {spec.name}: unsupported count mode {spec.mode}"
            )
        return data

    def _all_devices(self, data: RequestData) -> list[Candidate]:
        for pool in self.view.pools:
            if pool.incomplete:
                raise AllocationError(
                    f"claim {self.label}, request {data.spec.name}: asks for all devices, "
                    f"but resource pool {pool.label()} is currently being updated"
                )
            if pool.invalid is not None:
                raise AllocationError(
                    f"claim {self.label}, request {data.spec.name}: asks for all devices, "
                    f"but resource pool {pool.label()} is currently invalid"
                )
        found = []
        for candidate in self.view.candidates:
            if not data.selectable(candidate):
                continue
            if self.features.consumable_capacity:
                # 1.37 checks the device's capacity alone, so a device whose capacity is
                # in use stays in "all" and the request fails; before, it was left out.
                static = self.variant.all_mode_static_capacity
                try:
                    # Nothing of this claim is being allocated yet: no capacity held.
                    if data.rules.capacity(candidate, None, static=static) is not None:
                        continue
                except cap.CapacityError as exc:
                    raise AllocationError(
                        f"claim {self.label}, request {data.spec.name}: checking capacity for "
                        f"device {candidate.device.name}: {exc}"
                    ) from exc
            found.append(candidate)
        return found
