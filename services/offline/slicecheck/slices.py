"""One ResourceSlice: its name, driver and pool, nodes, devices and counter sets."""

from __future__ import annotations

from services.core.kube.resource import ResourceSlice, ResourceSliceSpec
from services.core.model import deviceattrs
from services.offline.slicecheck.counters import shared_counters
from services.offline.slicecheck.device import check_device
from services.offline.slicecheck.limits import Limits
from services.offline.slicecheck.names import dns_subdomain, driver_name, pool_name
from services.offline.slicecheck.problem import Problem


def check_one(slice_: ResourceSlice, limits: Limits) -> list[Problem]:
    """Every problem of one slice, as if it were the only one of its pool."""
    problems: list[Problem] = []
    if slice_.metadata.name:
        problems += dns_subdomain(slice_.metadata.name, "metadata.name")
    elif not slice_.metadata.generate_name:
        problems.append(Problem("metadata.name", "required (or metadata.generateName)"))
    return problems + _spec(slice_.spec, "spec", limits)


def _spec(spec: ResourceSliceSpec, path: str, limits: Limits) -> list[Problem]:
    problems = driver_name(spec.driver, f"{path}.driver")
    problems += pool_name(spec.pool.name, f"{path}.pool.name")
    if spec.pool.generation < 0:
        problems.append(Problem(f"{path}.pool.generation", "must be >= 0"))
    if spec.pool.resource_slice_count <= 0:
        problems.append(Problem(f"{path}.pool.resourceSliceCount", "must be > 0"))
    problems += _node_selection(spec, path)
    both = spec.shared_counters is not None and spec.devices is not None
    if limits.split_counters and both:
        problems.append(Problem(path, "only one of sharedCounters or devices may be set (1.35+)"))
    problems += _devices(spec, path, limits)
    problems += shared_counters(spec.shared_counters or [], f"{path}.sharedCounters", limits)
    return problems


def _node_selection(spec: ResourceSliceSpec, path: str) -> list[Problem]:
    problems: list[Problem] = []
    chosen: list[str] = []
    if spec.node_name is not None:
        chosen.append("nodeName")
        problems += dns_subdomain(spec.node_name, f"{path}.nodeName")
    if spec.node_selector is not None:
        chosen.append("nodeSelector")
        if len(spec.node_selector.node_selector_terms) != 1:
            problems.append(
                Problem(f"{path}.nodeSelector.nodeSelectorTerms", "must have exactly one term")
            )
    for flag, value in (
        ("allNodes", spec.all_nodes),
        ("perDeviceNodeSelection", spec.per_device_node_selection),
    ):
        if value is False:
            problems.append(Problem(f"{path}.{flag}", "must be unset or true"))
        elif value:
            chosen.append(flag)
    if len(chosen) != 1:
        problems.append(
            Problem(
                path,
                "exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection "
                f"is required, got {chosen or 'none'}",
            )
        )
    return problems


def _devices(spec: ResourceSliceSpec, path: str, limits: Limits) -> list[Problem]:
    """At most 128 devices (64 with an advanced feature, 1.35+), each named once, and
    (1.34) at most 1024 counters consumed by all of them."""
    devices = spec.devices or []
    lists = limits.list_attributes and any(map(deviceattrs.has_list_attributes, devices))
    advanced = lists or any(d.taints or d.consumes_counters for d in devices)
    limit = limits.max_devices_advanced if advanced else limits.max_devices
    if len(devices) > limit:
        why = (
            " (a device has taints, consumesCounters or a list attribute)"
            if limits.list_attributes
            else " (a device has taints or consumesCounters)"
        )
        why = why if advanced else ""
        return [Problem(f"{path}.devices", f"at most {limit} devices{why}, got {len(devices)}")]
    problems: list[Problem] = []
    seen: set[str] = set()
    total_counters = 0
    for i, device in enumerate(devices):
        where = f"{path}.devices[{i}]"
        if device.name in seen:
            problems.append(Problem(f"{where}.name", f"duplicate device {device.name!r}"))
        seen.add(device.name)
        problems += check_device(device, where, bool(spec.per_device_node_selection), limits)
        total_counters += sum(len(c.counters) for c in device.consumes_counters or [])
    cap = limits.max_device_counters_per_slice
    if cap is not None and total_counters > cap:
        problems.append(
            Problem(f"{path}.devices", f"at most {cap} consumed counters, got {total_counters}")
        )
    return problems
