"""One device of a slice: its name, attributes, capacities, taints, counters and nodes."""

from __future__ import annotations

from services.core.kube.resource import Device, DeviceTaint
from services.offline.slicecheck.counters import consumptions
from services.offline.slicecheck.limits import Limits
from services.offline.slicecheck.names import dns_label, label_key, label_value, qualified_name
from services.offline.slicecheck.problem import Problem
from services.offline.slicecheck.values import attribute, list_values, quantity_value

_TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


def check_device(device: Device, path: str, per_device: bool, limits: Limits) -> list[Problem]:
    """``per_device``: the slice leaves each device to name its nodes."""
    problems = dns_label(device.name, f"{path}.name")
    attrs, caps = device.attributes or {}, device.capacity or {}
    if len(attrs) + len(caps) > 32:
        problems.append(
            Problem(path, f"at most 32 attributes and capacities, got {len(attrs) + len(caps)}")
        )
    problems += _attributes(device, path, limits)
    problems += _capacities(device, path)
    problems += _taints(device.taints or [], f"{path}.taints", limits)
    problems += consumptions(device.consumes_counters or [], f"{path}.consumesCounters", limits)
    return problems + _nodes(device, path, per_device)


def _attributes(device: Device, path: str, limits: Limits) -> list[Problem]:
    """Each attribute's name and value; from 1.36 the values of all of them bounded."""
    problems: list[Problem] = []
    attrs = device.attributes or {}
    for name, attr in attrs.items():
        problems += qualified_name(name, f"{path}.attributes[{name}]")
        problems += attribute(attr, f"{path}.attributes[{name}]", limits.list_attributes)
    if limits.list_attributes:
        values = sum(len(list_values(a)[1] or [None]) for a in attrs.values())
        if values > limits.max_attribute_values:
            problems.append(
                Problem(
                    path,
                    f"at most {limits.max_attribute_values} attribute values "
                    f"(a list's values count one by one), got {values}",
                )
            )
    return problems


def _capacities(device: Device, path: str) -> list[Problem]:
    """Each capacity's name and quantity; a request policy only on a shared device."""
    problems: list[Problem] = []
    for name, cap in (device.capacity or {}).items():
        where = f"{path}.capacity[{name}]"
        problems += qualified_name(name, where)
        problems += quantity_value(cap.value, f"{where}.value")
        if cap.request_policy is not None and not device.allow_multiple_allocations:
            problems.append(
                Problem(f"{where}.requestPolicy", "needs allowMultipleAllocations: true")
            )
    return problems


def _taints(taints: list[DeviceTaint], path: str, limits: Limits) -> list[Problem]:
    if len(taints) > limits.max_taints:
        return [Problem(path, f"at most {limits.max_taints} taints, got {len(taints)}")]
    problems: list[Problem] = []
    for i, taint in enumerate(taints):
        where = f"{path}[{i}]"
        problems += label_key(taint.key, f"{where}.key")
        if taint.value:
            problems += label_value(taint.value, f"{where}.value")
        if taint.effect not in _TAINT_EFFECTS:
            problems.append(
                Problem(f"{where}.effect", f"must be one of {_TAINT_EFFECTS}, got {taint.effect!r}")
            )
    return problems


def _nodes(device: Device, path: str, per_device: bool) -> list[Problem]:
    """A device names its nodes exactly when its slice says ``perDeviceNodeSelection``."""
    node_fields = [device.node_name, device.node_selector, device.all_nodes]
    set_fields = sum(v is not None for v in node_fields)
    if per_device and set_fields != 1:
        return [Problem(path, "exactly one of nodeName, nodeSelector, allNodes is required")]
    if not per_device and set_fields:
        return [Problem(path, "nodeName/nodeSelector/allNodes need perDeviceNodeSelection")]
    return []
