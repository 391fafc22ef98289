"""The cluster as the allocator sees it, with the caches every allocation shares.

The search (:mod:`.search`) and the explainer (:mod:`.explain`) read the
cluster only through an :class:`Engine`: a node's candidate devices, a
selector's result on a device, a derived attribute, the counters still
available, the compatibility groups of allocated devices. The per-device rules
(:mod:`.rules`) see it through the narrower :class:`.rules.RulesEngine`.
"""

from __future__ import annotations

import uuid
from typing import Any

from services.allocator.cel.env import CelEnvironment
from services.allocator.cel.selector import CelError, DeviceInput, Fact, Selector, device_facts
from services.allocator.structured import capacity as cap
from services.allocator.structured.counters import (
    Consumption,
    Counters,
    GroupIntersection,
    consumption_of,
    subtract,
)
from services.allocator.structured.errors import AllocationError, claim_label, device_label
from services.allocator.structured.features import Features
from services.allocator.structured.pools import Node, Pool, PoolCache, SliceIndex, gather_pools
from services.allocator.structured.state import AllocatedState, DeviceID
from services.allocator.structured.variant import Variant
from services.allocator.structured.view import Candidate, NodeView
from services.core.kube.quantity import Quantity
from services.core.kube.resource import (
    AllocationResult,
    Device,
    DeviceAttribute,
    DeviceClass,
    ResourceClaim,
    ResourceSlice,
)


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
        self._pool_nodes: dict[tuple[str, str], set[str | None]] = {}  # pool -> nodes seeing it
        self._index = SliceIndex(slices)
        self._pools: PoolCache = {}
        self._activations: dict[int, Any] = {}
        self._facts: dict[int, dict[Fact, object] | None] = {}
        self._matches: dict[tuple[str, int], bool | CelError] = {}
        self._shared_matches: dict[tuple[str, tuple[object, ...]], bool | CelError] = {}
        self._derived: dict[tuple[str, int], DeviceAttribute | CelError] = {}
        self._available: dict[tuple[str, str], Counters] = {}
        self._counter_users: dict[tuple[str, str], dict[str, list[Consumption]]] = {}
        self._consumptions: dict[int, Consumption] = {}
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
            for pool in pools:
                self._pool_nodes.setdefault(pool.key, set()).add(key)
        return cached

    def seen_as_in(self, old: Engine) -> None:
        """Count the nodes that saw a pool in ``old`` as seeing it here too: what was
        learnt of them there is kept (snapshot.OfflineAllocator.carry), and a device
        freed in that pool must still reach them. More nodes than see it only costs
        their classification again."""
        for pool, nodes in old._pool_nodes.items():
            self._pool_nodes.setdefault(pool, set()).update(nodes)

    def nodes_seeing(self, pools: set[tuple[str, str]]) -> set[str | None]:
        """The nodes whose view (built so far) holds any of ``pools``."""
        return set().union(*(self._pool_nodes.get(p, ()) for p in pools))

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

    def consumption(self, device: Device) -> Consumption:
        """What ``device`` consumes of its pool's counters (parsed once per device)."""
        key = id(device)
        found = self._consumptions.get(key)
        if found is None:
            found = self._consumptions[key] = consumption_of(device)
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
            slice_ = candidate.slice
            cached = {
                c.name: {k: Quantity.parse(v.value).nanos() for k, v in c.counters.items()}
                for c in slice_.spec.shared_counters or []
            }
            for device in slice_.spec.devices or []:
                device_id = (candidate.pool.driver, candidate.pool.name, device.name)
                if self._counts_against_counters(device_id):
                    subtract(cached, self.consumption(device))
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
            users: dict[str, list[Consumption]] = {}
            for slice_ in pool.slices + pool.other_slices:
                for device in slice_.spec.devices or []:
                    consumption = self.consumption(device)
                    if not consumption:
                        continue
                    users.setdefault(device.name, []).append(consumption)
                    if self._counts_against_counters((pool.driver, pool.name, device.name)):
                        subtract(cached, consumption)
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

    # ------------------------------------------------------------ allocations

    def use_state(self, state: AllocatedState) -> None:
        """Start over from ``state`` (allocations went away, which :meth:`commit` cannot
        say): what follows from the state is dropped; the views, selector results and
        facts, which follow from the devices alone, are kept."""
        self.state = state
        self._available.clear()
        self._counter_users.clear()
        self._groups.clear()
        self._slice_versions.clear()

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
                subtract(available, consumption)

    def new_share_id(self, claim: ResourceClaim, device_id: DeviceID) -> str:
        """A share UID; derived, not random, so that offline runs repeat exactly."""
        self.share_seq += 1
        seed = f"{claim_label(claim)}/{device_label(device_id)}/{self.share_seq}"
        return str(uuid.uuid5(uuid.NAMESPACE_URL, seed))
