"""Shared counters (DRAPartitionableDevices) and compatibility groups (1.37): what a
device consumes of its pool's counter sets, and what the devices drawing on one
counter set have in common.

Values are kept in nano units (``Quantity.nanos``) so sums and comparisons are
exact integers, as upstream's ``resource.Quantity`` arithmetic is.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.core.kube.quantity import Quantity
from services.core.kube.resource import Device

Counters = dict[str, dict[str, int]]  # counter set -> counter -> value in nano units
Consumption = list[tuple[str, str, int]]  # (counter set, counter, nanos) a device consumes


def consumption_of(device: Device) -> Consumption:
    """What ``device`` consumes, parsed (the engine keeps it per device)."""
    return [
        (c.counter_set, name, Quantity.parse(counter.value).nanos())
        for c in device.consumes_counters or []
        for name, counter in c.counters.items()
    ]


def subtract(counters: Counters, consumption: Consumption) -> None:
    """Take a device's consumption off available counters; a counter the sets do not
    have is left alone."""
    for set_name, name, value in consumption:
        values = counters.get(set_name)
        if values is not None and name in values:
            values[name] -= value


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
