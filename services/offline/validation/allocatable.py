"""A device's nodeAllocatableResources (validateNodeAllocatableResources, 1.37): how much
of a node's cpu, memory or hugepages the device's allocation takes, by capacity or
overhead."""

from __future__ import annotations

from typing import Any

from services.core.kube.quantity import Quantity, QuantityError
from services.core.kube.resource import Device
from services.offline.validation.fields import invalid, not_found, required


def node_allocatable(device: Device, path: str) -> list[str]:
    """Each entry names a node resource and maps a capacity of the device, adds an
    overhead, or both."""
    errors: list[str] = []
    capacities = device.capacity or {}
    for name, entry in (device.node_allocatable_resources or {}).items():
        where = f"{path}[{name}]"
        if not _node_allocatable_name(name):
            errors.append(invalid(where, name, "must be a node allocatable resource name"))
        mapping, overhead = entry.get("mapping"), entry.get("overhead")
        if mapping is None and overhead is None:
            errors.append(required(where, "at least one of mapping or overhead must be set"))
        if isinstance(mapping, dict):
            errors += _mapping(mapping, capacities, f"{where}.mapping")
        if isinstance(overhead, dict):
            errors += _overhead(overhead, f"{where}.overhead")
    return errors


def _node_allocatable_name(name: str) -> bool:
    """IsNodeAllocatableResourceName: cpu, memory, ephemeral-storage, hugepages-*."""
    return name in ("cpu", "memory", "ephemeral-storage") or name.startswith("hugepages-")


def _sign(text: Any) -> int | None:
    try:
        return Quantity.parse(str(text)).sign()
    except QuantityError:
        return None


def _mapping(mapping: dict[str, Any], capacities: dict[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    key, multiplier = mapping.get("capacityKey"), mapping.get("capacityMultiplier")
    if key is not None:
        if key == "":
            errors.append(
                invalid(f"{path}.capacityKey", "", "capacityKey must not be an empty string")
            )
        elif key not in capacities:
            errors.append(not_found(f"{path}.capacityKey", key))
        if multiplier is None:
            errors.append(
                required(
                    f"{path}.capacityMultiplier",
                    "capacityMultiplier is required when capacityKey is set",
                )
            )
        elif (_sign(multiplier) or 0) <= 0:
            errors.append(
                invalid(f"{path}.capacityMultiplier", str(multiplier), "must be positive")
            )
    device_multiplier = mapping.get("deviceMultiplier")
    if device_multiplier is not None and (_sign(device_multiplier) or 0) <= 0:
        errors.append(
            invalid(f"{path}.deviceMultiplier", str(device_multiplier), "must be positive")
        )
    if multiplier is not None and key is None:
        errors.append(
            required(
                f"{path}.capacityKey", "capacityKey is required when capacityMultiplier is set"
            )
        )
    return errors


def _overhead(overhead: dict[str, Any], path: str) -> list[str]:
    per_pod, per_container = overhead.get("perPod"), overhead.get("perContainer")
    if per_pod is None and per_container is None:
        return [invalid(path, "", "at least one of perPod or perContainer must be set")]
    errors: list[str] = []
    for field, value in (("perPod", per_pod), ("perContainer", per_container)):
        if value is not None and (_sign(value) or 0) < 0:
            errors.append(invalid(f"{path}.{field}", str(value), "must be non-negative"))
    return errors
