"""One device of a slice (validateDevice): its name, attributes and capacities, taints,
counter consumption, nodes, binding conditions and node allocatable resources."""

from __future__ import annotations

from services.core.kube.resource import Device, DeviceTaint
from services.offline.validation.allocatable import node_allocatable
from services.offline.validation.attributes import attribute, value_count
from services.offline.validation.binding import binding_conditions
from services.offline.validation.capacity import request_policy
from services.offline.validation.counters import consumed_counters_1_34, consumptions
from services.offline.validation.fields import forbidden, invalid
from services.offline.validation.lists import check_list, key_path
from services.offline.validation.names import dns_label, qualified_name
from services.offline.validation.nodes import device_nodes
from services.offline.validation.rules import Rules
from services.offline.validation.taints import taint

MAX_ENTRIES = 32  # attributes and capacities per device
MAX_ATTRIBUTE_VALUES = 48  # from 1.36, list items counted one by one
MAX_TAINTS = 16
MAX_TAINTS_1_34 = 4
MAX_KEY = 63 + 1 + 32  # attribute and capacity names (domain/ID): cut longer ones when shown


def device(
    item: Device,
    path: str,
    per_device: bool | None,
    rules: Rules,
    shared: dict[str, set[str]],
) -> list[str]:
    """``shared``: the slice's counter sets and their counters, which 1.34 checks each
    consumption against."""
    errors = dns_label(item.name, f"{path}.name")
    errors += _entries(item, path, rules)
    errors += _attributes(item, path, rules)
    errors += _capacities(item, path, rules)

    def check_taint(i: int, one: DeviceTaint) -> list[str]:
        return taint(one, f"{path}.taints[{i}]", rules)

    taint_limit = MAX_TAINTS if rules.minor >= 35 else MAX_TAINTS_1_34
    errors += check_list(item.taints or [], taint_limit, f"{path}.taints", rules, check_taint)[0]
    errors += consumptions(item.consumes_counters or [], f"{path}.consumesCounters", rules)
    if rules.minor < 35:
        errors += consumed_counters_1_34(item, path, shared)
    errors += device_nodes(item, path, per_device)
    errors += binding_conditions(
        item.binding_conditions, item.binding_failure_conditions, path, rules
    )
    if rules.minor >= 37:
        errors += node_allocatable(item, f"{path}.nodeAllocatableResources")
    return errors


def _entries(item: Device, path: str, rules: Rules) -> list[str]:
    """At most 32 attributes and capacities together; from 1.36 at most 48 attribute
    values, a list's items counted one by one."""
    attributes = item.attributes or {}
    errors = []
    entries = len(attributes) + len(item.capacity or {})
    if entries > MAX_ENTRIES:
        errors.append(
            invalid(
                path,
                entries,
                f"the total number of attributes and capacities must not exceed {MAX_ENTRIES}",
            )
        )
    if rules.minor >= 36:
        values = sum(value_count(a) for a in attributes.values())
        if values > MAX_ATTRIBUTE_VALUES:
            errors.append(
                invalid(
                    path,
                    values,
                    f"the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES}",
                )
            )
    return errors


def _attributes(item: Device, path: str, rules: Rules) -> list[str]:
    errors: list[str] = []
    for name, value in (item.attributes or {}).items():
        where = f"{path}.attributes[{name}]"
        errors += qualified_name(name, key_path(f"{path}.attributes", name, MAX_KEY, rules), rules)
        errors += attribute(value, where, rules)
    return errors


def _capacities(item: Device, path: str, rules: Rules) -> list[str]:
    """Each capacity's name; a request policy only on a device allocated more than once."""
    errors: list[str] = []
    multi = bool(item.allow_multiple_allocations)
    for name, capacity in (item.capacity or {}).items():
        where = f"{path}.capacity[{name}]"
        errors += qualified_name(name, key_path(f"{path}.capacity", name, MAX_KEY, rules), rules)
        policy = capacity.request_policy
        if policy is None:
            continue
        if not multi:
            errors.append(
                forbidden(f"{where}.requestPolicy", "allowMultipleAllocations must be true")
            )
        else:
            errors += request_policy(capacity.value, policy, f"{where}.requestPolicy", rules)
    return errors
