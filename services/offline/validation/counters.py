"""Counters: the counter sets a slice shares and what its devices consume of them. 1.34
bounds a slice's and a device's counters in all; 1.35 bounds each set and consumption
and lets a device consume from a set in another slice of its pool."""

from __future__ import annotations

from typing import Any

from services.core.kube.resource import (
    CounterSet,
    Device,
    DeviceCounterConsumption,
    ResourceSliceSpec,
)
from services.offline.validation.fields import invalid, required, too_many
from services.offline.validation.lists import by_name, check_set, key_path
from services.offline.validation.names import dns_label
from services.offline.validation.rules import Rules

MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMPTIONS = 2
MAX_SHARED_COUNTERS_1_34 = 32  # in all counter sets of a slice
MAX_DEVICE_COUNTERS_1_34 = 1024  # consumed by all devices of a slice


def slice_counter_totals(spec: ResourceSliceSpec) -> list[str]:
    """1.34's limits on a slice's counters (1.35 limits each set and consumption
    instead): at most 1024 consumed by its devices, at most 32 in its counter sets."""
    consumed = sum(len(c.counters) for d in spec.devices or [] for c in d.consumes_counters or [])
    errors = []
    if consumed > MAX_DEVICE_COUNTERS_1_34:
        detail = "the total number of counters in devices must not exceed"
        errors.append(invalid("spec.devices", consumed, f"{detail} {MAX_DEVICE_COUNTERS_1_34}"))
    shared = sum(len(c.counters) for c in spec.shared_counters or [])
    if shared > MAX_SHARED_COUNTERS_1_34:
        detail = "the total number of shared counters must not exceed"
        errors.append(
            invalid("spec.sharedCounters", shared, f"{detail} {MAX_SHARED_COUNTERS_1_34}")
        )
    return errors


def counter_sets(sets: list[CounterSet], rules: Rules) -> list[str]:
    """validateCounterSet over the slice's sets: at most 8 of them (1.35+; 1.34 bounds
    the counters of all sets together, slice_counter_totals), names unique."""

    def check(i: int, counter_set: CounterSet) -> list[str]:
        path = f"spec.sharedCounters[{i}]"
        errors = _counter_name(counter_set.name, f"{path}.name")
        return errors + _counters(counter_set.counters, f"{path}.counters", rules)

    limit = MAX_COUNTER_SETS if rules.minor >= 35 else -1
    return check_set(sets, limit, "spec.sharedCounters", rules, check, by_name, "name")


def _counter_name(name: str, path: str) -> list[str]:
    return [required(path)] if not name else dns_label(name, path)


def _counters(counters: dict[str, Any], path: str, rules: Rules) -> list[str]:
    """A counter map: not empty, DNS-label names, at most 32 entries (1.35+; 1.34 bounds
    totals instead)."""
    if not counters:
        return [required(path)]
    if rules.minor >= 35 and len(counters) > MAX_COUNTERS:
        return [too_many(path, len(counters), MAX_COUNTERS)]
    return [e for n in counters for e in dns_label(n, key_path(path, n, 63, rules))]


def consumptions(items: list[DeviceCounterConsumption], path: str, rules: Rules) -> list[str]:
    """validateDeviceCounterConsumption over a device's entries: at most 2 (1.35+),
    counter sets unique. 1.34 checks only that a counter set is named (its name is
    checked where the set is defined)."""

    def check(i: int, item: DeviceCounterConsumption) -> list[str]:
        where = f"{path}[{i}]"
        if rules.minor >= 35:
            errors = _counter_name(item.counter_set, f"{where}.counterSet")
        else:
            errors = [] if item.counter_set else [required(f"{where}.counterSet")]
        return errors + _counters(item.counters, f"{where}.counters", rules)

    limit = MAX_CONSUMPTIONS if rules.minor >= 35 else -1
    # compatibilityGroups (1.37): at most 2, short names, unique, but only in declarative
    # validation, which 1.37 does not enforce for it (reference-allocator accepts 3).
    return check_set(items, limit, path, rules, check, _counter_set, "counterSet")


def _counter_set(item: DeviceCounterConsumption) -> str:
    return item.counter_set


def consumed_counters_1_34(device: Device, path: str, shared: dict[str, set[str]]) -> list[str]:
    """1.34's validateDevice on consumed counters: at most 32 in all of a device's
    entries, each counter set and counter one of the slice's own sharedCounters (from
    1.35 counter sets may live in other slices of the pool)."""
    items = device.consumes_counters or []
    errors = []
    total = sum(len(c.counters) for c in items)
    if total > MAX_COUNTERS:
        detail = f"the total number of counters must not exceed {MAX_COUNTERS}"
        errors.append(invalid(path, total, detail))
    for i, consumption in enumerate(items):
        where = f"{path}.consumesCounters[{i}]"
        names = shared.get(consumption.counter_set)
        if names is None:
            detail = "must reference a counterSet defined in the ResourceSlice sharedCounters"
            errors.append(invalid(f"{where}.counterSet", consumption.counter_set, detail))
            continue
        detail = "must reference a counter defined in the ResourceSlice sharedCounters"
        errors += [invalid(f"{where}.counters", n, detail) for n in consumption.counters
                   if n not in names]  # fmt: skip
    return errors
