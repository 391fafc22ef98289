"""The validation kube-apiserver runs on create, for the objects ``gpudra allocate`` reads.

A what-if run must refuse what a cluster would refuse, in the API server's
words (pkg/apis/resource/validation of the Kubernetes minor followed, 1.34 to
1.37: field path, then ``Invalid value: <value>: <why>``, ``Required value``,
``Forbidden``, ``Too many``, ``Too long``, ``Duplicate value``, ``Unsupported
value``, ``Not found``), or a claim that could never be created would be
reported as allocatable. Rules follow validation.go function by function:

* claims (validateDeviceClaim): request and subrequest shape and names (unique),
  device class names, selectors (CEL compiled in the DRA environment: syntax,
  types, literals, string.format, cost limit; kube-apiserver's NewExpressions
  environment, which in 1.34 has no lists extension), allocation mode and count,
  tolerations (validateDeviceToleration), derivedAttributes (1.37: referenced by
  a constraint, compiled, total cost), constraints and config request
  references (unique), opaque configs (driver name, parameters);
* claim status (validateAllocationResult, for the scheduler's write): results
  naming known requests, driver, pool and device names, binding conditions,
  tolerations (1.37), shareID (validateUID), skipNodeOperations (1.37), configs,
  the node selector;
* slices (validateResourceSliceSpec): driver and pool names, node selection
  (node name, ValidateNodeSelector with exactly one term, matchFields), devices
  and sharedCounters never together (1.35+), at most 128 devices or 64 with
  taints, consumed counters or (1.36+) list attributes, unique device names,
  per device: attributes and capacities (at most 32; 1.36+ at most 48 values),
  attribute values (one of eight, strings, semver, non-empty lists), capacity
  request policies, taints (at most 16), consumed counters (at most 2),
  per-device node selection, binding conditions, nodeAllocatableResources
  (1.37); counter sets (at most 8, 32 counters); partitionTypeAttribute and
  skipNodeOperations (1.37);
* classes: selectors, configs.

Kubernetes 1.34 differs in these (each keyed on the minor where the rule lives):
a list past its limit has every item checked before Too many (_items; 1.35
stops at Too many), a duplicate is reported at its key's field
(``requests[1].name``, _duplicates), a request with both ``exactly`` and
``firstAvailable`` has both checked (_request), an empty qualified name or part
is a Required value and an unqualified one "must include a domain"
(_qualified_name), an attribute without a value is a Required value, no taint
effect ``None`` (taint_effects), at most 4 taints a device, and counters are
limited per slice (at most 32 in its counter sets, 1024 consumed by its
devices, 32 by one device, each consumed counter one of the slice's own sets:
_slice_counter_totals, _consumed_counters_1_34) where 1.35 limits counter sets
(8) and consumptions (2). Before 1.36 a bad map key is reported at the key
(``attributes[k]``, _key_path).

Checks that only declarative validation makes and 1.37 does not enforce
(compatibilityGroups' size, skipNodeOperations' values) are left out: the
reference allocator, which runs the registry strategies, accepts them. Each
function returns the errors of one object (empty when valid), already worded;
objects here have had disabled fields dropped first (structured/admission.py,
inputs.drop_new_*), as PrepareForCreate does before Validate.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from services.allocator.cel.env import CelEnvironment
from services.allocator.structured.features import Features
from services.core.kube import names
from services.core.kube.quantity import Quantity, QuantityError
from services.core.kube.resource import (
    CapacityRequestPolicy,
    CounterSet,
    Device,
    DeviceAllocationConfiguration,
    DeviceAttribute,
    DeviceClaimConfiguration,
    DeviceClass,
    DeviceClassConfiguration,
    DeviceConstraint,
    DeviceCounterConsumption,
    DeviceDerivedAttribute,
    DeviceRequest,
    DeviceRequestAllocationResult,
    DeviceSelector,
    DeviceSubRequest,
    DeviceTaint,
    ExactDeviceRequest,
    NodeSelector,
    NodeSelectorRequirement,
    ObjectMeta,
    OpaqueDeviceConfiguration,
    ResourceClaim,
    ResourceSlice,
    ResourceSliceSpec,
    Toleration,
)

T = TypeVar("T")

MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_CONSTRAINTS = 32
MAX_EXPRESSION = 10 * 1024
MAX_CONFIGS = 32
MAX_RESULTS = 32
MAX_OPAQUE = 10 * 1024
MAX_BINDING_CONDITIONS = 4
DERIVED_COST_LIMIT = 1_000_000

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


@dataclass(frozen=True, slots=True)
class Rules:
    """What differs by Kubernetes minor and gates in the rules below."""

    minor: int = 37
    consumable_capacity: bool = True
    fractional_range: bool = True  # DRAFractionalCapacityRange (1.37)

    @classmethod
    def of(cls, features: Features | None) -> Rules:
        if features is None:
            return cls()
        return cls(
            minor=features.minor,
            consumable_capacity=features.consumable_capacity,
            fractional_range=features.fractional_capacity_range,
        )


_RULES = Rules()


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


def too_long(path: str, limit: int) -> str:
    return f"{path}: Too long: may not be more than {limit} bytes"


def duplicate(path: str, value: Any) -> str:
    return f"{path}: Duplicate value: {_go(value)}"


def not_supported(path: str, value: Any, supported: Iterable[str]) -> str:
    choices = ", ".join(json.dumps(v) for v in supported)
    return f"{path}: Unsupported value: {_go(value)}: supported values: {choices}"


def not_found(path: str, value: Any) -> str:
    return f"{path}: Not found: {_go(value)}"


def _duplicates(
    keys: Iterable[Any], path: str, rules: Rules = _RULES, field: str = "", shown: Any = None
) -> list[str]:
    """validateSet's uniqueness check: every repeat after the first, at its index (1.34:
    at the key's own field, ``requests[1].name``, as its itemKey names it). ``shown``
    prints a key as field.Duplicate does, when that is not the key itself."""
    seen: set[Any] = set()
    errors: list[str] = []
    suffix = f".{field}" if field and rules.minor < 35 else ""
    for i, key in enumerate(keys):
        if key in seen:
            errors.append(duplicate(f"{path}[{i}]{suffix}", shown(key) if shown else key))
        seen.add(key)
    return errors


def _items(
    items: Sequence[T],
    limit: int,
    path: str,
    rules: Rules,
    check: Callable[[int, T], list[str]],
) -> tuple[list[str], bool]:
    """validateSlice: each item's errors, then Too many past ``limit`` (negative: none).
    From 1.35 Too many is the only error of a list past its limit (the check stops
    there, "for DOS protection"); 1.34 checks every item first and adds Too many after
    them. The flag says whether the caller goes on (validateSet's uniqueness check)."""
    over = 0 <= limit < len(items)
    if over and rules.minor >= 35:
        return [too_many(path, len(items), limit)], False
    errors = [e for i, item in enumerate(items) for e in check(i, item)]
    if over:
        errors.append(too_many(path, len(items), limit))
    return errors, True


def _set(
    items: Sequence[T],
    limit: int,
    path: str,
    rules: Rules,
    check: Callable[[int, T], list[str]],
    key: Callable[[T], Any],
    field: str = "",
) -> list[str]:
    """validateSet: :func:`_items`, then every repeated key (``field``: the key's field)."""
    errors, going_on = _items(items, limit, path, rules, check)
    if going_on:
        errors += _duplicates(map(key, items), path, rules, field)
    return errors


def _key_path(path: str, key: str, limit: int, rules: Rules) -> str:
    """Where validateMap reports a bad key: up to 1.35 at the key (``attributes[k]``, a
    key longer than ``limit`` cut in the middle, truncateIfTooLong), from 1.36 at the
    map itself."""
    if rules.minor >= 36:
        return path
    limit = max(limit, 16)
    if len(key) > limit:
        rest = limit - 3
        key = key[: (rest + 1) // 2] + "..." + key[len(key) - rest // 2 :]
    return f"{path}[{key}]"


def _driver_name(name: str, path: str) -> list[str]:
    """ValidateCSIDriverName (the rules for a driver's name)."""
    if not name:
        return [required(path)]
    errors = [too_long(path, 63)] if len(name.encode()) > 63 else []
    return errors + [invalid(path, name, p) for p in names.dns1123_subdomain(name.lower())]


def _pool_name(name: str, path: str) -> list[str]:
    if not name:
        return [required(path)]
    errors = [too_long(path, 253)] if len(name.encode()) > 253 else []
    for part in name.split("/"):
        errors += _dns_subdomain(part, path)
    return errors


def _label_key(key: str, path: str) -> list[str]:
    """metav1validation.ValidateLabelName."""
    return [invalid(path, key, problem) for problem in names.label_key(key)]


def _label_value(value: str, path: str) -> list[str]:
    return [invalid(path, value, problem) for problem in names.label_value(value)]


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


def _qualified_name(name: str, path: str, rules: Rules = _RULES) -> list[str]:
    """validateQualifiedName. 1.34 says an empty name, domain or identifier is a
    Required value (``name required``); from 1.35 they are Invalid ones."""
    old = rules.minor < 35
    if old and not name:
        return [required(path, "name required")]
    parts = name.split("/")
    if len(parts) == 1:
        return _c_identifier(parts[0], path)
    errors: list[str] = []
    if len(parts) >= 2:
        domain, ident = parts[0], parts[1]
        if not domain:
            detail = "the domain must not be empty"
            errors.append(required(path, detail) if old else invalid(path, "", detail))
        else:
            errors += _dns_subdomain(domain, path)
        if not ident:
            detail = "the name must not be empty"
            errors.append(required(path, detail) if old else invalid(path, "", detail))
        else:
            errors += _c_identifier(ident, path)
    return errors


def _fully_qualified_name(name: str, path: str, rules: Rules = _RULES) -> list[str]:
    """validateFullyQualifiedName: a domain is needed (1.34: "must include a domain",
    not said of an empty name)."""
    errors = _qualified_name(name, path, rules)
    if rules.minor < 35:
        if name and "/" not in name:
            errors.append(invalid(path, name, "must include a domain"))
    elif "/" not in name:
        errors.append(
            invalid(
                path,
                name,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        )
    return errors


# ------------------------------------------------------------------ metadata


def validate_meta(meta: ObjectMeta, namespaced: bool) -> list[str]:
    """ValidateObjectMeta's rules for a created object: a name (or generateName) that is
    a DNS subdomain (for claims, slices and classes alike), the namespace a DNS label,
    label keys and values, annotation keys."""
    errors: list[str] = []
    if not meta.name and not meta.generate_name:
        errors.append(required("metadata.name", "name or generateName is required"))
    elif meta.name:
        errors += _dns_subdomain(meta.name, "metadata.name")
    if namespaced and meta.namespace:
        errors += _dns_label(meta.namespace, "metadata.namespace")
    for key, value in (meta.labels or {}).items():
        errors += [invalid("metadata.labels", key, p) for p in names.label_key(key)]
        errors += [invalid("metadata.labels", value, p) for p in names.label_value(value)]
    for key in meta.annotations or {}:
        errors += [invalid("metadata.annotations", key, p) for p in names.label_key(key.lower())]
    return errors


# ------------------------------------------------------------------ selectors


def _selectors(
    selectors: list[DeviceSelector] | None,
    path: str,
    env: CelEnvironment,
    rules: Rules = _RULES,
) -> list[str]:
    def check(i: int, selector: DeviceSelector) -> list[str]:
        if selector.cel is None:
            return [required(f"{path}[{i}].cel")]
        return cel_expression(selector.cel.expression, f"{path}[{i}].cel.expression", env)

    return _items(selectors or [], MAX_SELECTORS, path, rules, check)[0]


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


_TOLERATION_OPERATORS = ("Equal", "Exists")
_TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")  # sets.List: sorted


def taint_effects(minor: int) -> tuple[str, ...]:
    """validDeviceTaintEffects: ``None`` (a taint that only informs) came in 1.35."""
    return _TAINT_EFFECTS if minor >= 35 else ("NoExecute", "NoSchedule")


def _toleration(toleration: Toleration, path: str, rules: Rules = _RULES) -> list[str]:
    """validateDeviceToleration."""
    errors: list[str] = []
    if toleration.key:
        errors += _label_key(toleration.key, f"{path}.key")
    operator = toleration.operator or ""
    value = toleration.value or ""
    if operator == "Exists":
        if value:
            errors.append(invalid(f"{path}.value", value, "must be empty for operator `Exists`"))
    elif operator == "Equal":
        errors += _label_value(value, f"{path}.value")
    elif operator == "":
        errors.append(required(f"{path}.operator"))
    else:
        errors.append(not_supported(f"{path}.operator", operator, _TOLERATION_OPERATORS))
    effects = taint_effects(rules.minor)
    if toleration.effect and toleration.effect not in effects:
        errors.append(not_supported(f"{path}.effect", toleration.effect, effects))
    return errors


def _body(
    body: ExactDeviceRequest | DeviceSubRequest,
    path: str,
    env: CelEnvironment,
    derived: _Derived | None = None,
    request: str = "",
    rules: Rules = _RULES,
) -> list[str]:
    errors: list[str] = []
    if not body.device_class_name:
        errors.append(required(f"{path}.deviceClassName"))
    else:
        errors += _dns_subdomain(body.device_class_name, f"{path}.deviceClassName")
    errors += _selectors(body.selectors, f"{path}.selectors", env, rules)
    if derived is not None:
        errors += derived.check(body.derived_attributes, f"{path}.derivedAttributes", request)
    errors += _allocation_mode(body, path)
    for i, toleration in enumerate(body.tolerations or []):
        errors += _toleration(toleration, f"{path}.tolerations[{i}]", rules)
    return errors


class _Derived:
    """validateDeviceDerivedAttributes (1.37): each name used by a constraint on the
    request, each expression compiled; the claim's total cost bounded."""

    def __init__(self, env: CelEnvironment, constraints: list[DeviceConstraint]) -> None:
        self.env = env
        self.total = 0
        self.used: dict[str, set[str]] = {}
        for constraint in constraints:
            name = constraint.match_attribute or constraint.distinct_attribute
            if name is None:
                continue
            for request in constraint.requests or [""]:
                self.used.setdefault(request, set()).add(name)

    def _referenced(self, name: str, request: str) -> bool:
        parent = request.split("/", 1)[0]
        return any(name in self.used.get(key, ()) for key in ("", request, parent))

    def check(
        self, attrs: list[DeviceDerivedAttribute] | None, path: str, request: str
    ) -> list[str]:
        errors: list[str] = []
        for i, attr in enumerate(attrs or []):
            where = f"{path}[{i}]"
            if attr.name and not self._referenced(attr.name, request):
                errors.append(
                    invalid(
                        f"{where}.name",
                        attr.name,
                        "must be referenced by at least one matchAttribute or "
                        "distinctAttribute constraint targeting this request",
                    )
                )
            if attr.expression:
                errors += self._expression(attr.expression, f"{where}.expression")
        return errors + _duplicates((a.name for a in attrs or []), path)

    def _expression(self, expression: str, path: str) -> list[str]:
        if len(expression) > MAX_EXPRESSION:
            return [too_long(path, MAX_EXPRESSION)]
        compiled = self.env.compile(expression)
        error = compiled.error
        if error is not None and error.startswith("must evaluate to bool"):
            error = None  # a derived attribute is a value, not a match
        if error is None:
            self.total += compiled.cost or 0
            return []
        if error.startswith("too complex"):
            return [forbidden(path, "too complex, exceeds cost limit")]
        if error.startswith("program instantiation failed"):
            return [f"{path}: Internal error: {error}"]
        return [invalid(path, expression, error)]


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


def _references(
    refs: list[str] | None,
    path: str,
    names: dict[str, set[str] | None],
    rules: Rules = _RULES,
) -> list[str]:
    def check(j: int, name: str) -> list[str]:
        return _reference(name, f"{path}[{j}]", names)

    return _set(refs or [], MAX_REQUESTS, path, rules, check, str)


def validate_claim(
    claim: ResourceClaim, env: CelEnvironment, rules: Rules | None = None
) -> list[str]:
    """ValidateResourceClaim's spec rules (validateDeviceClaim)."""
    rules = rules or Rules()
    devices = claim.spec.devices
    if devices is None:
        return []
    base = "spec.devices"
    derived = _Derived(env, devices.constraints or []) if rules.minor >= 37 else None

    def check(i: int, request: DeviceRequest) -> list[str]:
        return _request(request, f"{base}.requests[{i}]", env, derived, rules)

    requests = devices.requests or []
    errors = _set(requests, MAX_REQUESTS, f"{base}.requests", rules, check, _name, "name")
    names = _request_names(claim)
    errors += _constraints(devices.constraints or [], f"{base}.constraints", names, rules)

    def config(i: int, item: DeviceClaimConfiguration) -> list[str]:
        path = f"{base}.config[{i}]"
        return _references(item.requests, f"{path}.requests", names, rules) + _opaque(
            item.opaque, path
        )

    errors += _items(devices.config or [], MAX_CONFIGS, f"{base}.config", rules, config)[0]
    if derived is not None and derived.total > DERIVED_COST_LIMIT:
        errors.append(
            forbidden(
                base,
                "too complex, total cost of derived attribute CEL expressions in the claim "
                "exceeds cost limit",
            )
        )
    return errors


def _name(item: DeviceRequest | DeviceSubRequest | Device | CounterSet) -> str:
    return item.name


def _request(
    request: DeviceRequest,
    path: str,
    env: CelEnvironment,
    derived: _Derived | None,
    rules: Rules,
) -> list[str]:
    """validateDeviceRequest: exactly one of ``exactly`` and ``firstAvailable``. From
    1.35 a request with both or neither says only that; 1.34 checks whichever are
    given first and says it after them."""
    errors = _dns_label(request.name, f"{path}.name")
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


def _opaque(opaque: OpaqueDeviceConfiguration | None, path: str) -> list[str]:
    if opaque is None:
        return [required(f"{path}.opaque")]
    errors = _driver_name(opaque.driver, f"{path}.opaque.driver")
    size = len(json.dumps(opaque.parameters, separators=(",", ":")).encode())
    if opaque.parameters is None:
        errors.append(required(f"{path}.opaque.parameters"))
    elif size > MAX_OPAQUE:
        errors.append(too_long(f"{path}.opaque.parameters", MAX_OPAQUE))
    elif not isinstance(opaque.parameters, dict):
        errors.append(
            invalid(f"{path}.opaque.parameters", "<value omitted>", "must be a valid JSON object")
        )
    return errors


def _subrequests(
    subs: list[DeviceSubRequest],
    path: str,
    env: CelEnvironment,
    derived: _Derived | None = None,
    request: str = "",
    rules: Rules = _RULES,
) -> list[str]:
    def check(j: int, sub: DeviceSubRequest) -> list[str]:
        errors = _dns_label(sub.name, f"{path}[{j}].name")
        return errors + _body(sub, f"{path}[{j}]", env, derived, f"{request}/{sub.name}", rules)

    return _set(subs, MAX_SUBREQUESTS, path, rules, check, _name, "name")


def _constraints(
    constraints: Iterable[Any],
    path: str,
    names: dict[str, set[str] | None],
    rules: Rules | None = None,
) -> list[str]:
    rules = rules or Rules()

    def check(i: int, constraint: Any) -> list[str]:
        where = f"{path}[{i}]"
        errors = _references(constraint.requests, f"{where}.requests", names, rules)
        if constraint.match_attribute is not None:
            match = constraint.match_attribute
            errors += _fully_qualified_name(match, f"{where}.matchAttribute", rules)
        elif constraint.distinct_attribute is not None:
            distinct = constraint.distinct_attribute
            errors += _fully_qualified_name(distinct, f"{where}.distinctAttribute", rules)
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

    return _items(list(constraints), MAX_CONSTRAINTS, path, rules, check)[0]


# ------------------------------------------------------------------ claim status


def _skip_node_operations(ops: list[str] | None, path: str) -> list[str]:
    """validateSkipNodeOperations. (The values and their uniqueness are checked only by
    declarative validation, which 1.37 runs without enforcing for this field: measured,
    reference-allocator accepts ``["Bogus"]``.)"""
    items = ops or []
    if "NodePrepareResources" in items and not {"NodeUnprepareResources", "*"} & set(items):
        return [
            invalid(
                path,
                items,
                "NodePrepareResources cannot be skipped unless NodeUnprepareResources is "
                "also skipped",
            )
        ]
    return []


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


_HEX = frozenset("0123456789abcdefABCDEF")


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


def _binding(
    conditions: list[str] | None,
    failures: list[str] | None,
    path: str,
    rules: Rules = _RULES,
) -> list[str]:
    """validateDeviceBindingParameters."""
    good, bad = conditions or [], failures or []
    errors: list[str] = []
    for field, items in (("bindingConditions", good), ("bindingFailureConditions", bad)):
        where = f"{path}.{field}"

        def check(i: int, item: str, where: str = where) -> list[str]:
            return _label_key(item, f"{where}[{i}]")

        errors += _items(items, MAX_BINDING_CONDITIONS, where, rules, check)[0]
    errors += _duplicates(good, f"{path}.bindingConditions")
    seen: set[str] = set()
    for i, item in enumerate(bad):
        if item in seen:
            errors.append(duplicate(f"{path}.bindingFailureConditions[{i}]", item))
        seen.add(item)
        if item in good:
            errors.append(
                invalid(
                    f"{path}.bindingFailureConditions[{i}]",
                    item,
                    "bindingFailureConditions must not overlap with bindingConditions",
                )
            )
    if not good and bad:
        errors.append(
            invalid(
                f"{path}.bindingConditions",
                good or None,
                "bindingConditions are required to use bindingFailureConditions",
            )
        )
    if not bad and good:
        errors.append(
            invalid(
                f"{path}.bindingFailureConditions",
                bad or None,
                "bindingFailureConditions are required to use bindingConditions",
            )
        )
    return errors


def validate_claim_status(claim: ResourceClaim, rules: Rules | None = None) -> list[str]:
    """validateResourceClaimStatusUpdate for a new status.allocation (what the
    scheduler writes): results and configs against the claim's requests."""
    rules = rules or Rules()
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
    names = _request_names(claim)
    base = "status.allocation.devices"
    devices = allocation.devices

    def result(i: int, result: DeviceRequestAllocationResult) -> list[str]:
        path = f"{base}.results[{i}]"
        errors = _reference(result.request, f"{path}.request", names)
        errors += _driver_name(result.driver, f"{path}.driver")
        errors += _pool_name(result.pool, f"{path}.pool")
        errors += _dns_label(result.device, f"{path}.device")
        errors += _binding(
            result.binding_conditions, result.binding_failure_conditions, path, rules
        )
        if rules.minor >= 37:  # a result's tolerations are checked from 1.37
            for j, toleration in enumerate(result.tolerations or []):
                errors += _toleration(toleration, f"{path}.tolerations[{j}]", rules)
        if result.share_id is not None:
            errors += _uid(result.share_id, f"{path}.shareID")
        if rules.minor >= 37:
            errors += _skip_node_operations(
                result.skip_node_operations, f"{path}.skipNodeOperations"
            )
        return errors

    results = (devices.results if devices else None) or []
    errors += _items(results, MAX_RESULTS, f"{base}.results", rules, result)[0]

    def config(i: int, config: DeviceAllocationConfiguration) -> list[str]:
        path = f"{base}.config[{i}]"
        return _references(config.requests, f"{path}.requests", names, rules) + _opaque(
            config.opaque, path
        )

    configs = (devices.config if devices else None) or []
    errors += _items(configs, 2 * MAX_CONFIGS, f"{base}.config", rules, config)[0]
    if allocation.node_selector is not None:
        errors += _node_selector(allocation.node_selector, "status.allocation.nodeSelector")
    return errors


MAX_RESERVED_FOR = 256
MAX_DEVICE_CONDITIONS = 8


def _reserved_for(consumers: list[Any], rules: Rules = _RULES) -> list[str]:
    """status.reservedFor: at most 256, resource, name and uid given, uids unique (only
    on an allocated claim: validate_claim_status says so after status.devices)."""
    path = "status.reservedFor"

    def check(i: int, consumer: Any) -> list[str]:
        fields = ("resource", "name", "uid")
        return [required(f"{path}[{i}].{f}") for f in fields if not getattr(consumer, f)]

    uid: Callable[[Any], Any] = lambda consumer: consumer.uid  # noqa: E731
    return _set(consumers, MAX_RESERVED_FOR, path, rules, check, uid, "uid")


def _shared_device_id(key: tuple[str, str, str, Any], rules: Rules) -> dict[str, Any]:
    """A SharedDeviceID as field.Error prints it: 1.34 holds its names as unique.Handle
    values, which JSON shows as ``{}``."""
    if rules.minor < 35:
        return {"Driver": {}, "Pool": {}, "Device": {}, "ShareID": {}}
    driver, pool, name, share = key
    return {"Driver": driver, "Pool": pool, "Device": name, "ShareID": share or ""}


def _device_statuses(
    devices: list[dict[str, Any]], allocation: Any, rules: Rules = _RULES
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
        errors += _driver_name(driver, f"{path}.driver")
        errors += _pool_name(pool, f"{path}.pool")
        errors += _dns_label(name, f"{path}.device")
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

    def shown(key: tuple[str, str, str, Any]) -> dict[str, Any]:
        return _shared_device_id(key, rules)

    return errors + _duplicates(keys, "status.devices", rules, "deviceID", shown)


# ------------------------------------------------------------------ node selectors

_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _node_selector(selector: NodeSelector, path: str) -> list[str]:
    """corevalidation.ValidateNodeSelector."""
    terms_path = f"{path}.nodeSelectorTerms"
    terms = selector.node_selector_terms or []
    if not terms:
        return [required(terms_path, "must have at least one node selector term")]
    errors: list[str] = []
    for i, term in enumerate(terms):
        where = f"{terms_path}[{i}]"
        for j, req in enumerate(term.match_expressions or []):
            errors += _requirement(req, f"{where}.matchExpressions[{j}]")
        for j, req in enumerate(term.match_fields or []):
            errors += _field_requirement(req, f"{where}.matchFields[{j}]")
    return errors


def _requirement(req: NodeSelectorRequirement, path: str) -> list[str]:
    values = req.values or []
    errors: list[str] = []
    if req.operator in ("In", "NotIn"):
        if not values:
            errors.append(
                required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'")
            )
    elif req.operator in ("Exists", "DoesNotExist"):
        if values:
            errors.append(
                forbidden(
                    f"{path}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    elif req.operator in ("Gt", "Lt"):
        if len(values) != 1:
            errors.append(
                required(
                    f"{path}.values",
                    "must be specified single value when `operator` is 'Lt' or 'Gt'",
                )
            )
    else:
        errors.append(invalid(f"{path}.operator", req.operator, "not a valid selector operator"))
    errors += _label_key(req.key, f"{path}.key")
    for i, value in enumerate(values):
        errors += _label_value(value, f"{path}.values[{i}]")
    return errors


def _field_requirement(req: NodeSelectorRequirement, path: str) -> list[str]:
    values = req.values or []
    errors: list[str] = []
    if req.operator in ("In", "NotIn"):
        if len(values) != 1:
            errors.append(
                required(
                    f"{path}.values",
                    "must be only one value when `operator` is 'In' or 'NotIn' for node field "
                    "selector",
                )
            )
    else:
        errors.append(invalid(f"{path}.operator", req.operator, "not a valid selector operator"))
    if req.key != "metadata.name":
        errors.append(invalid(f"{path}.key", req.key, "not a valid field selector key"))
    else:
        for i, value in enumerate(values):
            errors += _dns_subdomain(value, f"{path}.values[{i}]")
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


def validate_class(
    device_class: DeviceClass, env: CelEnvironment, rules: Rules = _RULES
) -> list[str]:
    """ValidateDeviceClass's spec rules (selectors, configs, extendedResourceName)."""
    errors = _selectors(device_class.spec.selectors, "spec.selectors", env, rules)

    def config(i: int, config: DeviceClassConfiguration) -> list[str]:
        return _opaque(config.opaque, f"spec.config[{i}]")

    errors += _items(device_class.spec.config or [], MAX_CONFIGS, "spec.config", rules, config)[0]
    name = device_class.spec.extended_resource_name
    if name is not None and not _extended_resource_name(name):
        errors.append(
            invalid("spec.extendedResourceName", name, "must be a valid extended resource name")
        )
    return errors


def _extended_resource_name(name: str) -> bool:
    """v1helper.IsExtendedResourceName: not native (no ``/``, or ``kubernetes.io/`` in
    it), not ``requests.``-prefixed, and a qualified name once so prefixed."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return not names.label_key(f"requests.{name}")


# ------------------------------------------------------------------ slices


def validate_slice(slice_: ResourceSlice, rules: Rules | None = None) -> list[str]:
    """validateResourceSliceSpec (Kubernetes 1.<rules.minor>)."""
    rules = rules or Rules()
    spec = slice_.spec
    errors = _driver_name(spec.driver, "spec.driver")
    errors += _pool_name(spec.pool.name, "spec.pool.name")
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
    if rules.minor >= 35 and spec.shared_counters is not None and spec.devices is not None:
        errors.append(invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed"))
    shared = {c.name: set(c.counters) for c in spec.shared_counters or []}

    def device(i: int, device: Device) -> list[str]:
        where = f"spec.devices[{i}]"
        return _device(device, where, spec.per_device_node_selection, rules, shared)

    devices = spec.devices or []
    limit = _max_devices(spec, rules)
    errors += _set(devices, limit, "spec.devices", rules, device, _name, "name")
    if rules.minor < 35:
        errors += _slice_counter_totals(spec)
    errors += _counter_sets(spec.shared_counters or [], rules)
    if rules.minor >= 37 and spec.partition_type_attribute is not None:
        errors += _partition_type(spec)
    if rules.minor >= 37:
        errors += _skip_node_operations(spec.skip_node_operations, "spec.skipNodeOperations")
    return errors


MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64  # with taints, consumed counters (and, from 1.36, list attributes)
MAX_ENTRIES = 32  # attributes and capacities per device
MAX_ATTRIBUTE_VALUES = 48  # from 1.36, list items counted one by one
MAX_STRING = 64
MAX_TAINTS = 16
MAX_TAINTS_1_34 = 4
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMPTIONS = 2
MAX_SHARED_COUNTERS_1_34 = 32  # in all counter sets of a slice
MAX_DEVICE_COUNTERS_1_34 = 1024  # consumed by all devices of a slice
MAX_KEY = 63 + 1 + 32  # attribute and capacity names (domain/ID): cut longer ones when shown


def _has_lists(device: Device) -> bool:
    return any(a.is_list for a in (device.attributes or {}).values())


def _value_count(attribute: DeviceAttribute) -> int:
    """numEntriesDeviceAttribute's count for one attribute: its list items, or 1."""
    lists = (attribute.ints, attribute.bools, attribute.strings, attribute.versions)
    items = sum(len(values or []) for values in lists)
    return items or 1


def _max_devices(spec: ResourceSliceSpec, rules: Rules) -> int:
    devices = spec.devices or []
    advanced = any(d.taints or d.consumes_counters for d in devices)
    if rules.minor >= 36:
        advanced = advanced or any(_has_lists(d) for d in devices)
    if rules.minor < 35:
        return MAX_DEVICES
    return MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES


def _node_selection(slice_: ResourceSlice) -> list[str]:
    spec = slice_.spec
    errors: list[str] = []
    chosen = []
    if spec.node_name is not None:
        if spec.node_name:
            chosen.append("`nodeName`")
            errors += _dns_subdomain(spec.node_name, "spec.nodeName")
        else:
            errors.append(
                invalid("spec.nodeName", "", "must be either unset or set to a non-empty string")
            )
    if spec.node_selector is not None:
        chosen.append("`nodeSelector`")
        errors += _node_selector(spec.node_selector, "spec.nodeSelector")
        terms = spec.node_selector.node_selector_terms or []
        if len(terms) != 1:
            errors.append(
                invalid(
                    "spec.nodeSelector.nodeSelectorTerms",
                    [msgspec.to_builtins(t) for t in terms] or None,
                    "must have exactly one node selector term",
                )
            )
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


def _slice_counter_totals(spec: ResourceSliceSpec) -> list[str]:
    """1.34's limits on a slice's counters (1.35 limits each set and consumption
    instead): at most 1024 consumed by its devices, at most 32 in its counter sets."""
    consumed = sum(len(c.counters) for d in spec.devices or [] for c in d.consumes_counters or [])
    errors = []
    if consumed > MAX_DEVICE_COUNTERS_1_34:
        detail = "the total number of counters in devices must not exceed"
        errors.append(invalid("spec.devices", consumed, f"{detail} {MAX_DEVICE_COUNTERS_1_34}"))
    shared = sum(len(c.counters) for c in spec.shared_counters or [])
    if shared > MAX_SHARED_COUNTERS_1_34:
        detail = "the total number of shared counters must not exceed"
        errors.append(
            invalid("spec.sharedCounters", shared, f"{detail} {MAX_SHARED_COUNTERS_1_34}")
        )
    return errors


def _counter_sets(sets: list[CounterSet], rules: Rules) -> list[str]:
    """validateCounterSet over the slice's sets: at most 8 of them (1.35+; 1.34 bounds
    the counters of all sets together, _slice_counter_totals), names unique."""

    def check(i: int, counter_set: CounterSet) -> list[str]:
        path = f"spec.sharedCounters[{i}]"
        errors = _counter_name(counter_set.name, f"{path}.name")
        return errors + _counters(counter_set.counters, f"{path}.counters", rules)

    limit = MAX_COUNTER_SETS if rules.minor >= 35 else -1
    return _set(sets, limit, "spec.sharedCounters", rules, check, _name, "name")


def _counter_name(name: str, path: str) -> list[str]:
    return [required(path)] if not name else _dns_label(name, path)


def _counters(counters: dict[str, Any], path: str, rules: Rules = _RULES) -> list[str]:
    """A counter map: not empty, DNS-label names, at most 32 entries (1.35+; 1.34 bounds
    totals instead)."""
    if not counters:
        return [required(path)]
    if rules.minor >= 35 and len(counters) > MAX_COUNTERS:
        return [too_many(path, len(counters), MAX_COUNTERS)]
    return [e for n in counters for e in _dns_label(n, _key_path(path, n, 63, rules))]


def _device(
    device: Device,
    path: str,
    per_device: bool | None = None,
    rules: Rules | None = None,
    shared: dict[str, set[str]] | None = None,
) -> list[str]:
    """validateDevice. ``shared``: the slice's counter sets and their counters, which
    1.34 checks each consumption against."""
    rules = rules or Rules()
    errors = _dns_label(device.name, f"{path}.name")
    attributes = device.attributes or {}
    entries = len(attributes) + len(device.capacity or {})
    if entries > MAX_ENTRIES:
        errors.append(
            invalid(
                path,
                entries,
                f"the total number of attributes and capacities must not exceed {MAX_ENTRIES}",
            )
        )
    if rules.minor >= 36:
        values = sum(_value_count(a) for a in attributes.values())
        if values > MAX_ATTRIBUTE_VALUES:
            errors.append(
                invalid(
                    path,
                    values,
                    f"the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES}",
                )
            )
    for name, attribute in attributes.items():
        where = f"{path}.attributes[{name}]"
        errors += _qualified_name(
            name, _key_path(f"{path}.attributes", name, MAX_KEY, rules), rules
        )
        errors += _attribute(attribute, where, rules)
    multi = bool(device.allow_multiple_allocations)
    for name, capacity in (device.capacity or {}).items():
        where = f"{path}.capacity[{name}]"
        errors += _qualified_name(name, _key_path(f"{path}.capacity", name, MAX_KEY, rules), rules)
        policy = capacity.request_policy
        if policy is None:
            continue
        if not multi:
            errors.append(
                forbidden(f"{where}.requestPolicy", "allowMultipleAllocations must be true")
            )
        else:
            errors += _policy(capacity.value, policy, f"{where}.requestPolicy", rules)

    def taint(i: int, taint: DeviceTaint) -> list[str]:
        return _taint(taint, f"{path}.taints[{i}]", rules)

    taint_limit = MAX_TAINTS if rules.minor >= 35 else MAX_TAINTS_1_34
    errors += _items(device.taints or [], taint_limit, f"{path}.taints", rules, taint)[0]
    errors += _consumptions(device.consumes_counters or [], f"{path}.consumesCounters", rules)
    if rules.minor < 35:
        errors += _consumed_counters_1_34(device, path, shared or {})
    errors += _device_node(device, path, per_device)
    errors += _binding(device.binding_conditions, device.binding_failure_conditions, path, rules)
    if rules.minor >= 37:
        errors += _node_allocatable(device, f"{path}.nodeAllocatableResources")
    return errors


def _taint(taint: DeviceTaint, path: str, rules: Rules = _RULES) -> list[str]:
    """validateDeviceTaint (the effects by release: taint_effects)."""
    errors = _label_key(taint.key, f"{path}.key")
    if taint.value:
        errors += _label_value(taint.value, f"{path}.value")
    effects = taint_effects(rules.minor)
    if not taint.effect:
        errors.append(required(f"{path}.effect"))
    elif taint.effect not in effects:
        errors.append(not_supported(f"{path}.effect", taint.effect, effects))
    return errors


def _consumptions(items: list[DeviceCounterConsumption], path: str, rules: Rules) -> list[str]:
    """validateDeviceCounterConsumption over a device's entries: at most 2 (1.35+),
    counter sets unique. 1.34 checks only that a counter set is named (its name is
    checked where the set is defined)."""

    def check(i: int, item: DeviceCounterConsumption) -> list[str]:
        where = f"{path}[{i}]"
        if rules.minor >= 35:
            errors = _counter_name(item.counter_set, f"{where}.counterSet")
        else:
            errors = [] if item.counter_set else [required(f"{where}.counterSet")]
        return errors + _counters(item.counters, f"{where}.counters", rules)

    limit = MAX_CONSUMPTIONS if rules.minor >= 35 else -1
    set_name: Callable[[DeviceCounterConsumption], str] = lambda c: c.counter_set  # noqa: E731
    # compatibilityGroups (1.37): at most 2, short names, unique, but only in declarative
    # validation, which 1.37 does not enforce for it (reference-allocator accepts 3).
    return _set(items, limit, path, rules, check, set_name, "counterSet")


def _consumed_counters_1_34(device: Device, path: str, shared: dict[str, set[str]]) -> list[str]:
    """1.34's validateDevice on consumed counters: at most 32 in all of a device's
    entries, each counter set and counter one of the slice's own sharedCounters (from
    1.35 counter sets may live in other slices of the pool)."""
    consumptions = device.consumes_counters or []
    errors = []
    total = sum(len(c.counters) for c in consumptions)
    if total > MAX_COUNTERS:
        detail = f"the total number of counters must not exceed {MAX_COUNTERS}"
        errors.append(invalid(path, total, detail))
    for i, consumption in enumerate(consumptions):
        where = f"{path}.consumesCounters[{i}]"
        names = shared.get(consumption.counter_set)
        if names is None:
            detail = "must reference a counterSet defined in the ResourceSlice sharedCounters"
            errors.append(invalid(f"{where}.counterSet", consumption.counter_set, detail))
            continue
        detail = "must reference a counter defined in the ResourceSlice sharedCounters"
        errors += [invalid(f"{where}.counters", n, detail) for n in consumption.counters
                   if n not in names]  # fmt: skip
    return errors


_PER_DEVICE = (
    "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
    "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
)


def _device_node(device: Device, path: str, per_device: bool | None) -> list[str]:
    errors: list[str] = []
    if per_device:
        chosen = []
        if device.node_name is not None:
            if device.node_name:
                chosen.append("`nodeName`")
                errors += _dns_subdomain(device.node_name, f"{path}.nodeName")
            else:
                errors.append(invalid(f"{path}.nodeName", "", "must not be empty"))
        if device.node_selector is not None:
            chosen.append("`nodeSelector`")
            errors += _node_selector(device.node_selector, f"{path}.nodeSelector")
        if device.all_nodes is not None:
            if device.all_nodes:
                chosen.append("`allNodes`")
            else:
                errors.append(
                    invalid(f"{path}.allNodes", False, "must be either unset or set to true")
                )
        if not chosen:
            errors.append(required(path, _PER_DEVICE))
        elif len(chosen) > 1:
            errors.append(invalid(path, "{" + ", ".join(chosen) + "}", _PER_DEVICE))
    elif (
        device.node_name is not None
        or device.node_selector is not None
        or (device.all_nodes is not None)
    ):
        errors.append(
            invalid(
                path,
                None,
                "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            )
        )
    return errors


def _attribute(attribute: DeviceAttribute, where: str, rules: Rules = _RULES) -> list[str]:
    """validateDeviceAttribute."""
    errors: list[str] = []
    count = 0
    for value in (attribute.int_, attribute.bool_):
        count += value is not None
    if attribute.string is not None:
        count += 1
        if len(attribute.string.encode()) > MAX_STRING:
            errors.append(too_long(f"{where}.string", MAX_STRING))
    if attribute.version is not None:
        count += 1
        errors += _version(attribute.version, f"{where}.version")
    for field, items in (
        ("bools", attribute.bools),
        ("ints", attribute.ints),
        ("strings", attribute.strings),
        ("versions", attribute.versions),
    ):
        if items is None:
            continue
        count += 1
        if not items:
            errors.append(invalid(f"{where}.{field}", [], "must not be empty if specified"))
        if field == "versions":
            for i, item in enumerate(items):
                errors += _version(str(item), f"{where}.versions[{i}]")
    if count == 0:
        detail = "exactly one value must be specified"
        errors.append(required(where, detail) if rules.minor < 35 else invalid(where, "", detail))
    elif count > 1:
        errors.append(
            f"{where}: Invalid value: {_attribute_json(attribute)}: exactly one value must be "
            "specified"
        )
    if attribute.strings:
        for i, item in enumerate(attribute.strings):
            if len(str(item).encode()) > MAX_STRING:
                errors.append(too_long(f"{where}.strings[{i}]", MAX_STRING))
    return errors


def _version(value: str, path: str) -> list[str]:
    errors = []
    if not _SEMVER.match(value):
        errors.append(
            invalid(path, value, "must be a string compatible with semver.org spec 2.0.0")
        )
    if len(value.encode()) > MAX_STRING:
        errors.append(too_long(path, MAX_STRING))
    return errors


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
    if _fully_qualified_name(name, "spec.partitionTypeAttribute"):
        return []  # reported by declarative validation only (not enforced in 1.37)
    bare = name.removeprefix(spec.driver + "/") if name.startswith(spec.driver + "/") else ""
    errors: list[str] = []
    for i, device in enumerate(devices):
        if not device.consumes_counters:
            continue
        path = f"spec.devices[{i}].attributes[{name}]"
        attributes = device.attributes or {}
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
                f"{path}: Invalid value: {_attribute_json(attribute)}: must be a string value "
                "because `partitionTypeAttribute` names this attribute"
            )
    return errors


def _node_allocatable(device: Device, path: str) -> list[str]:
    """validateNodeAllocatableResources (1.37)."""
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
            errors += _allocatable_mapping(mapping, capacities, f"{where}.mapping")
        if isinstance(overhead, dict):
            errors += _allocatable_overhead(overhead, f"{where}.overhead")
    return errors


def _node_allocatable_name(name: str) -> bool:
    """IsNodeAllocatableResourceName: cpu, memory, ephemeral-storage, hugepages-*."""
    return name in ("cpu", "memory", "ephemeral-storage") or name.startswith("hugepages-")


def _sign(text: Any) -> int | None:
    try:
        return Quantity.parse(str(text)).sign()
    except QuantityError:
        return None


def _allocatable_mapping(
    mapping: dict[str, Any], capacities: dict[str, Any], path: str
) -> list[str]:
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


def _allocatable_overhead(overhead: dict[str, Any], path: str) -> list[str]:
    per_pod, per_container = overhead.get("perPod"), overhead.get("perContainer")
    if per_pod is None and per_container is None:
        return [invalid(path, "", "at least one of perPod or perContainer must be set")]
    errors: list[str] = []
    for field, value in (("perPod", per_pod), ("perContainer", per_container)):
        if value is not None and (_sign(value) or 0) < 0:
            errors.append(invalid(f"{path}.{field}", str(value), "must be non-negative"))
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


def _policy(
    capacity: str, policy: CapacityRequestPolicy, path: str, rules: Rules | None = None
) -> list[str]:
    try:
        return _policy_checks(_q(capacity), policy, path, rules or Rules())
    except QuantityError:
        return []  # the quantity check names it


def _policy_checks(
    maximum: Quantity, policy: CapacityRequestPolicy, path: str, rules: Rules
) -> list[str]:
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
            _q(policy.default), maximum, policy.valid_values, f"{path}.validValues", rules
        )
    if policy.valid_range is not None:
        if policy.default is None:
            return [required(f"{path}.default", "required when validRange is defined")]
        return _valid_range(_q(policy.default), maximum, policy, f"{path}.validRange", rules)
    return []


MAX_VALID_VALUES = 10  # CapacityRequestPolicyDiscreteMaxOptions
_NANO = 10**9
_INT64_MAX = 2**63 - 1


def _valid_values(
    default: Quantity, maximum: Quantity, values: list[str], path: str, rules: Rules
) -> list[str]:
    """validateRequestPolicyValidValues: sorted, at most 10, none above the capacity,
    unique (by integer value, or exactly with DRAFractionalCapacityRange), the default
    among them."""
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
    found = False
    over = len(parsed) > MAX_VALID_VALUES
    if over and rules.minor >= 35:  # validateSet stops there from 1.35
        errors.append(too_many(path, len(parsed), MAX_VALID_VALUES))
    else:
        for i, option in enumerate(parsed):
            if option.cmp(maximum) > 0:
                errors.append(
                    invalid(
                        f"{path}[{i}]",
                        str(option),
                        f"option is larger than capacity value: {maximum}",
                    )
                )
            found = found or option.cmp(default) == 0
        if over:
            errors.append(too_many(path, len(parsed), MAX_VALID_VALUES))
        exact = rules.minor >= 37 and rules.fractional_range
        keys = [option.nanos() if exact else option.value_ceil() for option in parsed]
        for i, key in enumerate(keys):
            if key in keys[:i]:
                errors.append(duplicate(f"{path}[{i}]", _key_text(parsed[i], exact)))
    if not found:
        errors.append(
            invalid(path, str(default), "default value is not valid according to the requestPolicy")
        )
    return errors


def _key_text(value: Quantity, exact: bool) -> str:
    """quantityKeyAsDec / quantityKeyInt: what Duplicate value prints."""
    if not exact:
        return str(value.value_ceil())
    nanos = value.nanos()
    whole, fraction = divmod(abs(nanos), _NANO)
    sign = "-" if nanos < 0 else ""
    if fraction == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{fraction:09d}".rstrip("0")


def _valid_range(
    default: Quantity, maximum: Quantity, policy: CapacityRequestPolicy, path: str, rules: Rules
) -> list[str]:
    """validateRequestPolicyRange (1.37 names the default's own field, checks steps in
    milli units with DRAFractionalCapacityRange and bounds the integer path)."""
    rng = policy.valid_range
    assert rng is not None
    new = rules.minor >= 37
    low = _q(rng.min)
    errors: list[str] = []
    if low.cmp(maximum) > 0:
        errors.append(
            invalid(f"{path}.min", str(low), f"min is larger than capacity value: {maximum}")
        )
    if default.cmp(low) < 0:
        at = f"{path}.default" if new else f"{path}.min"
        errors.append(invalid(at, str(default), f"default is less than min: {low}"))
    high = _q(rng.max) if rng.max is not None else None
    if high is not None:
        if low.cmp(high) > 0:
            errors.append(invalid(f"{path}.max", str(low), f"min is larger than max: {high}"))
        if high.cmp(maximum) > 0:
            errors.append(
                invalid(f"{path}.max", str(high), f"max is larger than capacity value: {maximum}")
            )
        if default.cmp(high) > 0:
            at = f"{path}.default" if new else f"{path}.max"
            errors.append(invalid(at, str(default), f"default is more than max: {high}"))
    step = _q(rng.step) if rng.step is not None else None
    named = [("default", default), ("min", low), ("max", high), ("step", step)]
    milli = False
    if new and rules.fractional_range:
        milli = any(_fractional(q) for _, q in named if q is not None)
        unsafe = [
            invalid(f"{path}.{name}", str(q), "value cannot be represented as a milli value")
            for name, q in named
            if q is not None and not _milli_exact(q)
        ]
        if milli and unsafe:
            return errors + unsafe
    if step is None:
        return errors
    if new and step.sign() <= 0:
        return [*errors, invalid(f"{path}.step", str(step), "must be greater than zero")]
    if not new and step.value_ceil() == 0:
        # Upstream 1.35 divides by the step's Value() unchecked: kube-apiserver panics
        # (the request fails with 500, nothing is stored); refused here in words.
        return [
            *errors,
            f"{path}.step: Internal error: kube-apiserver 1.{rules.minor} fails on a step whose "
            "integer value is 0 (integer divide by zero) and stores nothing",
        ]
    one = low.add(step)
    if one.cmp(maximum) > 0:
        errors.append(
            invalid(
                f"{path}.step",
                str(step),
                f"one step {one} is larger than capacity value: {maximum}",
            )
        )
    if new and not milli:
        problems = [
            p for p in (_int64_bound(q, f"{path}.{n}") for n, q in named if q is not None) if p
        ]
        if problems:
            return errors + problems
    for value in [default] + ([high] if high is not None else []):
        errors += _on_step(value, low, step, f"{path}.step", milli)
    return errors


def _fractional(value: Quantity) -> bool:
    return value.nanos() % _NANO != 0


def _milli(value: Quantity) -> int:
    """MilliValue: rounded up to whole thousandths."""
    return -(-value.nanos() // 10**6)


def _milli_exact(value: Quantity) -> bool:
    return value.nanos() % 10**6 == 0 and abs(_milli(value)) <= _INT64_MAX


def _int64_bound(value: Quantity, path: str) -> str | None:
    """validateInt64Range."""
    if value.sign() < 0:
        return invalid(path, str(value), "must be greater than or equal to 0")
    if value.cmp(Quantity(_INT64_MAX)) > 0:
        return invalid(path, str(value), "must not be larger than 9223372036854775807")
    return None


def _on_step(
    value: Quantity, low: Quantity, step: Quantity, path: str, milli: bool = False
) -> list[str]:
    if milli:
        step_value, offset = _milli(step), _milli(value) - _milli(low)
    else:
        step_value, offset = step.value_ceil(), value.value_ceil() - low.value_ceil()
    if step_value and offset % step_value != 0:
        return [
            invalid(
                path, str(value), f"value is not a multiple of a given step ({step}) from ({low})"
            )
        ]
    return []
