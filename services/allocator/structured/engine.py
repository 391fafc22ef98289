"""Structured allocation of one claim on one node, as Kubernetes 1.34-1.37 do it.

This follows k8s.io/dynamic-resource-allocation/structured of the release
``features.minor`` names, and within it the implementation kube-scheduler
picks for those gates (stable, incubating or experimental;
:mod:`.variant` says which, and every behaviour that differs between them):
validate the requests, then a depth-first search over requests -> devices
with backtracking, devices in pool/slice/device order, first full solution
wins.

Where upstream has quirks that change outcomes, they are kept on purpose so a
differential test against kube-scheduler agrees (each is commented where it
happens, with the releases that have it): counters a device took stay taken
within one search when a taint or a constraint then rejects it (up to 1.35);
``distinctAttribute`` remembers one value per request (up to 1.36); a claim
config naming several requests is copied once per request (up to 1.36);
every position of a request scans all devices, orderings rather than sets (up
to 1.35, and 1.36/1.37 stable). tests/e2e/test_differential_allocator.py
checks this against the upstream allocators of 1.37 and 1.35 on generated
scenarios. Deviations, also commented and listed in docs/differences.md:
pools are ordered by first appearance where upstream uses Go map order,
counters are keyed by driver and pool (upstream up to 1.36: pool name only),
an "All" subrequest after the first keeps its own selectors (upstream up to
1.35: the first subrequest's), a share of a device takes its counters (upstream
1.35: none).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.allocator.cel.env import CelEnvironment
from services.allocator.cel.selector import CelError, DeviceInput, Fact, Selector, device_facts
from services.allocator.structured import capacity as cap
from services.allocator.structured.constraints import (
    Constraint,
    DistinctAttribute,
    MatchAttribute,
    lookup_attribute,
)
from services.allocator.structured.features import Features
from services.allocator.structured.pools import (
    Node,
    NodeSelectorError,
    Pool,
    PoolCache,
    SliceIndex,
    gather_pools,
)
from services.allocator.structured.requests import ALL, EXACT_COUNT, RequestSpec, alternatives
from services.allocator.structured.rules import DeviceRules, Rejection
from services.allocator.structured.state import AllocatedState, DeviceID
from services.allocator.structured.variant import Variant
from services.core.kube.resource import (
    AllocationResult,
    Device,
    DeviceAllocationConfiguration,
    DeviceAllocationResult,
    DeviceAttribute,
    DeviceClass,
    DeviceRequestAllocationResult,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
    ResourceSlice,
)

MAX_DEVICES = 32  # resourceapi.AllocationResultsMaxSize
Counters = dict[str, dict[str, int]]  # counter set -> counter -> value in nano units


class AllocationError(Exception):
    """Allocation of the claim must stop (bad input such as a CEL error); not "does not fit"."""


class _MaxSizeExceeded(Exception):
    """errAllocationResultMaxSizeExceeded: more than 32 devices down this path."""


def claim_label(claim: ResourceClaim) -> str:
    return f"{claim.metadata.namespace or 'default'}/{claim.metadata.name}"


def device_label(device_id: DeviceID) -> str:
    return "/".join(device_id)


@dataclass(slots=True)
class Candidate:
    """One device of one usable pool, as seen from one node."""

    pool: Pool
    slice: ResourceSlice
    device: Device
    id: DeviceID
    counters: list[tuple[str, str, int]]  # (counter set, counter, nanos) it consumes


@dataclass(slots=True)
class NodeView:
    node: Node | None
    pools: list[Pool]
    candidates: list[Candidate]  # devices of complete, valid pools, in search order
    # 1.34: where the search reaches an invalid pool and must stop the claim.
    stop: tuple[int, str] | None = None


def _consumption(device: Device) -> list[tuple[str, str, int]]:
    from services.core.kube.quantity import Quantity

    return [
        (c.counter_set, name, Quantity.parse(counter.value).nanos())
        for c in device.consumes_counters or []
        for name, counter in c.counters.items()
    ]


def _subtract(counters: Counters, consumption: list[tuple[str, str, int]]) -> None:
    for set_name, name, value in consumption:
        values = counters.get(set_name)
        if values is not None and name in values:
            values[name] -= value


# ------------------------------------------------------------ compatibility groups


@dataclass(frozen=True, slots=True)
class GroupIntersection:
    """compatibilityGroupIntersection (1.37): what the devices drawing on one counter set
    have in common. A device without groups fits only with others without groups."""

    members: bool = False
    all_empty: bool = False
    groups: frozenset[str] = frozenset()

    def admits(self, groups: frozenset[str]) -> bool:
        if not self.members:
            return True
        if not groups:
            return self.all_empty
        if self.all_empty:
            return False
        return bool(self.groups & groups)

    def add(self, groups: frozenset[str]) -> GroupIntersection:
        if not self.members:
            return GroupIntersection(True, not groups, groups)
        if self.all_empty or not groups:
            return self
        return GroupIntersection(True, False, self.groups & groups)


class Engine:
    """The cluster as the allocator sees it, plus caches shared by every allocation.

    What makes thousands of claims cheap: slices are indexed by node once; a
    node's pools and candidate devices are built once; a selector's result is
    cached per device, and shared between devices whose facts (the attribute
    and capacity values the expression reads) are equal; each device's counter
    consumption is parsed once; available counters are updated by each commit
    rather than recomputed.
    """

    def __init__(
        self,
        classes: dict[str, DeviceClass],
        slices: list[ResourceSlice],
        features: Features,
        state: AllocatedState | None = None,
    ) -> None:
        self.classes = classes
        self.slices = slices
        self.features = features
        self.variant = Variant.of(features)
        self.state = state or AllocatedState()
        self.capacity_rules = cap.Rules(
            fractional=features.fractional_capacity_range and features.minor >= 37,
            v137=self.variant.capacity_errors_abort,
        )
        self.env = CelEnvironment(
            consumable_capacity=features.consumable_capacity,
            list_attributes=features.list_type_attributes and features.minor >= 36,
        )
        self._views: dict[str | None, NodeView] = {}
        self._index = SliceIndex(slices)
        self._pools: PoolCache = {}
        self._activations: dict[int, Any] = {}
        self._facts: dict[int, dict[Fact, object] | None] = {}
        self._matches: dict[tuple[str, int], bool | CelError] = {}
        self._shared_matches: dict[tuple[str, tuple[object, ...]], bool | CelError] = {}
        self._derived: dict[tuple[str, int], DeviceAttribute | CelError] = {}
        self._available: dict[tuple[str, str], Counters] = {}
        self._counter_users: dict[tuple[str, str], dict[str, list[list[tuple[str, str, int]]]]] = {}
        self._consumptions: dict[int, list[tuple[str, str, int]]] = {}
        self._groups: dict[tuple[str, str], tuple[int, dict[str, GroupIntersection]]] = {}
        self._slice_versions: dict[tuple[str, str], int] = {}
        # id() of a taint a DeviceTaintRule added -> the rule's name (taintrules.apply)
        self.taint_origins: dict[int, str] = {}
        self.share_seq = 0

    # ------------------------------------------------------------ per-node view

    def view(self, node: Node | None) -> NodeView:
        key = node.name if node else None
        cached = self._views.get(key)
        if cached is None:
            pools = gather_pools(self._index, node, self.features, self._pools)
            old = self.variant.pools_by_node_slices  # 1.34: incomplete pools are used
            candidates: list[Candidate] = []
            stop: tuple[int, str] | None = None
            for pool in pools:
                if pool.invalid is not None:
                    if old and stop is None:
                        stop = (len(candidates), f"pool {pool.name} is invalid: {pool.invalid}")
                    continue
                if pool.incomplete and not old:
                    continue
                candidates += [
                    Candidate(pool, s, d, (pool.driver, pool.name, d.name), self.consumption(d))
                    for s in pool.slices
                    for d in s.spec.devices or []
                ]
            cached = self._views[key] = NodeView(node, pools, candidates, stop)
        return cached

    # ------------------------------------------------------------ selectors

    def selector_matches(self, selector: Selector, candidate: Candidate) -> bool:
        """One selector on one device, cached; raises CelError (runtime or compile)."""
        if selector.program is None:
            raise CelError("compile", selector.error or "")
        key = (selector.expression, id(candidate.device))
        cached = self._matches.get(key)
        if cached is None:
            cached = self._match(selector, candidate)
            self._matches[key] = cached
        if isinstance(cached, CelError):
            raise cached
        return cached

    def _match(self, selector: Selector, candidate: Candidate) -> bool | CelError:
        """Evaluate, or reuse the result for a device with equal facts (cel.selector.signature)."""
        shared_key: tuple[str, tuple[object, ...]] | None = None
        if selector.facts is not None:
            facts = self._device_facts(candidate)
            if facts is not None:
                shared_key = (selector.expression, tuple(facts.get(f) for f in selector.facts))
                shared = self._shared_matches.get(shared_key)
                if shared is not None:
                    return shared
        try:
            result: bool | CelError = self.env.matches(selector, self._activation(candidate))
        except CelError as exc:
            result = exc
        if shared_key is not None:
            self._shared_matches[shared_key] = result
        return result

    def _device_facts(self, candidate: Candidate) -> dict[Fact, object] | None:
        key = id(candidate.device)
        if key not in self._facts:
            self._facts[key] = device_facts(DeviceInput(candidate.pool.driver, candidate.device))
        return self._facts[key]

    def _activation(self, candidate: Candidate) -> Any:
        key = id(candidate.device)
        act = self._activations.get(key)
        if act is None:
            act = self.env.activation(DeviceInput(candidate.pool.driver, candidate.device))
            self._activations[key] = act
        return act

    def derived(self, name: str, expression: str, candidate: Candidate) -> DeviceAttribute:
        """A derived attribute of one device (lookupAttribute, 1.37), cached per device
        and expression; raises :class:`AllocationError` as upstream stops the claim."""
        key = (expression, id(candidate.device))
        found = self._derived.get(key)
        if found is None:
            compiled = self.env.compile_derived(expression)
            if compiled.program is None:
                raise AllocationError(
                    f"compile derived attribute {name} failed: {compiled.error or ''}"
                )
            try:
                found = self.env.derive(compiled, self._activation(candidate))
            except CelError as exc:
                found = exc
            self._derived[key] = found
        if isinstance(found, CelError):
            raise AllocationError(
                f"evaluate derived attribute {name} on device {device_label(candidate.id)} "
                f"failed: {found.message}"
            )
        return found

    # ------------------------------------------------------------ counters

    def consumption(self, device: Device) -> list[tuple[str, str, int]]:
        """What ``device`` consumes of its pool's counters (parsed once per device)."""
        key = id(device)
        found = self._consumptions.get(key)
        if found is None:
            found = self._consumptions[key] = _consumption(device)
        return found

    def _counts_against_counters(self, device_id: DeviceID) -> bool:
        # A share takes counters in every release gpudra follows (upstream 1.35
        # experimental counted exclusive use only: documented deviation).
        if self.features.consumable_capacity:
            return self.state.is_allocated(device_id)
        return device_id in self.state.devices

    def counter_key(self, candidate: Candidate) -> tuple[str, str]:
        """Where a device's counters live: its pool, or (1.34) its own slice."""
        if self.variant.pools_by_node_slices:
            return (
                candidate.pool.driver,
                f"{candidate.pool.name}\x00{candidate.slice.metadata.name}",
            )
        return candidate.pool.key

    def available_for(self, candidate: Candidate) -> Counters:
        if not self.variant.pools_by_node_slices:
            return self.available_counters(candidate.pool)
        key = self.counter_key(candidate)
        cached = self._available.get(key)
        if cached is None or self._slice_versions.get(key) != self.state.version:
            # 1.34 checkAvailableCounters: the slice's counter sets less what its
            # allocated devices consume (upstream: exclusive use only; a share counts
            # here too, the documented deviation).
            from services.core.kube.quantity import Quantity

            slice_ = candidate.slice
            cached = {
                c.name: {k: Quantity.parse(v.value).nanos() for k, v in c.counters.items()}
                for c in slice_.spec.shared_counters or []
            }
            for device in slice_.spec.devices or []:
                device_id = (candidate.pool.driver, candidate.pool.name, device.name)
                if self._counts_against_counters(device_id):
                    _subtract(cached, self.consumption(device))
            self._available[key] = cached
            self._slice_versions[key] = self.state.version
        return cached

    def available_counters(self, pool: Pool) -> Counters:
        """Counter sets minus what allocated devices consume (may go negative, as upstream).

        Computed once per pool, then kept up to date by :meth:`commit`.
        """
        cached = self._available.get(pool.key)
        if cached is None:
            cached = {
                name: {k: q.nanos() for k, q in counters.items()}
                for name, counters in pool.counter_sets.items()
            }
            users: dict[str, list[list[tuple[str, str, int]]]] = {}
            for slice_ in pool.slices + pool.other_slices:
                for device in slice_.spec.devices or []:
                    consumption = self.consumption(device)
                    if not consumption:
                        continue
                    users.setdefault(device.name, []).append(consumption)
                    if self._counts_against_counters((pool.driver, pool.name, device.name)):
                        _subtract(cached, consumption)
            self._available[pool.key] = cached
            self._counter_users[pool.key] = users
        return cached

    def group_baseline(self, pool: Pool) -> dict[str, GroupIntersection]:
        """compatibilityGroupsBaselineForPool: per counter set, what the allocated devices'
        compatibility groups have in common (recomputed after each commit)."""
        cached = self._groups.get(pool.key)
        if cached is not None and cached[0] == self.state.version:
            return cached[1]
        baseline: dict[str, GroupIntersection] = {}
        for slice_ in pool.slices + pool.other_slices:
            for device in slice_.spec.devices or []:
                if not self.state.is_allocated((pool.driver, pool.name, device.name)):
                    continue
                for consumption in device.consumes_counters or []:
                    current = baseline.get(consumption.counter_set, GroupIntersection())
                    groups = frozenset(consumption.compatibility_groups or ())
                    baseline[consumption.counter_set] = current.add(groups)
        self._groups[pool.key] = (self.state.version, baseline)
        return baseline

    # ------------------------------------------------------------ allocation

    def allocate(self, claim: ResourceClaim, node: Node | None) -> AllocationResult | None:
        """The allocation for ``claim`` on ``node``, None when it does not fit there.

        Raises :class:`AllocationError` when allocation must stop for this claim.
        """
        try:
            view = self.view(node)
        except NodeSelectorError as exc:
            raise AllocationError(f"gather pool information: {exc}") from exc
        return _Search(self, claim, view).run()

    def commit(self, allocation: AllocationResult) -> None:
        """Record a new allocation: its devices are in use from now on."""
        results = (allocation.devices.results if allocation.devices else None) or []
        ids = list(dict.fromkeys((r.driver, r.pool, r.device) for r in results))
        before = [self._counts_against_counters(i) for i in ids]
        self.state.add(allocation, self.features.consumable_capacity)
        for device_id, was in zip(ids, before, strict=True):
            available = self._available.get(device_id[:2])
            if available is None or was or not self._counts_against_counters(device_id):
                continue
            for consumption in self._counter_users[device_id[:2]].get(device_id[2], []):
                _subtract(available, consumption)

    def new_share_id(self, claim: ResourceClaim, device_id: DeviceID) -> str:
        """A share UID; derived, not random, so that offline runs repeat exactly."""
        self.share_seq += 1
        seed = f"{claim_label(claim)}/{device_label(device_id)}/{self.share_seq}"
        return str(uuid.uuid5(uuid.NAMESPACE_URL, seed))


