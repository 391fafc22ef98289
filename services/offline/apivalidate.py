"""The validation kube-apiserver 1.35 runs on create, for the objects ``gpudra allocate`` reads.

A what-if run must refuse what a cluster would refuse, in the API server's
words (pkg/apis/resource/validation of Kubernetes 1.35: field path, then
``Invalid value: <value>: <why>``, ``Required value``, ``Forbidden``, ``Too
many``, ``Unsupported value``), or a claim that could never be created would
be reported as allocatable. Covered: request and subrequest shape (exactly one
of ``exactly`` / ``firstAvailable``, at most 8 subrequests, names), device
class names, allocation mode and count, CEL selectors compiled in the DRA
environment under the given gates (syntax, types, result type, cost limit),
constraint and config request references, qualified attribute names;
on slices, attribute values (exactly one, semver), capacity request policies
and node selection; DeviceClass selectors.

Each function returns the errors of one object (empty when valid), already
worded; objects here have had disabled fields dropped (structured/admission.py)
first, as PrepareForCreate does before Validate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from services.allocator.cel.env import CelEnvironment
from services.core import names
from services.core.quantity import Quantity, QuantityError
from services.core.resource import (
    CapacityRequestPolicy,
    Device,
    DeviceClass,
    DeviceSelector,
    DeviceSubRequest,
    ExactDeviceRequest,
    ResourceClaim,
    ResourceSlice,
)

MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_CONSTRAINTS = 32
MAX_EXPRESSION = 10 * 1024

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string "
    "of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex "
    "used for validation is '[A-Za-z_][A-Za-z0-9_]*')"
)
_NUM = r"(0|[1-9]\d*)"
_PRE = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD = r"[0-9a-zA-Z-]+"
_SEMVER = re.compile(rf"^{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+{_BUILD}(\.{_BUILD})*)?$")
_REF_MSG = (
    "must be the name of a request in the claim or the name of a request and a "
    "subrequest separated by '/'"
)


# ------------------------------------------------------------------ wording


def _go(value: Any) -> str:
    """A value as field.Error prints it (%q for strings, %d for numbers, JSON otherwise)."""
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def invalid(path: str, value: Any, detail: str) -> str:
    return f"{path}: Invalid value: {_go(value)}: {detail}"


def required(path: str, detail: str = "") -> str:
    return f"{path}: Required value" + (f": {detail}" if detail else "")


def forbidden(path: str, detail: str) -> str:
    return f"{path}: Forbidden: {detail}"


def too_many(path: str, count: int, limit: int) -> str:
    return f"{path}: Too many: {count}: must have at most {limit} items"


def _dns_label(name: str, path: str) -> list[str]:
    return [invalid(path, name, problem) for problem in names.dns1123_label(name)]


def _dns_subdomain(name: str, path: str) -> list[str]:
    return [invalid(path, name, problem) for problem in names.dns1123_subdomain(name)]


def _c_identifier(name: str, path: str) -> list[str]:
    errors = []
    if len(name) > 32:
        errors.append(f"{path}: Too long: may not be more than 32 bytes")
    if not _C_IDENTIFIER.fullmatch(name):
        errors.append(invalid(path, name, _C_IDENTIFIER_MSG))
    return errors


def _qualified_name(name: str, path: str) -> list[str]:
    parts = name.split("/")
    if len(parts) == 1:
        return _c_identifier(parts[0], path)
    errors: list[str] = []
    if len(parts) >= 2:
        domain, ident = parts[0], parts[1]
        if not domain:
            errors.append(invalid(path, "", "the domain must not be empty"))
        else:
            errors += _dns_subdomain(domain, path)
        if not ident:
            errors.append(invalid(path, "", "the name must not be empty"))
        else:
            errors += _c_identifier(ident, path)
    return errors


def _fully_qualified_name(name: str, path: str) -> list[str]:
    errors = _qualified_name(name, path)
    if "/" not in name:
        errors.append(
            invalid(
                path,
                name,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        )
    return errors


# ------------------------------------------------------------------ selectors


def _selectors(selectors: list[DeviceSelector] | None, path: str, env: CelEnvironment) -> list[str]:
    items = selectors or []
    if len(items) > MAX_SELECTORS:
        return [too_many(path, len(items), MAX_SELECTORS)]
    errors: list[str] = []
    for i, selector in enumerate(items):
        if selector.cel is None:
            errors.append(required(f"{path}[{i}].cel"))
            continue
        errors += cel_expression(selector.cel.expression, f"{path}[{i}].cel.expression", env)
    return errors


def cel_expression(expression: str, path: str, env: CelEnvironment) -> list[str]:
    """validateCELSelector: too long, does not compile, or over the cost limit."""
    if len(expression) > MAX_EXPRESSION:
        return [f"{path}: Too long: may not be more than {MAX_EXPRESSION} bytes"]
    compiled = env.compile(expression)
    if compiled.error is None:
        return []
    if compiled.error.startswith("too complex"):
        return [forbidden(path, "too complex, exceeds cost limit")]
    if compiled.error.startswith("program instantiation failed"):
        return [f"{path}: Internal error: {compiled.error}"]
    return [invalid(path, expression, compiled.error)]


# ------------------------------------------------------------------ claims


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


def _body(body: ExactDeviceRequest | DeviceSubRequest, path: str, env: CelEnvironment) -> list[str]:
    errors: list[str] = []
    if not body.device_class_name:
        errors.append(required(f"{path}.deviceClassName"))
    else:
        errors += _dns_subdomain(body.device_class_name, f"{path}.deviceClassName")
    errors += _selectors(body.selectors, f"{path}.selectors", env)
    errors += _allocation_mode(body, path)
    return errors


def _request_names(claim: ResourceClaim) -> dict[str, set[str] | None]:
    names: dict[str, set[str] | None] = {}
    for request in (claim.spec.devices.requests if claim.spec.devices else None) or []:
        subs = request.first_available or []
        names[request.name] = {s.name for s in subs} if subs else None
    return names


def _reference(name: str, path: str, names: dict[str, set[str] | None]) -> list[str]:
    segments = name.split("/")
    if len(segments) > 2:
        return [invalid(path, name, _REF_MSG)]
    errors = [e for segment in segments for e in _dns_label(segment, path)]
    known = segments[0] in names
    if known and len(segments) == 2:
        subs = names[segments[0]]
        known = subs is not None and segments[1] in subs
    if not known:
        errors.append(invalid(path, name, _REF_MSG))
    return errors


def validate_claim(claim: ResourceClaim, env: CelEnvironment) -> list[str]:
    """ValidateResourceClaim's spec rules."""
    devices = claim.spec.devices
    if devices is None:
        return []
    base = "spec.devices"
    errors: list[str] = []
    requests = devices.requests or []
    if len(requests) > MAX_REQUESTS:
        errors.append(too_many(f"{base}.requests", len(requests), MAX_REQUESTS))
    for i, request in enumerate(requests):
        path = f"{base}.requests[{i}]"
        errors += _dns_label(request.name, f"{path}.name")
        if request.exactly is None and not request.first_available:
            errors.append(
                required(path, "exactly one of `exactly` or `firstAvailable` is required")
            )
        elif request.exactly is not None and request.first_available:
            errors.append(
                invalid(
                    path,
                    None,
                    "exactly one of `exactly` or `firstAvailable` is required, "
                    "but multiple fields are set",
                )
            )
        elif request.exactly is not None:
            errors += _body(request.exactly, f"{path}.exactly", env)
        else:
            errors += _subrequests(request.first_available or [], f"{path}.firstAvailable", env)
    names = _request_names(claim)
    errors += _constraints(devices.constraints or [], f"{base}.constraints", names)
    for i, config in enumerate(devices.config or []):
        for j, name in enumerate(config.requests or []):
            errors += _reference(name, f"{base}.config[{i}].requests[{j}]", names)
        if config.opaque is None:
            errors.append(required(f"{base}.config[{i}].opaque"))
    return errors


