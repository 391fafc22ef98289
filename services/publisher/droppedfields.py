"""Fields an API server does not store (one of its feature gates is off), and our slices as
such a server stores them.

A field of a gate that is off is dropped on create and update, as the resourceslice
controller finds after a DroppedFieldsError; comparing without it keeps a server that
cannot store it from being rewritten forever. List-type attributes
(DRAListTypeAttributes) are more: a server that cannot store them refuses the whole
slice (the field dropped, the attribute is left without a value: 422).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from services.core.kube.client import ApiError
from services.core.kube.resource import Device, ResourceSlice
from services.core.model import deviceattrs

DropKind = str  # "sharedCounters" | "consumesCounters" | "taints" | "allowMultipleAllocations"
# allowMultipleAllocations stands for it and the capacities' requestPolicy: an API server
# without DRAConsumableCapacity drops both (consumable shares, services/core/model/shares.py).
# listTypeAttributes: attributes written as lists (ints, bools, strings, versions); an
# API server without DRAListTypeAttributes (or older than 1.36) keeps none of them, and
# they are then written as the scalar they stand for (deviceattrs.scalar_attributes).
LIST_ATTRIBUTES: DropKind = "listTypeAttributes"
DROPPABLE: tuple[DropKind, ...] = (
    "sharedCounters",
    "consumesCounters",
    "taints",
    "allowMultipleAllocations",
    LIST_ATTRIBUTES,
)


def without(obj: ResourceSlice, dropped: frozenset[DropKind]) -> ResourceSlice:
    """``obj`` as a server that drops ``dropped`` stores it."""
    if not dropped:
        return obj
    spec = obj.spec
    devices = spec.devices
    if devices and LIST_ATTRIBUTES in dropped:
        devices = deviceattrs.scalar_attributes(devices)
    if devices and dropped & {"consumesCounters", "taints"}:
        devices = [
            msgspec.structs.replace(
                d,
                consumes_counters=None if "consumesCounters" in dropped else d.consumes_counters,
                taints=None if "taints" in dropped else d.taints,
            )
            for d in devices
        ]
    if devices and "allowMultipleAllocations" in dropped:
        devices = [_unshared(d) for d in devices]
    counters = None if "sharedCounters" in dropped else spec.shared_counters
    spec = msgspec.structs.replace(spec, devices=devices, shared_counters=counters)
    return msgspec.structs.replace(obj, spec=spec)


def _unshared(device: Device) -> Device:
    """The device as a server without DRAConsumableCapacity stores it."""
    if not device.allow_multiple_allocations:
        return device
    capacity = {
        name: msgspec.structs.replace(cap, request_policy=None)
        for name, cap in (device.capacity or {}).items()
    }
    return msgspec.structs.replace(
        device, allow_multiple_allocations=None, capacity=capacity or None
    )


def dropped_fields(sent: ResourceSlice, stored: ResourceSlice) -> set[DropKind]:
    """Which droppable fields the server did not keep (compare with :func:`without`)."""
    out = set()
    if sent.spec.shared_counters and not stored.spec.shared_counters:
        out.add("sharedCounters")
    sent_devices = sent.spec.devices or []
    stored_devices = stored.spec.devices or []
    if any(d.consumes_counters for d in sent_devices) and not any(
        d.consumes_counters for d in stored_devices
    ):
        out.add("consumesCounters")
    if any(d.taints for d in sent_devices) and not any(d.taints for d in stored_devices):
        out.add("taints")
    if any(d.allow_multiple_allocations for d in sent_devices) and not any(
        d.allow_multiple_allocations for d in stored_devices
    ):
        out.add("allowMultipleAllocations")
    if has_lists(sent_devices) and not has_lists(stored_devices):
        out.add(LIST_ATTRIBUTES)
    return out


def has_lists(devices: Sequence[Device]) -> bool:
    """Whether any of ``devices`` has a list-type attribute."""
    return any(map(deviceattrs.has_list_attributes, devices))


def refuses_lists(sent: ResourceSlice, exc: ApiError) -> bool:
    """Whether the API server refused ``sent`` for one of its list-type attributes.

    A server without DRAListTypeAttributes drops ``ints`` (and the other lists) on
    create and update, as any field of a gate that is off, and its validation then
    finds the attribute with no value: ``spec.devices[i].attributes[NAME]: Invalid
    value: ...: exactly one value must be specified`` (a 422 naming the attribute)."""
    if exc.status != 422:
        return False
    names = {
        name
        for d in sent.spec.devices or []
        for name, attr in (d.attributes or {}).items()
        if attr.is_list
    }
    return any(f"attributes[{name}]" in exc.message for name in names)