@dataclass(slots=True)
class RequestData:
    spec: RequestSpec
    device_class: DeviceClass
    rules: DeviceRules
    num_devices: int
    all_devices: list[Candidate] = field(default_factory=list)
    has_subrequests: bool = False


@dataclass(slots=True)
class _Result:
    data: RequestData
    candidate: Candidate
    share_id: str | None
    consumed: dict[str, str] | None


@dataclass(slots=True)
class _Taken:
    """What one successful _allocate_device changed (deviceRollbackState)."""

    counters: bool = False
    groups: list[tuple[tuple[str, str], str, GroupIntersection | None]] = field(
        default_factory=list
    )
    constraints: int = 0
    marked: bool = False
    capacity: cap.Consumed | None = None
    capacity_existed: bool = False  # a share of the device was being allocated already
    result: bool = False


class _Search:
    """One Allocate call for one claim on one node (upstream's ``allocator`` struct)."""

    def __init__(self, engine: Engine, claim: ResourceClaim, view: NodeView) -> None:
        self.engine = engine
        self.features = engine.features
        self.variant = engine.variant
        self.claim = claim
        self.label = claim_label(claim)
        self.view = view
        self.requests = (claim.spec.devices.requests if claim.spec.devices else None) or []
        self.data: dict[tuple[int, int], RequestData] = {}
        self.selected: dict[int, int] = {}
        self.constraints: list[Constraint] = []
        self.allocating: set[DeviceID] = set()
        self.allocating_capacity: dict[DeviceID, cap.Consumed] = {}
        self.consumed_counters: dict[tuple[str, str], Counters] = {}
        self.groups: dict[tuple[str, str], dict[str, GroupIntersection]] = {}
        self.results: list[_Result] = []

    # ------------------------------------------------------------ setup

    def run(self) -> AllocationResult | None:
        self._prepare()
        try:
            done = self._allocate_one(0, 0, 0, False, 0)
        except _MaxSizeExceeded:
            done = False
        if not done:
            return None
        return self._result()

    def _prepare(self) -> None:
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
            if not self.selectable(data, candidate):
                continue
            if self.features.consumable_capacity:
                # 1.37 checks the device's capacity alone, so a device whose capacity is
                # in use stays in "all" and the request fails; before, it was left out.
                static = self.variant.all_mode_static_capacity
                try:
                    if not self._capacity_fits(data, candidate, static=static):
                        continue
                except cap.CapacityError as exc:
                    raise AllocationError(
                        f"claim {self.label}, request {data.spec.name}: checking capacity for "
                        f"device {candidate.device.name}: {exc}"
                    ) from exc
            found.append(candidate)
        return found

    # ------------------------------------------------------------ checks

    def selectable(self, data: RequestData, candidate: Candidate) -> bool:
        """isSelectable; a selector that cannot be evaluated stops the claim."""
        return _passes(data.rules.selectable(candidate))

    def _capacity_fits(self, data: RequestData, candidate: Candidate, static: bool = False) -> bool:
        """CmpRequestOverCapacity; raises cap.CapacityError (1.37)."""
        if static:
            return data.rules.capacity(candidate, None, static=True) is None
        allocating = self.allocating_capacity.get(candidate.id)
        return data.rules.capacity(candidate, allocating) is None

    def _capacity_or_stop(self, data: RequestData, candidate: Candidate, what: str) -> bool:
        try:
            return self._capacity_fits(data, candidate)
        except cap.CapacityError as exc:
            raise AllocationError(
                f"claim {self.label}, request {data.spec.name}: {what} capacity for device "
                f"{device_label(candidate.id)}: {exc}"
            ) from exc

    def in_use(self, device_id: DeviceID) -> bool:
        return device_id in self.engine.state.devices or device_id in self.allocating

    def _capacity_in_use(self, device_id: DeviceID) -> bool:
        """deviceCapacityInUse: a share of the device is allocated or being allocated
        (1.37 also counts a share recorded without consumed capacity)."""
        state = self.engine.state
        if device_id in state.consumed or device_id in self.allocating_capacity:
            return True
        return self.variant.minor >= 37 and device_id in state.shared_devices

    def lookup(self, spec: RequestSpec, candidate: Candidate) -> Callable[[str, Device], Any]:
        """The attribute a constraint compares: a derived one of the request (1.37
        experimental), else the device's own."""
        derived = {d.name: d.expression for d in spec.derived_attributes}

        def find(name: str, device: Device) -> DeviceAttribute | None:
            if name in derived:
                return self.engine.derived(name, derived[name], candidate)
            return lookup_attribute(device, candidate.pool.driver, name)

        return find

    # ------------------------------------------------------------ search

    def _allocate_one(self, ri: int, si: int, di: int, in_sub: bool, start: int) -> bool:
        if ri >= len(self.requests):
            return True
        data = self.data[(ri, si)]
        if data.has_subrequests and not in_sub:
            all_exceeded = True
            for sub in range(len(self.requests[ri].first_available or [])):
                try:
                    done = self._allocate_one(ri, sub, 0, True, 0)
                except _MaxSizeExceeded:
                    continue
                all_exceeded = False
                if done:
                    self.selected[ri] = sub
                    return True
            if all_exceeded:
                raise _MaxSizeExceeded
            return False
        mode_all = data.spec.mode == ALL
        if mode_all and not data.all_devices:
            return False
        if di >= data.num_devices:
            return self._allocate_one(ri + 1, 0, 0, False, 0)
        if len(self.results) + data.num_devices - di > MAX_DEVICES:
            raise _MaxSizeExceeded
        if mode_all:
            undo = self._allocate_device(data, data.all_devices[di], must=True)
            if undo is None:
                return False
            # Upstream up to 1.35 goes on with subrequest index 0 here, so an "All"
            # subrequest after the first continues with the first one's data (its
            # selectors and device list) and usually fails; we go on with this
            # subrequest, as 1.36 does (docs/differences.md, allocator deviations).
            return self._descend(undo, ri, si, di, in_sub, 0)
        # Up to 1.35 (and in 1.36/1.37's stable allocator) every device of the node
        # is tried for every position: the search visits orderings, not just sets,
        # which matters where the outcome depends on order (distinctAttribute
        # remembers one value per request; shared devices may be picked twice;
        # rejected devices keep counters). From 1.36 the incubating and
        # experimental allocators go on after the device just taken (startLocation).
        candidates, stop = self.view.candidates, self.view.stop
        for index in range(start if self.variant.combinations else 0, len(candidates) + 1):
            if stop is not None and index == stop[0]:
                raise AllocationError(stop[1])  # 1.34: an invalid pool stops the claim
            if index == len(candidates):
                break
            candidate = candidates[index]
            if data.rules.in_use(candidate, self.allocating) is not None:
                continue
            if not self.selectable(data, candidate):
                continue
            if self.features.consumable_capacity and not self._capacity_or_stop(
                data, candidate, "checking"
            ):
                continue
            undo = self._allocate_device(data, candidate, must=False)
            if undo is None:
                continue
            if self._descend(undo, ri, si, di, in_sub, index + 1):
                return True
        return False

    def _descend(
        self, undo: Callable[[], None], ri: int, si: int, di: int, in_sub: bool, start: int
    ) -> bool:
        try:
            done = self._allocate_one(ri, si, di + 1, in_sub, start)
        except BaseException:
            undo()
            raise
        if not done:
            undo()
        return done

    def _allocate_device(
        self, data: RequestData, candidate: Candidate, must: bool
    ) -> Callable[[], None] | None:
        spec, device, device_id = data.spec, candidate.device, candidate.id
        variant = self.variant
        multi = self.features.consumable_capacity and bool(device.allow_multiple_allocations)
        if not multi and spec.admin and device_id in self.allocating:
            return None
        if not spec.admin and self.in_use(device_id):
            return None
        if data.rules.node_operations(candidate) is not None:
            return None
        if data.rules.partitionable(candidate) is not None:
            return None
        taken = _Taken()
        # From 1.35 a further share of a device in use takes no counters again.
        skip_counters = multi and variant.minor >= 35 and self._capacity_in_use(device_id)
        if device.consumes_counters and not skip_counters:
            if (
                variant.channel == "experimental"
                and variant.minor >= 37
                and self.features.compatibility_groups
                and not self._take_groups(candidate, taken)
            ):
                return None
            if not self._take_counters(data, candidate):
                self._rollback(candidate, spec, taken)
                return None
            taken.counters = True

        def reject() -> None:
            # Up to 1.35 the counters just taken stay taken when a taint or a
            # constraint now rejects the device; from 1.36 they are given back.
            if variant.rejected_device_keeps_counters:
                taken.counters = False
                taken.groups.clear()
            self._rollback(candidate, spec, taken)

        if data.rules.taint(candidate) is not None:
            reject()
            return None
        sub_name = spec.name if spec.parent else None
        lookup = self.lookup(spec, candidate)
        for constraint in self.constraints:
            try:
                added = constraint.add(spec.base_name, sub_name, device, lookup)
            except AllocationError:
                reject()
                raise
            if not added:
                reject()
                if must:
                    raise AllocationError(
                        f"claim {self.label}, request {spec.name}: cannot add device "
                        f"{device_label(device_id)} because a claim constraint would not be "
                        "satisfied"
                    )
                return None
            taken.constraints += 1
        if not multi:
            self.allocating.add(device_id)
            taken.marked = True
        share_id: str | None = None
        consumed: cap.Consumed = {}
        if self.features.consumable_capacity:
            try:
                fits = self._capacity_fits(data, candidate)
            except cap.CapacityError as exc:
                self._rollback(candidate, spec, taken)
                raise AllocationError(
                    f"claim {self.label}, request {spec.name}: rechecking capacity for device "
                    f"{device_label(device_id)}: {exc}"
                ) from exc
            if not fits:
                if variant.minor >= 36:
                    self._rollback(candidate, spec, taken)
                return None  # up to 1.35: nothing rolled back on this path
            if multi:
                consumed = cap.consumption(
                    spec.capacity, device.capacity or {}, self.engine.capacity_rules
                )
                share_id = self.engine.new_share_id(self.claim, device_id)
                taken.capacity_existed = device_id in self.allocating_capacity
                cap.add_into(self.allocating_capacity.setdefault(device_id, {}), consumed)
                taken.capacity = consumed
        self.results.append(
            _Result(data, candidate, share_id, {k: str(v) for k, v in consumed.items()} or None)
        )
        taken.result = True

        def undo() -> None:
            if variant.shared_device_keeps_counters_on_backtrack and multi:
                taken.counters = False
            self._rollback(candidate, spec, taken)

        return undo

    def _rollback(self, candidate: Candidate, spec: RequestSpec, taken: _Taken) -> None:
        """rollbackDevice: undo what ``taken`` records, newest first."""
        device_id = candidate.id
        if taken.result:
            self.results.pop()
            taken.result = False
        if taken.capacity is not None:
            # ConsumedCapacityCollection.Remove drops an entry left at zero; up to 1.35
            # a share that consumed nothing is not removed at all, from 1.36 an entry
            # an earlier share still needs is put back empty.
            held = self.allocating_capacity.get(device_id)
            if held is not None and (taken.capacity or self.variant.minor >= 36):
                cap.remove_from(held, taken.capacity)
                if all(q.is_zero() for q in held.values()):
                    del self.allocating_capacity[device_id]
            if taken.capacity_existed and self.variant.minor >= 36:
                self.allocating_capacity.setdefault(device_id, {})
            taken.capacity = None
        if taken.marked:
            self.allocating.discard(device_id)
            taken.marked = False
        sub_name = spec.name if spec.parent else None
        for constraint in reversed(self.constraints[: taken.constraints]):
            constraint.remove(spec.base_name, sub_name)
        taken.constraints = 0
        for pool_key, set_name, previous in reversed(taken.groups):
            running = self.groups[pool_key]
            if previous is None:
                running.pop(set_name, None)
            else:
                running[set_name] = previous
        taken.groups.clear()
        if taken.counters:
            self._release_counters(candidate)
            taken.counters = False

    def _take_groups(self, candidate: Candidate, taken: _Taken) -> bool:
        """checkAndConsumeCompatibilityGroups (1.37): the device's groups fit those of
        the devices already drawing on each counter set it consumes."""
        pool_key = candidate.pool.key
        running = self.groups.setdefault(pool_key, {})
        baseline = self.engine.group_baseline(candidate.pool)
        for consumption in candidate.device.consumes_counters or []:
            set_name = consumption.counter_set
            previous = running.get(set_name)
            current = (
                previous if previous is not None else baseline.get(set_name, GroupIntersection())
            )
            groups = frozenset(consumption.compatibility_groups or ())
            if not current.admits(groups):
                for key, name, before in reversed(taken.groups):
                    if before is None:
                        self.groups[key].pop(name, None)
                    else:
                        self.groups[key][name] = before
                taken.groups.clear()
                return False
            taken.groups.append((pool_key, set_name, previous))
            running[set_name] = current.add(groups)
        return True

    def _take_counters(self, data: RequestData, candidate: Candidate) -> bool:
        consumed = self.consumed_counters.setdefault(self.engine.counter_key(candidate), {})
        if data.rules.counters(candidate, consumed) is not None:
            return False
        for set_name, name, value in candidate.counters:
            counters = consumed.setdefault(set_name, {})
            counters[name] = counters.get(name, 0) + value
        return True

    def _release_counters(self, candidate: Candidate) -> None:
        consumed = self.consumed_counters[self.engine.counter_key(candidate)]
        for set_name, name, value in candidate.counters:
            consumed[set_name][name] -= value

    # ------------------------------------------------------------ result

    def _result(self) -> AllocationResult:
        results = [self._device_result(r) for r in self.results]
        return AllocationResult(
            devices=DeviceAllocationResult(results=results, config=self._configs() or None),
            node_selector=self._node_selector(),
        )

    def _device_result(self, result: _Result) -> DeviceRequestAllocationResult:
        spec = result.data.spec
        candidate = result.candidate
        out = DeviceRequestAllocationResult(
            request=spec.result_name,
            driver=candidate.id[0],
            pool=candidate.id[1],
            device=candidate.id[2],
            admin_access=True if spec.admin else None,
            tolerations=(list(spec.tolerations) or None)
            if self.variant.tolerations_in_results
            else None,
            share_id=result.share_id,
            consumed_capacity=result.consumed,
        )
        if self.features.binding_and_status:
            out.binding_conditions = candidate.device.binding_conditions
            out.binding_failure_conditions = candidate.device.binding_failure_conditions
        if self.variant.channel == "experimental" and self.variant.minor >= 37:
            out.skip_node_operations = candidate.slice.spec.skip_node_operations
        return out

    def _chosen(self, ri: int) -> RequestData:
        return self.data[(ri, self.selected.get(ri, 0))]

    def _configs(self) -> list[DeviceAllocationConfiguration]:
        configs: list[DeviceAllocationConfiguration] = []
        class_ranges: dict[str, tuple[int, int]] = {}
        for ri in range(len(self.requests)):
            data = self._chosen(ri)
            name = data.device_class.metadata.name
            if name in class_ranges:
                first, end = class_ranges[name]
                for i in range(first, end):
                    configs[i].requests = [*(configs[i].requests or []), data.spec.result_name]
                continue
            first = len(configs)
            for class_config in data.device_class.spec.config or []:
                configs.append(
                    DeviceAllocationConfiguration(
                        source="FromClass",
                        requests=[data.spec.result_name],
                        opaque=class_config.opaque,
                    )
                )
            class_ranges[name] = (first, len(configs))
        devices = self.claim.spec.devices
        once = self.variant.claim_config_once
        for config in (devices.config if devices else None) or []:
            from_claim = DeviceAllocationConfiguration(
                source="FromClaim", requests=config.requests, opaque=config.opaque
            )
            if not config.requests:
                configs.append(from_claim)
                continue
            # Up to 1.36 upstream appends the config once per request it names
            # (``continue``); 1.37 once (``break``).
            for ri, request in enumerate(self.requests):
                data = self._chosen(ri)
                if request.name in config.requests or (
                    data.spec.parent and data.spec.result_name in config.requests
                ):
                    configs.append(from_claim)
                    if once:
                        break
        if once:
            for made in configs:
                if made.requests and self._names_every_request(made.requests):
                    made.requests = None  # "empty means all"
        return configs

    def _names_every_request(self, names: list[str]) -> bool:
        for ri, request in enumerate(self.requests):
            if request.name in names:
                continue
            data = self._chosen(ri)
            if data.spec.parent and data.spec.result_name in names:
                continue
            return False
        return True

    def _node_selector(self) -> NodeSelector | None:
        fields: list[NodeSelectorRequirement] = []
        expressions: list[NodeSelectorRequirement] = []
        for result in self.results:
            candidate = result.candidate
            spec = candidate.slice.spec
            if spec.per_device_node_selection:
                node_name, selector = candidate.device.node_name, candidate.device.node_selector
            else:
                node_name, selector = spec.node_name, spec.node_selector
            if node_name or (self.features.binding_and_status and candidate.device.binds_to_node):
                target = self.view.node.name if self.view.node else node_name
                return NodeSelector(
                    node_selector_terms=[
                        NodeSelectorTerm(
                            match_fields=[
                                NodeSelectorRequirement(
                                    key="metadata.name", operator="In", values=[target or ""]
                                )
                            ]
                        )
                    ]
                )
            if selector is None or not selector.node_selector_terms:
                continue
            if len(selector.node_selector_terms) > 1:
                raise AllocationError(
                    f"create NodeSelector for claim {self.claim.metadata.name}: unsupported "
                    f"ResourceSlice.NodeSelector with {len(selector.node_selector_terms)} terms"
                )
            term = selector.node_selector_terms[0]
            _merge(term.match_fields or [], fields)
            _merge(term.match_expressions or [], expressions)
        if not fields and not expressions:
            return None
        return NodeSelector(
            node_selector_terms=[
                NodeSelectorTerm(match_fields=fields or None, match_expressions=expressions or None)
            ]
        )


def _passes(rejection: Rejection | None) -> bool:
    """A rejection that must stop the claim (a CEL error, a broken node selector) raises."""
    if rejection is None:
        return True
    if rejection.search_error:
        raise AllocationError(rejection.search_error)
    return False


def _merge(new: list[NodeSelectorRequirement], into: list[NodeSelectorRequirement]) -> None:
    for req in new:
        if not any(
            r.key == req.key
            and r.operator == req.operator
            and set(r.values or []) == set(req.values or [])
            for r in into
        ):
            into.append(req)
