"""Kubernetes feature gates that change structured allocation, defaulted as in 1.35.

These are the API server / scheduler gates (not the driver's own gates in
services.core.featuregates): they decide which fields of the inputs count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ADMIN_ACCESS = "DRAAdminAccess"
PRIORITIZED_LIST = "DRAPrioritizedList"
PARTITIONABLE_DEVICES = "DRAPartitionableDevices"
DEVICE_TAINTS = "DRADeviceTaints"
CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
BINDING_CONDITIONS = "DRADeviceBindingConditions"

_FIELDS = {
    ADMIN_ACCESS: "admin_access",
    PRIORITIZED_LIST: "prioritized_list",
    PARTITIONABLE_DEVICES: "partitionable_devices",
    DEVICE_TAINTS: "device_taints",
    CONSUMABLE_CAPACITY: "consumable_capacity",
    BINDING_CONDITIONS: "binding_conditions",
}


class FeatureGateError(ValueError):
    """A ``--feature-gates`` value that names an unknown gate or is not ``Name=bool``."""


@dataclass(frozen=True, slots=True)
class Features:
    admin_access: bool = True
    prioritized_list: bool = True
    partitionable_devices: bool = False
    device_taints: bool = False
    consumable_capacity: bool = False
    binding_conditions: bool = False


def parse(spec: str | None) -> Features:
    """``Name=true,Other=false`` on top of the 1.35 defaults."""
    features = Features()
    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        name, sep, raw = (p.strip() for p in item.partition("="))
        if name not in _FIELDS:
            raise FeatureGateError(
                f"unknown feature gate {name!r}; known: {', '.join(sorted(_FIELDS))}"
            )
        if not sep or raw.lower() not in ("true", "false"):
            raise FeatureGateError(f"feature gate {name}: expected {name}=true|false, got {item!r}")
        features = replace(features, **{_FIELDS[name]: raw.lower() == "true"})
    return features
