"""Kubernetes feature gates that change structured allocation, per Kubernetes minor.

These are the API server / scheduler gates (not the driver's own gates in
services.core.model.featuregates): they decide which fields of the inputs count and
which of the upstream allocators runs. Each minor's DRA gates are written as
that release's pkg/features/kube_features.go has them (default, locked to its
default, what it depends on); tests/e2e/local/test_kube_versions.py reads the same
facts back from each release's own reference-allocator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

#: The Kubernetes minors gpudra follows, oldest first, and the one it assumes by default.
MINORS = (34, 35, 36, 37)
DEFAULT_MINOR = 37

DRA = "DynamicResourceAllocation"
NODE_DECLARED_FEATURES = "NodeDeclaredFeatures"
ADMIN_ACCESS = "DRAAdminAccess"
PRIORITIZED_LIST = "DRAPrioritizedList"
PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
DEVICE_TAINTS = "DRADeviceTaints"
DEVICE_TAINT_RULES = "DRADeviceTaintRules"
CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
BINDING_CONDITIONS = "DRADeviceBindingConditions"
DEVICE_STATUS = "DRAResourceClaimDeviceStatus"
EXTENDED_RESOURCE = "DRAExtendedResource"
LIST_TYPE_ATTRIBUTES = "DRAListTypeAttributes"
NODE_ALLOCATABLE_RESOURCES = "DRANodeAllocatableResources"
RESOURCE_POOL_STATUS = "DRAResourcePoolStatus"
FRACTIONAL_CAPACITY_RANGE = "DRAFractionalCapacityRange"
OPTIONAL_NODE_OPERATIONS = "DRAOptionalNodeOperations"
DERIVED_ATTRIBUTES = "DRADerivedAttributes"
COMPATIBILITY_GROUPS = "DRADeviceCompatibilityGroups"
PARTITIONABLE_DEVICES_TYPE = "DRAPartitionableDevicesType"

#: Gate -> the Features field it sets (gates without a field only take part in
#: the dependency checks).
_FIELDS = {
    ADMIN_ACCESS: "admin_access",
    PRIORITIZED_LIST: "prioritized_list",
    PARTITIONABLE_DEVICES: "partitionable_devices",
    DEVICE_TAINTS: "device_taints",
    DEVICE_TAINT_RULES: "device_taint_rules",
    CONSUMABLE_CAPACITY: "consumable_capacity",
    BINDING_CONDITIONS: "binding_conditions",
    DEVICE_STATUS: "device_status",
    EXTENDED_RESOURCE: "extended_resource",
    LIST_TYPE_ATTRIBUTES: "list_type_attributes",
    NODE_ALLOCATABLE_RESOURCES: "node_allocatable_resources",
    RESOURCE_POOL_STATUS: "resource_pool_status",
    FRACTIONAL_CAPACITY_RANGE: "fractional_capacity_range",
    OPTIONAL_NODE_OPERATIONS: "optional_node_operations",
    DERIVED_ATTRIBUTES: "derived_attributes",
    COMPATIBILITY_GROUPS: "compatibility_groups",
    PARTITIONABLE_DEVICES_TYPE: "partitionable_devices_type",
}


@dataclass(frozen=True, slots=True)
class Gate:
    default: bool
    locked: bool = False
    needs: tuple[str, ...] = ()


def _gates(**specs: str) -> dict[str, Gate]:
    """``Name="on|off[ locked][ needs A B]"`` -> Gate, for the tables below."""
    table = {}
    for name, spec in specs.items():
        words = spec.split()
        needs = tuple(words[words.index("needs") + 1 :]) if "needs" in words else ()
        table[name] = Gate(words[0] == "on", "locked" in words, needs)
    return table


_D = f"needs {DRA}"
#: minor -> gate -> what that release says of it (1.34 has no dependency table).
GATES: Mapping[int, Mapping[str, Gate]] = {
    34: _gates(
        DynamicResourceAllocation="on",
        DRAAdminAccess="on",
        DRAPrioritizedList="on",
        DRAPartitionableDevices="off",
        DRADeviceTaints="off",
        DRAConsumableCapacity="off",
        DRADeviceBindingConditions="off",
        DRAResourceClaimDeviceStatus="on",
        DRAExtendedResource="off",
    ),
    35: _gates(
        DynamicResourceAllocation="on locked",
        DRAAdminAccess=f"on {_D}",
        DRAPrioritizedList=f"on {_D}",
        DRAPartitionableDevices=f"off {_D}",
        DRADeviceTaints=f"off {_D}",
        DRADeviceTaintRules=f"off needs {DEVICE_TAINTS}",
        DRAConsumableCapacity=f"off {_D}",
        DRADeviceBindingConditions=f"off {_D} {DEVICE_STATUS}",
        DRAResourceClaimDeviceStatus="on",
        DRAExtendedResource=f"off {_D}",
    ),
    36: _gates(
        DynamicResourceAllocation="on locked",
        DRAAdminAccess=f"on locked {_D}",
        DRAPrioritizedList=f"on {_D}",
        DRAPartitionableDevices=f"on {_D}",
        DRADeviceTaints=f"on {_D}",
        DRADeviceTaintRules=f"off needs {DEVICE_TAINTS}",
        DRAConsumableCapacity=f"on {_D}",
        DRADeviceBindingConditions=f"on {_D} {DEVICE_STATUS}",
        DRAResourceClaimDeviceStatus="on",
        DRAResourceClaimGranularStatusAuthorization=f"on {_D} {DEVICE_STATUS}",
        DRAExtendedResource=f"on {_D}",
        DRAListTypeAttributes=f"off {_D}",
        DRANodeAllocatableResources=f"off {_D}",
        DRAResourcePoolStatus=f"off {_D}",
    ),
    37: _gates(
        DynamicResourceAllocation="on locked",
        NodeDeclaredFeatures="on locked",
        DRAAdminAccess=f"on locked {_D}",
        DRAPrioritizedList=f"on locked {_D}",
        DRAPartitionableDevices=f"on {_D}",
        DRADeviceTaints=f"on {_D}",
        DRADeviceTaintRules=f"on needs {DEVICE_TAINTS}",
        DRAConsumableCapacity=f"on {_D}",
        DRADeviceBindingConditions=f"on {_D} {DEVICE_STATUS}",
        DRAResourceClaimDeviceStatus="on locked",
        DRAResourceClaimGranularStatusAuthorization=f"on {_D} {DEVICE_STATUS}",
        DRAExtendedResource=f"on locked {_D}",
        DRAListTypeAttributes=f"off {_D}",
        DRANodeAllocatableResources=f"off {_D}",
        DRAResourcePoolStatus=f"off {_D}",
        # Beta "on" only from a minimum compatibility version of 1.37; a 1.37 component's
        # is 1.36 unless told otherwise, so off (the release's own binary says so).
        DRAFractionalCapacityRange=f"off needs {CONSUMABLE_CAPACITY}",
        DRAOptionalNodeOperations=f"off {_D} {NODE_DECLARED_FEATURES}",
        DRADerivedAttributes=f"off {_D}",
        DRADeviceCompatibilityGroups=f"off {_D} {PARTITIONABLE_DEVICES}",
        DRAPartitionableDevicesType=f"off {_D} {PARTITIONABLE_DEVICES} {RESOURCE_POOL_STATUS}",
    ),
}


class FeatureGateError(ValueError):
    """A ``--feature-gates`` value the Kubernetes release would refuse (unknown, locked, a
    dependency off) or a Kubernetes version gpudra does not follow."""


@dataclass(frozen=True, slots=True)
class Features:
    """The gates of one Kubernetes minor that change allocation (default: the newest's)."""

    minor: int = DEFAULT_MINOR
    admin_access: bool = True
    prioritized_list: bool = True
    partitionable_devices: bool = True
    device_taints: bool = True
    device_taint_rules: bool = True
    consumable_capacity: bool = True
    binding_conditions: bool = True
    device_status: bool = True
    extended_resource: bool = True
    list_type_attributes: bool = False
    node_allocatable_resources: bool = False
    resource_pool_status: bool = False
    fractional_capacity_range: bool = False
    optional_node_operations: bool = False
    derived_attributes: bool = False
    compatibility_groups: bool = False
    partitionable_devices_type: bool = False

    @property
    def version(self) -> str:
        return f"1.{self.minor}"

    @property
    def binding_and_status(self) -> bool:
        """The allocator's DeviceBindingAndStatus (kube-scheduler's AllocatorFeatures)."""
        return self.binding_conditions and self.device_status

    def spec(self) -> str:
        """The gates that differ from this minor's defaults, as ``A=true,B=false``."""
        base = defaults(self.minor)
        return ",".join(
            f"{gate}={str(getattr(self, name)).lower()}"
            for gate, name in sorted(_FIELDS.items())
            if gate in GATES[self.minor] and getattr(self, name) != getattr(base, name)
        )


def minor_of(version: str) -> int:
    """``1.37``, ``v1.37.2``, ``1.37.0-rc.1`` or ``37`` -> 37, if gpudra follows it."""
    match = re.fullmatch(r"\s*v?(?:1\.)?(\d+)(?:\.\d+)?(?:[-+][\w.+-]*)?\s*", version)
    if match is None:
        raise FeatureGateError(
            f"expected a Kubernetes version like 1.37 or v1.37.2, got {version!r}"
        )
    minor = int(match.group(1))
    if minor not in MINORS:
        known = ", ".join(f"1.{m}" for m in MINORS)
        raise FeatureGateError(
            f"Kubernetes 1.{minor} is not one gpudra follows (it follows {known})"
        )
    return minor


def defaults(minor: int = DEFAULT_MINOR) -> Features:
    """The gates of Kubernetes 1.<minor> as its components start without --feature-gates."""
    gates = GATES[minor]
    off = {name: False for name in _FIELDS.values()}
    on = {_FIELDS[g]: spec.default for g, spec in gates.items() if g in _FIELDS}
    return Features(minor=minor, **{**off, **on})


def parse(spec: str | None, minor: int = DEFAULT_MINOR) -> Features:
    """``Name=true,Other=false`` on top of 1.<minor>'s defaults, refused as that release
    refuses it: unknown gates, locked gates set the other way, a gate on whose dependency
    is off (component-base's featuregate wording)."""
    gates = GATES[minor]
    values = {name: gate.default for name, gate in gates.items()}
    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        name, sep, raw = (p.strip() for p in item.partition("="))
        if name not in gates:
            raise FeatureGateError(_unknown(name, minor))
        if not sep or raw.lower() not in ("true", "false"):
            raise FeatureGateError(f"feature gate {name}: expected {name}=true|false, got {item!r}")
        value = raw.lower() == "true"
        if gates[name].locked and value != gates[name].default:
            raise FeatureGateError(
                f"cannot set feature gate {name} to {str(value).lower()}, feature is locked "
                f"to {str(gates[name].default).lower()} (Kubernetes 1.{minor})"
            )
        values[name] = value
    for name, gate in sorted(gates.items()):
        off = [dep for dep in gate.needs if values[name] and not values.get(dep, False)]
        if off:
            raise FeatureGateError(
                f"{name} is enabled, but depends on features that are disabled: "
                f"[{' '.join(off)}] (Kubernetes 1.{minor})"
            )
    return replace(defaults(minor), **{_FIELDS[g]: v for g, v in values.items() if g in _FIELDS})


def _unknown(name: str, minor: int) -> str:
    known = ", ".join(sorted(g for g in GATES[minor] if g in _FIELDS))
    since = [m for m in MINORS if name in GATES[m]]
    where = f" (it exists from Kubernetes 1.{since[0]})" if since and since[0] > minor else ""
    return f"unknown feature gate {name!r} in Kubernetes 1.{minor}{where}; known: {known}"


#: The gates kube-scheduler turns into the allocator's own features (AllocatorFeatures).
ALLOCATION_GATES = (
    ADMIN_ACCESS,
    PRIORITIZED_LIST,
    PARTITIONABLE_DEVICES,
    DEVICE_TAINTS,
    CONSUMABLE_CAPACITY,
    BINDING_CONDITIONS,
    DEVICE_STATUS,
    FRACTIONAL_CAPACITY_RANGE,
    LIST_TYPE_ATTRIBUTES,
    OPTIONAL_NODE_OPERATIONS,
    DERIVED_ATTRIBUTES,
    COMPATIBILITY_GROUPS,
)


def accepted_sets(minor: int, vary: tuple[str, ...] = ALLOCATION_GATES) -> list[str]:
    """Every ``--feature-gates`` value over the unlocked gates of ``vary`` that 1.<minor>
    accepts, for the differential tests: a gate whose dependency is off goes with it
    (DRADeviceTaintRules with DRADeviceTaints), a combination that enables a gate without
    its dependency is left out."""
    gates = GATES[minor]
    free = [g for g in vary if g in gates and not gates[g].locked]
    out = []
    for bits in range(1 << len(free)):
        values = {g: bool(bits >> i & 1) for i, g in enumerate(free)}
        for name, gate in sorted(gates.items()):
            if name not in values and gate.default and not gate.locked:
                if any(values.get(dep) is False for dep in gate.needs):
                    values[name] = False
        spec = ",".join(f"{g}={str(v).lower()}" for g, v in values.items())
        try:
            parse(spec, minor)
        except FeatureGateError:
            continue
        out.append(spec)
    return out