def _subrequests(subs: list[DeviceSubRequest], path: str, env: CelEnvironment) -> list[str]:
    if len(subs) > MAX_SUBREQUESTS:
        return [too_many(path, len(subs), MAX_SUBREQUESTS)]
    errors: list[str] = []
    for j, sub in enumerate(subs):
        errors += _dns_label(sub.name, f"{path}[{j}].name")
        errors += _body(sub, f"{path}[{j}]", env)
    return errors


def _constraints(
    constraints: Iterable[Any], path: str, names: dict[str, set[str] | None]
) -> list[str]:
    errors: list[str] = []
    items = list(constraints)
    if len(items) > MAX_CONSTRAINTS:
        return [too_many(path, len(items), MAX_CONSTRAINTS)]
    for i, constraint in enumerate(items):
        where = f"{path}[{i}]"
        for j, name in enumerate(constraint.requests or []):
            errors += _reference(name, f"{where}.requests[{j}]", names)
        if constraint.match_attribute is not None:
            errors += _fully_qualified_name(constraint.match_attribute, f"{where}.matchAttribute")
        elif constraint.distinct_attribute is not None:
            errors += _fully_qualified_name(
                constraint.distinct_attribute, f"{where}.distinctAttribute"
            )
        else:
            errors.append(required(f"{where}.matchAttribute"))
    return errors


