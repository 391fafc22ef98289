"""Opaque device configurations, in a class, a claim and an allocation result: a driver
and a JSON object of at most 10 KiB (what it means is the driver's to check)."""

from __future__ import annotations

import json

from services.core.kube.resource import (
    DeviceAllocationConfiguration,
    DeviceClaimConfiguration,
    OpaqueDeviceConfiguration,
)
from services.offline.validation.fields import invalid, required, too_long
from services.offline.validation.names import driver_name
from services.offline.validation.references import RequestNames, references
from services.offline.validation.rules import Rules

MAX_CONFIGS = 32
MAX_OPAQUE = 10 * 1024


def opaque(config: OpaqueDeviceConfiguration | None, path: str) -> list[str]:
    """The config at ``path``: a driver's name and its parameters, a JSON object."""
    if config is None:
        return [required(f"{path}.opaque")]
    errors = driver_name(config.driver, f"{path}.opaque.driver")
    size = len(json.dumps(config.parameters, separators=(",", ":")).encode())
    if config.parameters is None:
        errors.append(required(f"{path}.opaque.parameters"))
    elif size > MAX_OPAQUE:
        errors.append(too_long(f"{path}.opaque.parameters", MAX_OPAQUE))
    elif not isinstance(config.parameters, dict):
        errors.append(
            invalid(f"{path}.opaque.parameters", "<value omitted>", "must be a valid JSON object")
        )
    return errors


def claim_config(
    item: DeviceClaimConfiguration | DeviceAllocationConfiguration,
    path: str,
    names: RequestNames,
    rules: Rules,
) -> list[str]:
    """A claim's (or its allocation's) config: the requests it is for, then the config."""
    return references(item.requests, f"{path}.requests", names, rules) + opaque(item.opaque, path)
