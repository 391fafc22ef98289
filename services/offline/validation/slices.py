"""A ResourceSlice's spec (validateResourceSliceSpec): driver and pool, nodes, devices and
the counter sets they consume, partitionTypeAttribute and skipNodeOperations (1.37)."""

from __future__ import annotations

from services.core.kube.resource import Device, ResourceSlice, ResourceSliceSpec
from services.offline.validation.attributes import as_go_json, has_lists
from services.offline.validation.counters import counter_sets, slice_counter_totals
from services.offline.validation.devices import device
from services.offline.validation.fields import invalid, required
from services.offline.validation.lists import by_name, check_set
from services.offline.validation.names import driver_name, fully_qualified_name, pool_name
from services.offline.validation.nodes import skip_node_operations, slice_nodes
from services.offline.validation.rules import Rules

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64  # with taints, consumed counters (and, from 1.36, list attributes)


def validate_slice(slice_: ResourceSlice, rules: Rules) -> list[str]:
    """validateResourceSliceSpec (Kubernetes 1.<rules.minor>)."""
    spec = slice_.spec
    errors = driver_name(spec.driver, "spec.driver")
    errors += pool_name(spec.pool.name, "spec.pool.name")
    if spec.pool.resource_slice_count <= 0:
        errors.append(
            invalid(
                "spec.pool.resourceSliceCount",
                spec.pool.resource_slice_count,
                "must be greater than zero",
            )
        )
    if spec.pool.generation < 0:
        errors.append(
            invalid(
                "spec.pool.generation",
                spec.pool.generation,
                "must be greater than or equal to zero",
            )
        )
    errors += slice_nodes(spec)
    if rules.minor >= 35 and spec.shared_counters is not None and spec.devices is not None:
        errors.append(invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed"))
    errors += _devices(spec, rules)
    if rules.minor < 35:
        errors += slice_counter_totals(spec)
    errors += counter_sets(spec.shared_counters or [], rules)
    if rules.minor >= 37 and spec.partition_type_attribute is not None:
        errors += _partition_type(spec)
    if rules.minor >= 37:
        errors += skip_node_operations(spec.skip_node_operations, "spec.skipNodeOperations")
    return errors


def _devices(spec: ResourceSliceSpec, rules: Rules) -> list[str]:
    shared = {c.name: set(c.counters) for c in spec.shared_counters or []}

    def check(i: int, item: Device) -> list[str]:
        return device(item, f"spec.devices[{i}]", spec.per_device_node_selection, rules, shared)

    devices = spec.devices or []
    limit = _max_devices(spec, rules)
    return check_set(devices, limit, "spec.devices", rules, check, by_name, "name")


def _max_devices(spec: ResourceSliceSpec, rules: Rules) -> int:
    """From 1.35 a slice holds fewer devices when one of them uses an advanced feature."""
    devices = spec.devices or []
    advanced = any(d.taints or d.consumes_counters for d in devices)
    if rules.minor >= 36:
        advanced = advanced or any(has_lists(d) for d in devices)
    if rules.minor < 35:
        return MAX_DEVICES
    return MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES


def _partition_type(spec: ResourceSliceSpec) -> list[str]:
    """validatePartitionTypeAttribute (1.37)."""
    name = spec.partition_type_attribute or ""
    devices = spec.devices or []
    if not any(d.consumes_counters for d in devices):
        return [
            invalid(
                "spec.partitionTypeAttribute",
                name,
                "may only be set on a slice which declares devices that consume counters",
            )
        ]
    if fully_qualified_name(name, "spec.partitionTypeAttribute"):
        return []  # reported by declarative validation only (not enforced in 1.37)
    bare = name.removeprefix(spec.driver + "/") if name.startswith(spec.driver + "/") else ""
    errors: list[str] = []
    for i, item in enumerate(devices):
        if not item.consumes_counters:
            continue
        path = f"spec.devices[{i}].attributes[{name}]"
        attributes = item.attributes or {}
        attribute = attributes.get(name) or (attributes.get(bare) if bare else None)
        if attribute is None:
            errors.append(
                required(
                    path,
                    "device consumes counters and `partitionTypeAttribute` names this "
                    "attribute, so it must be set",
                )
            )
        elif attribute.string is None:
            errors.append(
                f"{path}: Invalid value: {as_go_json(attribute)}: must be a string value "
                "because `partitionTypeAttribute` names this attribute"
            )
    return errors