# ------------------------------------------------------------------ classes


ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"


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


def validate_class(device_class: DeviceClass, env: CelEnvironment) -> list[str]:
    """ValidateDeviceClass's spec rules (selectors and configs)."""
    errors = _selectors(device_class.spec.selectors, "spec.selectors", env)
    for i, config in enumerate(device_class.spec.config or []):
        if config.opaque is None:
            errors.append(required(f"spec.config[{i}].opaque"))
    return errors


# ------------------------------------------------------------------ slices


def validate_slice(slice_: ResourceSlice) -> list[str]:
    """ValidateResourceSlice's spec rules that decide what can be allocated."""
    spec = slice_.spec
    errors: list[str] = []
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
    errors += _node_selection(slice_)
    for i, device in enumerate(spec.devices or []):
        errors += _device(device, f"spec.devices[{i}]")
    return errors


def _node_selection(slice_: ResourceSlice) -> list[str]:
    spec = slice_.spec
    errors: list[str] = []
    chosen = []
    if spec.node_name is not None:
        if spec.node_name:
            chosen.append("`nodeName`")
        else:
            errors.append(
                invalid("spec.nodeName", "", "must be either unset or set to a non-empty string")
            )
    if spec.node_selector is not None:
        chosen.append("`nodeSelector`")
    for field, value in (
        ("allNodes", spec.all_nodes),
        ("perDeviceNodeSelection", spec.per_device_node_selection),
    ):
        if value is True:
            chosen.append(f"`{field}`")
        elif value is False:
            errors.append(invalid(f"spec.{field}", False, "must be either unset or set to true"))
    fields = "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
    if not chosen:
        errors.append(required("spec", f"exactly one of {fields} is required"))
    elif len(chosen) > 1:
        errors.append(
            invalid(
                "spec",
                "{" + ", ".join(chosen) + "}",
                f"exactly one of {fields} is required, but multiple fields are set",
            )
        )
    return errors


def _device(device: Device, path: str) -> list[str]:
    errors = _dns_label(device.name, f"{path}.name")
    for name, attribute in (device.attributes or {}).items():
        where = f"{path}.attributes[{name}]"
        errors += _qualified_name(name, where)
        values: list[object] = [
            v
            for v in (attribute.int_, attribute.bool_, attribute.string, attribute.version)
            if v is not None
        ]
        # 1.36+ list values (DRAListTypeAttributes; dropped on create with the gate off).
        for kind, items in (
            ("bools", attribute.bools),
            ("ints", attribute.ints),
            ("strings", attribute.strings),
            ("versions", attribute.versions),
        ):
            if items is None:
                continue
            values.append(items)
            if not items:
                errors.append(invalid(f"{where}.{kind}", items, "must not be empty if specified"))
            for i, item in enumerate(items if kind == "versions" else []):
                if not _SEMVER.match(str(item)):
                    errors.append(
                        invalid(
                            f"{where}.versions[{i}]",
                            item,
                            "must be a string compatible with semver.org spec 2.0.0",
                        )
                    )
        if attribute.version is not None and not _SEMVER.match(attribute.version):
            errors.append(
                invalid(
                    f"{where}.version",
                    attribute.version,
                    "must be a string compatible with semver.org spec 2.0.0",
                )
            )
        if not values:
            errors.append(invalid(where, "", "exactly one value must be specified"))
        elif len(values) > 1:
            shown = _attribute_json(attribute)
            errors.append(f"{where}: Invalid value: {shown}: exactly one value must be specified")
    multi = bool(device.allow_multiple_allocations)
    for name, capacity in (device.capacity or {}).items():
        where = f"{path}.capacity[{name}]"
        errors += _qualified_name(name, where)
        policy = capacity.request_policy
        if policy is None:
            continue
        if not multi:
            errors.append(
                forbidden(f"{where}.requestPolicy", "allowMultipleAllocations must be true")
            )
        else:
            errors += _policy(capacity.value, policy, f"{where}.requestPolicy")
    return errors


