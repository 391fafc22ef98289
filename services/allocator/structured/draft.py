"""The claim's allocation while the search builds it: the devices it has taken, the
capacity, counters and compatibility groups they hold, the constraints they
fed, and how each is given back when the search backtracks (upstream's
allocateDevice and rollbackDevice, with the releases' differences in what a
rejected or backtracked device keeps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.allocator.structured import capacity as cap
from services.allocator.structured.constraints import Constraint, lookup_attribute
from services.allocator.structured.counters import Counters, GroupIntersection
from services.allocator.structured.engine import Engine
from services.allocator.structured.errors import AllocationError, claim_label, device_label
from services.allocator.structured.plan import RequestData
from services.allocator.structured.requests import RequestSpec
from services.allocator.structured.results import Pick
from services.allocator.structured.state import DeviceID
from services.allocator.structured.view import Candidate
from services.core.kube.resource import Device, DeviceAttribute, ResourceClaim


@dataclass(slots=True)
class _Taken:
    """What one successful :meth:`Draft.take` changed (deviceRollbackState)."""

    counters: bool = False
    groups: list[tuple[tuple[str, str], str, GroupIntersection | None]] = field(
        default_factory=list
    )
    constraints: int = 0
    marked: bool = False
    capacity: cap.Consumed | None = None
    capacity_existed: bool = False  # a share of the device was being allocated already
    picked: bool = False  # its Pick is on the draft


class Draft:
    """What one claim has taken so far on one node, and the checks that depend on it."""

    def __init__(self, engine: Engine, claim: ResourceClaim, constraints: list[Constraint]) -> None:
        self.engine = engine
        self.features = engine.features
        self.variant = engine.variant
        self.claim = claim
        self.label = claim_label(claim)
        self.constraints = constraints
        self.allocating: set[DeviceID] = set()
        self.allocating_capacity: dict[DeviceID, cap.Consumed] = {}
        self.consumed_counters: dict[tuple[str, str], Counters] = {}
        self.groups: dict[tuple[str, str], dict[str, GroupIntersection]] = {}
        self.picks: list[Pick] = []

    # ------------------------------------------------------------ checks

    def _capacity_fits(self, data: RequestData, candidate: Candidate) -> bool:
        """CmpRequestOverCapacity, counting what this claim holds; raises cap.CapacityError
        (1.37)."""
        allocating = self.allocating_capacity.get(candidate.id)
        return data.rules.capacity(candidate, allocating) is None

    def capacity_or_stop(self, data: RequestData, candidate: Candidate, what: str) -> bool:
        """Whether the device's capacity still fits; a capacity error (1.37) stops the
        claim, its message naming the step (``what``) as upstream's does."""
        try:
            return self._capacity_fits(data, candidate)
        except cap.CapacityError as exc:
            raise AllocationError(
                f"claim {self.label}, request {data.spec.name}: {what} capacity for device "
                f"{device_label(candidate.id)}: {exc}"
            ) from exc

    def _in_use(self, device_id: DeviceID) -> bool:
        return device_id in self.engine.state.devices or device_id in self.allocating

    def _capacity_in_use(self, device_id: DeviceID) -> bool:
        """deviceCapacityInUse: a share of the device is allocated or being allocated
        (1.37 also counts a share recorded without consumed capacity)."""
        state = self.engine.state
        if device_id in state.consumed or device_id in self.allocating_capacity:
            return True
        return self.variant.minor >= 37 and device_id in state.shared_devices

    def _lookup(self, spec: RequestSpec, candidate: Candidate) -> Callable[[str, Device], Any]:
        """The attribute a constraint compares: a derived one of the request (1.37
        experimental), else the device's own."""
        derived = {d.name: d.expression for d in spec.derived_attributes}

        def find(name: str, device: Device) -> DeviceAttribute | None:
            if name in derived:
                return self.engine.derived(name, derived[name], candidate)
            return lookup_attribute(device, candidate.pool.driver, name)

        return find

    # ------------------------------------------------------------ take and give back

    def take(
        self, data: RequestData, candidate: Candidate, must: bool
    ) -> Callable[[], None] | None:
        """allocateDevice: take the device for the request if the remaining rules and the
        constraints let it. Returns how to give it back, or None when it is not taken;
        ``must`` (allocationMode All): a constraint that fails stops the claim."""
        spec, device, device_id = data.spec, candidate.device, candidate.id
        variant = self.variant
        multi = self.features.consumable_capacity and bool(device.allow_multiple_allocations)
        if not multi and spec.admin and device_id in self.allocating:
            return None
        if not spec.admin and self._in_use(device_id):
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
        lookup = self._lookup(spec, candidate)
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
        self.picks.append(
            Pick(spec, candidate, share_id, {k: str(v) for k, v in consumed.items()} or None)
        )
        taken.picked = True

        def undo() -> None:
            if variant.shared_device_keeps_counters_on_backtrack and multi:
                taken.counters = False
            self._rollback(candidate, spec, taken)

        return undo

    def _rollback(self, candidate: Candidate, spec: RequestSpec, taken: _Taken) -> None:
        """rollbackDevice: undo what ``taken`` records, newest first."""
        device_id = candidate.id
        if taken.picked:
            self.picks.pop()
            taken.picked = False
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
