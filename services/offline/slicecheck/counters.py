"""Counters: the counter sets a slice shares and what each device consumes of them,
within the limits of the release."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.core.kube.resource import CounterSet, DeviceCounterConsumption
from services.offline.slicecheck.limits import Limits
from services.offline.slicecheck.names import dns_label
from services.offline.slicecheck.problem import Problem
from services.offline.slicecheck.values import quantity_value


def consumptions(items: list[DeviceCounterConsumption], path: str, limits: Limits) -> list[Problem]:
    if len(items) > limits.max_consumptions_per_device:
        return [Problem(path, f"at most {limits.max_consumptions_per_device} entries")]
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        if item.counter_set in seen:
            problems.append(Problem(f"{where}.counterSet", f"duplicate {item.counter_set!r}"))
        seen.add(item.counter_set)
        problems += dns_label(item.counter_set, f"{where}.counterSet")
        problems += _counters(item.counters, limits.max_counters_per_consumption, where)
    total = sum(len(item.counters) for item in items)
    if limits.max_counters_per_device is not None and total > limits.max_counters_per_device:
        problems.append(
            Problem(path, f"at most {limits.max_counters_per_device} counters, got {total}")
        )
    return problems


def shared_counters(sets: list[CounterSet], path: str, limits: Limits) -> list[Problem]:
    if len(sets) > limits.max_counter_sets:
        return [Problem(path, f"at most {limits.max_counter_sets} counter sets, got {len(sets)}")]
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, counter_set in enumerate(sets):
        where = f"{path}[{i}]"
        if counter_set.name in seen:
            problems.append(Problem(f"{where}.name", f"duplicate {counter_set.name!r}"))
        seen.add(counter_set.name)
        problems += dns_label(counter_set.name, f"{where}.name")
        problems += _counters(counter_set.counters, limits.max_counters_per_set, where)
    total = sum(len(s.counters) for s in sets)
    cap = limits.max_shared_counters_total
    if cap is not None and total > cap:
        problems.append(Problem(path, f"at most {cap} counters in all sets, got {total}"))
    return problems


def _counters(counters: Mapping[str, Any], limit: int, path: str) -> list[Problem]:
    if not counters:
        return [Problem(f"{path}.counters", "required (at least one counter)")]
    if len(counters) > limit:
        return [Problem(f"{path}.counters", f"at most {limit} counters, got {len(counters)}")]
    problems: list[Problem] = []
    for name, counter in counters.items():
        problems += dns_label(name, f"{path}.counters[{name}]")
        problems += quantity_value(counter.value, f"{path}.counters[{name}].value")
    return problems