def _attribute_json(attribute: Any) -> str:
    """The attribute as field.Error prints a Go struct (JSON of its Go field names)."""
    fields = {
        "IntValue": attribute.int_,
        "BoolValue": attribute.bool_,
        "StringValue": attribute.string,
        "VersionValue": attribute.version,
    }
    return json.dumps(fields, separators=(",", ":"))


def _q(text: str) -> Quantity:
    return Quantity.parse(text)


def _policy(capacity: str, policy: CapacityRequestPolicy, path: str) -> list[str]:
    try:
        return _policy_checks(_q(capacity), policy, path)
    except QuantityError:
        return []  # the quantity check names it


def _policy_checks(maximum: Quantity, policy: CapacityRequestPolicy, path: str) -> list[str]:
    if policy.valid_values and policy.valid_range is not None:
        return [
            forbidden(
                path,
                'exactly one policy can be specified, cannot specify "validValues" and '
                '"validRange" at the same time',
            )
        ]
    if policy.valid_values:
        if policy.default is None:
            return [required(f"{path}.default", "required when validValues is defined")]
        return _valid_values(
            _q(policy.default), maximum, policy.valid_values, f"{path}.validValues"
        )
    if policy.valid_range is not None:
        if policy.default is None:
            return [required(f"{path}.default", "required when validRange is defined")]
        return _valid_range(_q(policy.default), maximum, policy, f"{path}.validRange")
    return []


def _valid_values(default: Quantity, maximum: Quantity, values: list[str], path: str) -> list[str]:
    errors: list[str] = []
    parsed = [_q(v) for v in values]
    for i in range(len(parsed) - 1):
        if parsed[i].cmp(parsed[i + 1]) > 0:
            errors.append(
                invalid(
                    f"{path}[{i + 1}]",
                    str(parsed[i + 1]),
                    "values must be sorted in ascending order",
                )
            )
    for i, option in enumerate(parsed):
        if option.cmp(maximum) > 0:
            errors.append(
                invalid(
                    f"{path}[{i}]", str(option), f"option is larger than capacity value: {maximum}"
                )
            )
    if not any(option.cmp(default) == 0 for option in parsed):
        errors.append(
            invalid(path, str(default), "default value is not valid according to the requestPolicy")
        )
    return errors


def _valid_range(
    default: Quantity, maximum: Quantity, policy: CapacityRequestPolicy, path: str
) -> list[str]:
    rng = policy.valid_range
    assert rng is not None
    low = _q(rng.min)
    errors: list[str] = []
    if low.cmp(maximum) > 0:
        errors.append(
            invalid(f"{path}.min", str(low), f"min is larger than capacity value: {maximum}")
        )
    if default.cmp(low) < 0:
        errors.append(invalid(f"{path}.min", str(default), f"default is less than min: {low}"))
    high = _q(rng.max) if rng.max is not None else None
    if high is not None:
        if low.cmp(high) > 0:
            errors.append(invalid(f"{path}.max", str(low), f"min is larger than max: {high}"))
        if high.cmp(maximum) > 0:
            errors.append(
                invalid(f"{path}.max", str(high), f"max is larger than capacity value: {maximum}")
            )
        if default.cmp(high) > 0:
            errors.append(invalid(f"{path}.max", str(default), f"default is more than max: {high}"))
    if rng.step is not None:
        step = _q(rng.step)
        one = low.add(step)
        if one.cmp(maximum) > 0:
            errors.append(
                invalid(
                    f"{path}.step",
                    str(step),
                    f"one step {one} is larger than capacity value: {maximum}",
                )
            )
        for value in [default] + ([high] if high is not None else []):
            errors += _on_step(value, low, step, f"{path}.step")
    return errors


def _on_step(value: Quantity, low: Quantity, step: Quantity, path: str) -> list[str]:
    step_value = step.value_ceil()
    if step_value and (value.value_ceil() - low.value_ceil()) % step_value != 0:
        return [
            invalid(
                path, str(value), f"value is not a multiple of a given step ({step}) from ({low})"
            )
        ]
    return []
