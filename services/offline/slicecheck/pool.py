"""What only a whole pool shows: its slices agree on driver, pool, generation and count,
names are unique across them, and every consumed counter exists and fits."""

from __future__ import annotations

from services.core.kube import quantity
from services.core.kube.resource import CounterSet, DeviceCounterConsumption, ResourceSlice
from services.offline.slicecheck.limits import Limits
from services.offline.slicecheck.problem import Problem

#: Each slice of the pool with where it was given (``slices[1]``).
Placed = list[tuple[str, ResourceSlice]]


def check_pool_of(slices: Placed, limits: Limits) -> list[Problem]:
    """The problems of the pool ``slices`` form, beyond each slice's own."""
    if not slices:
        return []
    problems: list[Problem] = []
    first = slices[0][1].spec
    for where, s in slices:
        for field, got, want in (
            ("driver", s.spec.driver, first.driver),
            ("pool.name", s.spec.pool.name, first.pool.name),
            ("pool.generation", s.spec.pool.generation, first.pool.generation),
            ("pool.resourceSliceCount", s.spec.pool.resource_slice_count, len(slices)),
        ):
            if got != want:
                problems.append(Problem(f"{where}.spec.{field}", f"expected {want!r}, got {got!r}"))
    return problems + _names(slices) + _counter_refs(slices, limits)


def _names(slices: Placed) -> list[Problem]:
    problems: list[Problem] = []
    devices: dict[str, str] = {}
    sets: dict[str, str] = {}
    objects: dict[str, str] = {}
    for where, s in slices:
        if s.metadata.name:
            problems += _duplicate(objects, s.metadata.name, f"{where}.metadata.name")
        for i, d in enumerate(s.spec.devices or []):
            problems += _duplicate(devices, d.name, f"{where}.spec.devices[{i}].name")
        for i, c in enumerate(s.spec.shared_counters or []):
            problems += _duplicate(sets, c.name, f"{where}.spec.sharedCounters[{i}].name")
    return problems


def _counter_refs(slices: Placed, limits: Limits) -> list[Problem]:
    """Every consumed counter exists, in the slice (1.34) or the pool (1.35+), and fits."""
    pool_sets = {c.name: c for _, s in slices for c in s.spec.shared_counters or []}
    problems: list[Problem] = []
    for where, s in slices:
        visible = (
            pool_sets
            if limits.split_counters
            else {c.name: c for c in s.spec.shared_counters or []}
        )
        for i, device in enumerate(s.spec.devices or []):
            for j, item in enumerate(device.consumes_counters or []):
                path = f"{where}.spec.devices[{i}].consumesCounters[{j}]"
                problems += _consumption_fits(item, visible.get(item.counter_set), path)
    return problems


def _duplicate(seen: dict[str, str], name: str, path: str) -> list[Problem]:
    if name in seen:
        return [Problem(path, f"{name!r} is already used at {seen[name]}")]
    seen[name] = path
    return []


def _consumption_fits(
    item: DeviceCounterConsumption, counter_set: CounterSet | None, path: str
) -> list[Problem]:
    if counter_set is None:
        return [Problem(f"{path}.counterSet", f"no counter set {item.counter_set!r} in scope")]
    problems: list[Problem] = []
    for name, counter in item.counters.items():
        have = counter_set.counters.get(name)
        if have is None:
            problems.append(Problem(f"{path}.counters[{name}]", "not in the counter set"))
            continue
        try:
            if quantity.parse(counter.value) > quantity.parse(have.value):
                problems.append(
                    Problem(f"{path}.counters[{name}]", f"{counter.value} exceeds {have.value}")
                )
        except quantity.QuantityError:
            continue  # reported by the per-slice check
    return problems
