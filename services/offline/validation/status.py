"""A ResourceClaim's status as the scheduler writes it (validateResourceClaimStatusUpdate
for a new allocation): the results and configs against the claim's requests, who the
claim is reserved for, and the devices' own status."""

from __future__ import annotations

from typing import Any

from services.core.kube.resource import (
    AllocationResult,
    DeviceAllocationConfiguration,
    DeviceRequestAllocationResult,
    ResourceClaim,
    ResourceClaimConsumerReference,
)
from services.offline.validation.binding import binding_conditions
from services.offline.validation.configs import MAX_CONFIGS, claim_config
from services.offline.validation.fields import forbidden, invalid, required, too_many
from services.offline.validation.lists import check_list, check_set, duplicates
from services.offline.validation.names import dns_label, driver_name, pool_name
from services.offline.validation.nodes import node_selector, skip_node_operations
from services.offline.validation.references import RequestNames, reference, request_names
from services.offline.validation.rules import Rules
from services.offline.validation.taints import toleration

MAX_RESULTS = 32
MAX_RESERVED_FOR = 256
MAX_DEVICE_CONDITIONS = 8
_HEX = frozenset("0123456789abcdefABCDEF")

#: A device of the claim: driver, pool, device and shareID.
_DeviceKey = tuple[str, str, str, Any]


def validate_claim_status(claim: ResourceClaim, rules: Rules) -> list[str]:
    """validateResourceClaimStatusUpdate for a new status.allocation (what the
    scheduler writes), run on a claim a what-if run reads already allocated."""
    status = claim.status
    if status is None:
        return []
    consumers = status.reserved_for or []
    errors = _reserved_for(consumers, rules)
    errors += _device_statuses(status.devices or [], status.allocation, rules)
    if consumers and status.allocation is None:
        path = "status.reservedFor"
        errors.append(forbidden(path, "may not be specified when `allocated` is not set"))
    allocation = status.allocation
    if allocation is None:
        return errors
    names = request_names(claim)
    base = "status.allocation.devices"
    devices = allocation.devices

    def result(i: int, item: DeviceRequestAllocationResult) -> list[str]:
        return _result(item, f"{base}.results[{i}]", names, rules)

    results = (devices.results if devices else None) or []
    errors += check_list(results, MAX_RESULTS, f"{base}.results", rules, result)[0]

    def config(i: int, item: DeviceAllocationConfiguration) -> list[str]:
        return claim_config(item, f"{base}.config[{i}]", names, rules)

    configs = (devices.config if devices else None) or []
    errors += check_list(configs, 2 * MAX_CONFIGS, f"{base}.config", rules, config)[0]
    if allocation.node_selector is not None:
        errors += node_selector(allocation.node_selector, "status.allocation.nodeSelector")
    return errors


def _result(
    result: DeviceRequestAllocationResult, path: str, names: RequestNames, rules: Rules
) -> list[str]:
    """One allocated device: the request it is for, the device, and what was copied from
    it (binding conditions, from 1.37 tolerations and skipNodeOperations)."""
    errors = reference(result.request, f"{path}.request", names)
    errors += driver_name(result.driver, f"{path}.driver")
    errors += pool_name(result.pool, f"{path}.pool")
    errors += dns_label(result.device, f"{path}.device")
    errors += binding_conditions(
        result.binding_conditions, result.binding_failure_conditions, path, rules
    )
    if rules.minor >= 37:  # a result's tolerations are checked from 1.37
        for j, item in enumerate(result.tolerations or []):
            errors += toleration(item, f"{path}.tolerations[{j}]", rules)
    if result.share_id is not None:
        errors += _uid(result.share_id, f"{path}.shareID")
    if rules.minor >= 37:
        errors += skip_node_operations(result.skip_node_operations, f"{path}.skipNodeOperations")
    return errors


def _reserved_for(consumers: list[ResourceClaimConsumerReference], rules: Rules) -> list[str]:
    """status.reservedFor: at most 256, resource, name and uid given, uids unique (only
    on an allocated claim: validate_claim_status says so after status.devices)."""
    path = "status.reservedFor"

    def check(i: int, consumer: ResourceClaimConsumerReference) -> list[str]:
        fields = ("resource", "name", "uid")
        return [required(f"{path}[{i}].{f}") for f in fields if not getattr(consumer, f)]

    return check_set(consumers, MAX_RESERVED_FOR, path, rules, check, _consumer_uid, "uid")


def _consumer_uid(consumer: ResourceClaimConsumerReference) -> str:
    return consumer.uid


def _device_statuses(
    devices: list[dict[str, Any]], allocation: AllocationResult | None, rules: Rules
) -> list[str]:
    """status.devices (validateDeviceStatus): names, an allocated device, conditions;
    each device once (1.34 names the key's field, ``deviceID``)."""
    allocated = set()
    results = allocation.devices.results if allocation and allocation.devices else None
    for result in results or []:
        allocated.add((result.driver, result.pool, result.device, result.share_id))
    errors: list[str] = []
    keys = []
    for i, device in enumerate(devices):
        path = f"status.devices[{i}]"
        driver, pool, name = (str(device.get(k) or "") for k in ("driver", "pool", "device"))
        share = device.get("shareID")
        errors += driver_name(driver, f"{path}.driver")
        errors += pool_name(pool, f"{path}.pool")
        errors += dns_label(name, f"{path}.device")
        if share is not None:
            errors += _uid(str(share), f"{path}.shareID")
        key = (driver, pool, name, share or None)
        if (driver, pool, name, share) not in allocated:
            detail = "must be an allocated device in the claim"
            errors.append(invalid(path, _shared_device_id(key, rules), detail))
        conditions = device.get("conditions") or []
        if len(conditions) > MAX_DEVICE_CONDITIONS:
            errors.append(too_many(f"{path}.conditions", len(conditions), MAX_DEVICE_CONDITIONS))
        keys.append(key)

    def shown(key: _DeviceKey) -> dict[str, Any]:
        return _shared_device_id(key, rules)

    return errors + duplicates(keys, "status.devices", rules, "deviceID", shown)


def _shared_device_id(key: _DeviceKey, rules: Rules) -> dict[str, Any]:
    """A SharedDeviceID as field.Error prints it: 1.34 holds its names as unique.Handle
    values, which JSON shows as ``{}``."""
    if rules.minor < 35:
        return {"Driver": {}, "Pool": {}, "Device": {}, "ShareID": {}}
    driver, pool, name, share = key
    return {"Driver": driver, "Pool": pool, "Device": name, "ShareID": share or ""}


def _uid(uid: str, path: str) -> list[str]:
    """validateUID: google/uuid's Validate, then RFC 4122's normalized form."""
    problem = _uuid_problem(uid)
    if problem:
        return [invalid(path, uid, f"error validating uid: {problem}")]
    if len(uid) != 36 or uid != uid.lower():
        return [
            invalid(
                path,
                uid,
                "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` "
                "with lowercase hexadecimal characters",
            )
        ]
    return []


def _uuid_problem(uid: str) -> str | None:
    body = uid
    if len(uid) == 45 and uid[:9].lower() == "urn:uuid:":
        body = uid[9:]
    elif len(uid) == 38 and uid[0] == "{" and uid[-1] == "}":
        body = uid[1:-1]
    elif len(uid) not in (32, 36):
        return f"invalid UUID length: {len(uid)}"
    if len(body) == 36:
        if any(body[k] != "-" for k in (8, 13, 18, 23)):
            return "invalid UUID format"
        body = body.replace("-", "")
    if len(body) != 32 or not all(c in _HEX for c in body):
        return "invalid UUID format"
    return None
