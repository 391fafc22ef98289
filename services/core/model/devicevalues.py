"""The values of published attributes, capacities and counters, one instance per value.

Attribute, capacity and counter values repeat across devices; the objects are
never mutated, so one instance per value serves them all (rendering a thousand
nodes is dominated by object construction otherwise).
"""

from __future__ import annotations

import functools

from services.core.kube import quantity
from services.core.kube.resource import Counter, DeviceAttribute, DeviceCapacity


@functools.lru_cache(maxsize=4096)
def string_attribute(value: str) -> DeviceAttribute:
    return DeviceAttribute(string=value)


@functools.lru_cache(maxsize=256)
def int_attribute(value: int) -> DeviceAttribute:
    return DeviceAttribute(int_=value)


@functools.lru_cache(maxsize=4096)
def capacity_value(value: int) -> DeviceCapacity:
    return DeviceCapacity(value=quantity.format_int(value))


@functools.lru_cache(maxsize=4096)
def counter_value(value: int) -> Counter:
    return Counter(value=quantity.format_int(value))


def capacity_values(values: dict[str, int]) -> dict[str, DeviceCapacity]:
    return {name: capacity_value(v) for name, v in values.items()}
