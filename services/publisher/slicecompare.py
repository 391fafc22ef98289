"""Whether a stored ResourceSlice already says what we want, compared as the Kubernetes
resourceslice controller compares: taint ``timeAdded`` (set by the server) and the
spelling of quantities do not count as differences, so a restart writes nothing."""

from __future__ import annotations

import functools

import msgspec

from services.core.kube import quantity
from services.core.kube.resource import Counter, CounterSet, Device, DeviceTaint, ResourceSlice


def same_slice(actual: ResourceSlice, wanted: ResourceSlice) -> bool:
    """Equal as the resourceslice controller compares them (and owned as we want)."""
    a, w = actual.spec, wanted.spec
    if (a.driver, a.node_name, a.node_selector, a.all_nodes, a.per_device_node_selection) != (
        w.driver,
        w.node_name,
        w.node_selector,
        w.all_nodes,
        w.per_device_node_selection,
    ):
        return False
    # Someone else's skipNodeOperations on our slice would have the kubelet start
    # containers without their devices' CDI specs: never ours (docs/architecture.md).
    if (a.skip_node_operations or None) != (w.skip_node_operations or None):
        return False
    if a.pool != w.pool or not _owned(actual, wanted):
        return False
    return _same_counter_sets(a.shared_counters, w.shared_counters) and _same_devices(
        a.devices, w.devices
    )


def _owned(actual: ResourceSlice, wanted: ResourceSlice) -> bool:
    want = wanted.metadata.owner_references or []
    have = actual.metadata.owner_references or []
    return all(any(o.uid == h.uid and o.kind == h.kind for h in have) for o in want)


def _same_devices(a: list[Device] | None, b: list[Device] | None) -> bool:
    if a == b:
        return True
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x == y or _comparable(x) == _comparable(y) for x, y in zip(a, b, strict=True))


def _same_counter_sets(a: list[CounterSet] | None, b: list[CounterSet] | None) -> bool:
    if a == b:
        return True
    if a is None or b is None or len(a) != len(b):
        return False
    return all(
        x.name == y.name and _counters(x.counters) == _counters(y.counters)
        for x, y in zip(a, b, strict=True)
    )


def _comparable(device: Device) -> Device:
    """The device with server-set taint times dropped and quantities spelled one way."""
    capacity = {
        name: msgspec.structs.replace(cap, value=_normal_quantity(cap.value))
        for name, cap in (device.capacity or {}).items()
    }
    consumes = [
        msgspec.structs.replace(c, counters=_counters(c.counters))
        for c in device.consumes_counters or []
    ]
    return msgspec.structs.replace(
        device,
        capacity=capacity or None,
        consumes_counters=consumes or None,
        taints=[_untimed(t) for t in device.taints or []] or None,
    )


def _counters(counters: dict[str, Counter]) -> dict[str, Counter]:
    return {name: Counter(value=_normal_quantity(c.value)) for name, c in counters.items()}


@functools.lru_cache(maxsize=4096)
def _normal_quantity(text: str) -> str:
    try:
        value = quantity.parse(text)
    except quantity.QuantityError:
        return text
    return quantity.format_int(value.numerator) if value.denominator == 1 else str(value)


def _untimed(taint: DeviceTaint) -> DeviceTaint:
    return msgspec.structs.replace(taint, time_added=None) if taint.time_added else taint
