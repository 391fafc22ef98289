"""A ResourceClaim's spec (validateDeviceClaim) and who may ask for admin access: requests
and their subrequests, constraints and configs."""

from __future__ import annotations

from services.allocator.cel.env import CelEnvironment
from services.core.kube.resource import (
    DeviceClaimConfiguration,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
    ExactDeviceRequest,
    ResourceClaim,
)
from services.offline.validation.cel import selectors
from services.offline.validation.configs import MAX_CONFIGS, claim_config
from services.offline.validation.derived import DerivedAttributes
from services.offline.validation.fields import forbidden, invalid, required
from services.offline.validation.lists import by_name, check_list, check_set
from services.offline.validation.names import dns_label, dns_subdomain, fully_qualified_name
from services.offline.validation.references import (
    MAX_REQUESTS,
    RequestNames,
    references,
    request_names,
)
from services.offline.validation.rules import Rules
from services.offline.validation.taints import toleration

MAX_SUBREQUESTS = 8
MAX_CONSTRAINTS = 32
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"


def validate_claim(claim: ResourceClaim, env: CelEnvironment, rules: Rules) -> list[str]:
    """ValidateResourceClaim's spec rules (validateDeviceClaim)."""
    devices = claim.spec.devices
    if devices is None:
        return []
    base = "spec.devices"
    derived = DerivedAttributes(env, devices.constraints or []) if rules.minor >= 37 else None

    def check(i: int, request: DeviceRequest) -> list[str]:
        return _request(request, f"{base}.requests[{i}]", env, derived, rules)

    requests = devices.requests or []
    errors = check_set(requests, MAX_REQUESTS, f"{base}.requests", rules, check, by_name, "name")
    names = request_names(claim)
    errors += _constraints(devices.constraints or [], f"{base}.constraints", names, rules)

    def config(i: int, item: DeviceClaimConfiguration) -> list[str]:
        return claim_config(item, f"{base}.config[{i}]", names, rules)

    errors += check_list(devices.config or [], MAX_CONFIGS, f"{base}.config", rules, config)[0]
    if derived is not None:
        errors += derived.total_cost(base)
    return errors


def _request(
    request: DeviceRequest,
    path: str,
    env: CelEnvironment,
    derived: DerivedAttributes | None,
    rules: Rules,
) -> list[str]:
    """validateDeviceRequest: exactly one of ``exactly`` and ``firstAvailable``. From
    1.35 a request with both or neither says only that; 1.34 checks whichever are
    given first and says it after them."""
    errors = dns_label(request.name, f"{path}.name")
    both = request.exactly is not None and bool(request.first_available)
    if rules.minor < 35 or not both:
        if request.first_available:
            errors += _subrequests(
                request.first_available, f"{path}.firstAvailable", env, derived, request.name, rules
            )
        if request.exactly is not None:
            errors += _body(request.exactly, f"{path}.exactly", env, derived, request.name, rules)
    if request.exactly is None and not request.first_available:
        errors.append(required(path, "exactly one of `exactly` or `firstAvailable` is required"))
    elif both:
        errors.append(
            invalid(
                path,
                None,
                "exactly one of `exactly` or `firstAvailable` is required, "
                "but multiple fields are set",
            )
        )
    return errors


def _subrequests(
    subs: list[DeviceSubRequest],
    path: str,
    env: CelEnvironment,
    derived: DerivedAttributes | None,
    request: str,
    rules: Rules,
) -> list[str]:
    def check(j: int, sub: DeviceSubRequest) -> list[str]:
        errors = dns_label(sub.name, f"{path}[{j}].name")
        return errors + _body(sub, f"{path}[{j}]", env, derived, f"{request}/{sub.name}", rules)

    return check_set(subs, MAX_SUBREQUESTS, path, rules, check, by_name, "name")


def _body(
    body: ExactDeviceRequest | DeviceSubRequest,
    path: str,
    env: CelEnvironment,
    derived: DerivedAttributes | None,
    request: str,
    rules: Rules,
) -> list[str]:
    """What a request (``exactly``) and a subrequest both say: class, selectors, derived
    attributes, how many devices, tolerations."""
    errors: list[str] = []
    if not body.device_class_name:
        errors.append(required(f"{path}.deviceClassName"))
    else:
        errors += dns_subdomain(body.device_class_name, f"{path}.deviceClassName")
    errors += selectors(body.selectors, f"{path}.selectors", env, rules)
    if derived is not None:
        errors += derived.check(body.derived_attributes, f"{path}.derivedAttributes", request)
    errors += _allocation_mode(body, path)
    for i, item in enumerate(body.tolerations or []):
        errors += toleration(item, f"{path}.tolerations[{i}]", rules)
    return errors


def _allocation_mode(body: ExactDeviceRequest | DeviceSubRequest, path: str) -> list[str]:
    mode = body.allocation_mode or "ExactCount"
    count = body.count or 0
    if mode == "All":
        if count != 0:
            return [
                invalid(
                    f"{path}.count", count, "must not be specified when allocationMode is 'All'"
                )
            ]
        return []
    if mode == "ExactCount":
        if body.count is not None and count <= 0:
            return [invalid(f"{path}.count", count, "must be greater than zero")]
        return []
    return [
        f'{path}.allocationMode: Unsupported value: "{mode}": supported values: "All", "ExactCount"'
    ]


def _constraints(
    constraints: list[DeviceConstraint], path: str, names: RequestNames, rules: Rules
) -> list[str]:
    def check(i: int, constraint: DeviceConstraint) -> list[str]:
        where = f"{path}[{i}]"
        errors = references(constraint.requests, f"{where}.requests", names, rules)
        if constraint.match_attribute is not None:
            match = constraint.match_attribute
            errors += fully_qualified_name(match, f"{where}.matchAttribute", rules)
        elif constraint.distinct_attribute is not None:
            distinct = constraint.distinct_attribute
            errors += fully_qualified_name(distinct, f"{where}.distinctAttribute", rules)
        elif rules.consumable_capacity:
            errors.append(
                required(
                    where,
                    'exactly one of "matchAttribute" or "distinctAttribute" is required, '
                    "but multiple fields are set",
                )
            )
        else:
            errors.append(required(f"{where}.matchAttribute"))
        return errors

    return check_list(constraints, MAX_CONSTRAINTS, path, rules, check)[0]


def authorized_for_admin(
    claim: ResourceClaim, namespace_labels: dict[str, str] | None
) -> list[str]:
    """AuthorizedForAdmin (pkg/registry/resource): adminAccess needs the namespace label.

    ``namespace_labels`` None: the namespace was not given, and a what-if run
    treats it as one that allows admin access.
    """
    if namespace_labels is None or namespace_labels.get(ADMIN_NAMESPACE_LABEL) == "true":
        return []
    paths = [
        f"spec.devices.requests[{i}].adminAccess"
        for i, request in enumerate(
            (claim.spec.devices.requests if claim.spec.devices else None) or []
        )
        if request.exactly is not None and request.exactly.admin_access
    ]
    allocation = claim.status.allocation if claim.status else None
    results = allocation.devices.results if allocation and allocation.devices else None
    paths += [
        f"status.allocation.devices.results[{i}].adminAccess"
        for i, result in enumerate(results or [])
        if result.admin_access
    ]
    if not paths:
        return []
    return [
        forbidden(
            paths[0],
            f"admin access to devices requires the `{ADMIN_NAMESPACE_LABEL}: true` label on the "
            "containing namespace",
        )
    ]
