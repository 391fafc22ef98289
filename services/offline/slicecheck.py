"""Validate ResourceSlices against what the API server accepts (CONTRACTS.md section 4).

The rules mirror kube-apiserver's ``ValidateResourceSlice`` for resource.k8s.io/v1
in the versions we support, so a slice that passes here is not rejected there.
1.34 and 1.35 differ in how partitionable devices are limited; 1.36 adds list-type
attributes (``ints``, ``bools``, ``strings``, ``versions``), which count as an
advanced feature for the device limit (``ResourceSliceMaxDevicesWithAdvancedFeatures``):

===============================  ==========================  ===========================
rule                             1.34                        1.35+
===============================  ==========================  ===========================
devices per slice                128                         128, 64 with taints/counters
                                                             (1.36+: or a list attribute)
taints per device                4                           16
counter sets                     <= 32 counters in all sets  <= 8 sets x 32 counters
devices and sharedCounters       may share a slice           never in the same slice
counters consumed per device     <= 32 in all entries        <= 2 entries x 32 counters
counters consumed per slice      <= 1024                     (no limit)
list-type attributes             none                        none (1.36+: <= 48 values
                                                             a device, lists not empty)
===============================  ==========================  ===========================

A 1.36 or 1.37 API server stores list-type attributes only with its alpha gate
DRAListTypeAttributes on; that is not visible in a slice, so lists pass here for
those versions (``gpudra slices`` says so when it prints one).

:func:`check_slice` checks one object; :func:`check_pool` also checks what only a
whole pool shows (slice count, generation, unique names, counter references).
Each problem names the field path and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from services.core.kube import quantity
from services.core.kube.resource import (
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCounterConsumption,
    DeviceTaint,
    ResourceSlice,
    ResourceSliceSpec,
)
from services.core.model import deviceattrs

DEFAULT_KUBE_MINOR = 35

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NUM = r"(0|[1-9]\d*)"
_PRE = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD = r"[0-9a-zA-Z-]+"
_SEMVER = re.compile(rf"^{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+{_BUILD}(\.{_BUILD})*)?$")
_TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Limits:
    """The numbers that differ between API versions."""

    max_devices: int = 128
    max_devices_advanced: int = 64  # with taints or consumesCounters (1.35+)
    max_taints: int = 16
    split_counters: bool = True  # devices and sharedCounters never in one slice
    max_counter_sets: int = 8
    max_counters_per_set: int = 32
    max_shared_counters_total: int | None = None
    max_consumptions_per_device: int = 2
    max_counters_per_consumption: int = 32
    max_counters_per_device: int | None = None
    max_device_counters_per_slice: int | None = None
    list_attributes: bool = True  # 1.36+: ints, bools, strings, versions
    max_attribute_values: int = 48  # per device, a list's values counted one by one (1.36+)

    @classmethod
    def for_minor(cls, minor: int) -> Limits:
        if minor >= 36:
            return cls()
        if minor == 35:
            return cls(list_attributes=False)
        return cls(
            list_attributes=False,
            max_devices_advanced=128,
            max_taints=4,
            split_counters=False,
            max_counter_sets=32,
            max_shared_counters_total=32,
            max_consumptions_per_device=32,
            max_counters_per_device=32,
            max_device_counters_per_slice=1024,
        )


@dataclass(frozen=True)
class Problem:
    """One reason the API server would reject (or a consumer misread) a slice."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


SliceLike = ResourceSlice | Mapping[str, Any]


def check_slice(obj: SliceLike, *, kube_minor: int = DEFAULT_KUBE_MINOR) -> list[Problem]:
    """Every problem of one ResourceSlice (object or plain JSON data)."""
    slice_, problems = _load(obj, "")
    if slice_ is None:
        return problems
    return _SliceChecker(Limits.for_minor(kube_minor)).check(slice_)


def check_pool(objs: Sequence[SliceLike], *, kube_minor: int = DEFAULT_KUBE_MINOR) -> list[Problem]:
    """Check each slice, then the pool they form (count, generation, names, counters)."""
    limits = Limits.for_minor(kube_minor)
    loaded: list[tuple[str, ResourceSlice]] = []
    problems: list[Problem] = []
    for i, obj in enumerate(objs):
        where = f"slices[{i}]"
        slice_, errs = _load(obj, where + ".")
        problems += errs
        if slice_ is not None:
            problems += [
                Problem(f"{where}.{p.path}", p.message) for p in _SliceChecker(limits).check(slice_)
            ]
            loaded.append((where, slice_))
    return problems + _PoolChecker(limits).check(loaded)


def _load(obj: SliceLike, prefix: str) -> tuple[ResourceSlice | None, list[Problem]]:
    if isinstance(obj, ResourceSlice):
        return obj, []
    try:
        return msgspec.convert(obj, ResourceSlice), []
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$")
        path = where.rstrip("`").lstrip(".") or "$"
        return None, [Problem(prefix + path, f"not a ResourceSlice: {message}")]


# ------------------------------------------------------------------ name rules


def _dns_label(value: str, path: str) -> list[Problem]:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        return [Problem(path, f"must be a DNS label (<=63 of [a-z0-9-]), got {value!r}")]
    return []


def _dns_subdomain(value: str, path: str, max_len: int = 253) -> list[Problem]:
    if len(value) > max_len or not _DNS_SUBDOMAIN.match(value):
        return [Problem(path, f"must be a DNS subdomain (<={max_len} chars), got {value!r}")]
    return []


def _driver_name(value: str, path: str) -> list[Problem]:
    if not value:
        return [Problem(path, "required")]
    return _dns_subdomain(value.lower(), path, max_len=63)


def _pool_name(value: str, path: str) -> list[Problem]:
    if not value:
        return [Problem(path, "required")]
    if len(value) > 253:
        return [Problem(path, f"must be at most 253 characters, got {len(value)}")]
    return [p for part in value.split("/") for p in _dns_subdomain(part, path)]


def _qualified_name(name: str, path: str) -> list[Problem]:
    """``<C identifier <=32>`` or ``<driver-style domain>/<C identifier <=32>``."""
    parts = name.split("/")
    if len(parts) > 2:
        return [Problem(path, f"at most one '/' allowed in a qualified name, got {name!r}")]
    problems = _driver_name(parts[0], path) if len(parts) == 2 else []
    ident = parts[-1]
    if len(ident) > 32 or not _C_IDENTIFIER.match(ident):
        problems.append(
            Problem(path, f"name must be a C identifier of at most 32 characters, got {ident!r}")
        )
    return problems


def _label_key(key: str, path: str) -> list[Problem]:
    prefix, _, name = key.rpartition("/")
    problems = _dns_subdomain(prefix, path) if prefix else []
    if len(name) > 63 or not _LABEL_NAME.match(name):
        problems.append(Problem(path, f"must be a label name (<=63 chars), got {key!r}"))
    return problems


# ------------------------------------------------------------------ one slice


class _SliceChecker:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def check(self, slice_: ResourceSlice) -> list[Problem]:
        problems: list[Problem] = []
        if slice_.metadata.name:
            problems += _dns_subdomain(slice_.metadata.name, "metadata.name")
        elif not slice_.metadata.generate_name:
            problems.append(Problem("metadata.name", "required (or metadata.generateName)"))
        return problems + self.spec(slice_.spec, "spec")

    def spec(self, spec: ResourceSliceSpec, path: str) -> list[Problem]:
        problems = _driver_name(spec.driver, f"{path}.driver")
        problems += _pool_name(spec.pool.name, f"{path}.pool.name")
        if spec.pool.generation < 0:
            problems.append(Problem(f"{path}.pool.generation", "must be >= 0"))
        if spec.pool.resource_slice_count <= 0:
            problems.append(Problem(f"{path}.pool.resourceSliceCount", "must be > 0"))
        problems += self.node_selection(spec, path)
        both = spec.shared_counters is not None and spec.devices is not None
        if self.limits.split_counters and both:
            problems.append(
                Problem(path, "only one of sharedCounters or devices may be set (1.35+)")
            )
        problems += self.devices(spec, path)
        problems += self.shared_counters(spec.shared_counters or [], f"{path}.sharedCounters")
        return problems

    def node_selection(self, spec: ResourceSliceSpec, path: str) -> list[Problem]:
        problems: list[Problem] = []
        chosen: list[str] = []
        if spec.node_name is not None:
            chosen.append("nodeName")
            problems += _dns_subdomain(spec.node_name, f"{path}.nodeName")
        if spec.node_selector is not None:
            chosen.append("nodeSelector")
            if len(spec.node_selector.node_selector_terms) != 1:
                problems.append(
                    Problem(f"{path}.nodeSelector.nodeSelectorTerms", "must have exactly one term")
                )
        for flag, value in (
            ("allNodes", spec.all_nodes),
            ("perDeviceNodeSelection", spec.per_device_node_selection),
        ):
            if value is False:
                problems.append(Problem(f"{path}.{flag}", "must be unset or true"))
            elif value:
                chosen.append(flag)
        if len(chosen) != 1:
            problems.append(
                Problem(
                    path,
                    "exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection "
                    f"is required, got {chosen or 'none'}",
                )
            )
        return problems

    def devices(self, spec: ResourceSliceSpec, path: str) -> list[Problem]:
        devices = spec.devices or []
        lists = self.limits.list_attributes and any(map(deviceattrs.has_list_attributes, devices))
        advanced = lists or any(d.taints or d.consumes_counters for d in devices)
        limit = self.limits.max_devices_advanced if advanced else self.limits.max_devices
        if len(devices) > limit:
            why = (
                " (a device has taints, consumesCounters or a list attribute)"
                if self.limits.list_attributes
                else " (a device has taints or consumesCounters)"
            )
            why = why if advanced else ""
            return [Problem(f"{path}.devices", f"at most {limit} devices{why}, got {len(devices)}")]
        problems: list[Problem] = []
        seen: set[str] = set()
        total_counters = 0
        for i, device in enumerate(devices):
            where = f"{path}.devices[{i}]"
            if device.name in seen:
                problems.append(Problem(f"{where}.name", f"duplicate device {device.name!r}"))
            seen.add(device.name)
            problems += self.device(device, where, bool(spec.per_device_node_selection))
            total_counters += sum(len(c.counters) for c in device.consumes_counters or [])
        cap = self.limits.max_device_counters_per_slice
        if cap is not None and total_counters > cap:
            problems.append(
                Problem(f"{path}.devices", f"at most {cap} consumed counters, got {total_counters}")
            )
        return problems

    def device(self, device: Device, path: str, per_device: bool) -> list[Problem]:
        problems = _dns_label(device.name, f"{path}.name")
        attrs, caps = device.attributes or {}, device.capacity or {}
        if len(attrs) + len(caps) > 32:
            problems.append(
                Problem(path, f"at most 32 attributes and capacities, got {len(attrs) + len(caps)}")
            )
        for name, attr in attrs.items():
            problems += _qualified_name(name, f"{path}.attributes[{name}]")
            problems += _attribute(attr, f"{path}.attributes[{name}]", self.limits.list_attributes)
        if self.limits.list_attributes:
            values = sum(len(_list_values(a)[1] or [None]) for a in attrs.values())
            if values > self.limits.max_attribute_values:
                problems.append(
                    Problem(
                        path,
                        f"at most {self.limits.max_attribute_values} attribute values "
                        f"(a list's values count one by one), got {values}",
                    )
                )
        for name, cap in caps.items():
            where = f"{path}.capacity[{name}]"
            problems += _qualified_name(name, where)
            problems += _quantity(cap.value, f"{where}.value")
            if cap.request_policy is not None and not device.allow_multiple_allocations:
                problems.append(
                    Problem(f"{where}.requestPolicy", "needs allowMultipleAllocations: true")
                )
        problems += self.taints(device.taints or [], f"{path}.taints")
        problems += self.consumptions(device.consumes_counters or [], f"{path}.consumesCounters")
        node_fields = [device.node_name, device.node_selector, device.all_nodes]
        set_fields = sum(v is not None for v in node_fields)
        if per_device and set_fields != 1:
            problems.append(
                Problem(path, "exactly one of nodeName, nodeSelector, allNodes is required")
            )
        elif not per_device and set_fields:
            problems.append(
                Problem(path, "nodeName/nodeSelector/allNodes need perDeviceNodeSelection")
            )
        return problems

    def taints(self, taints: list[DeviceTaint], path: str) -> list[Problem]:
        if len(taints) > self.limits.max_taints:
            return [Problem(path, f"at most {self.limits.max_taints} taints, got {len(taints)}")]
        problems: list[Problem] = []
        for i, taint in enumerate(taints):
            where = f"{path}[{i}]"
            problems += _label_key(taint.key, f"{where}.key")
            if taint.value and (len(taint.value) > 63 or not _LABEL_VALUE.match(taint.value)):
                problems.append(
                    Problem(f"{where}.value", f"must be a label value, got {taint.value!r}")
                )
            if taint.effect not in _TAINT_EFFECTS:
                problems.append(
                    Problem(
                        f"{where}.effect", f"must be one of {_TAINT_EFFECTS}, got {taint.effect!r}"
                    )
                )
        return problems

    def consumptions(self, items: list[DeviceCounterConsumption], path: str) -> list[Problem]:
        limits = self.limits
        if len(items) > limits.max_consumptions_per_device:
            return [Problem(path, f"at most {limits.max_consumptions_per_device} entries")]
        problems: list[Problem] = []
        seen: set[str] = set()
        for i, item in enumerate(items):
            where = f"{path}[{i}]"
            if item.counter_set in seen:
                problems.append(Problem(f"{where}.counterSet", f"duplicate {item.counter_set!r}"))
            seen.add(item.counter_set)
            problems += _dns_label(item.counter_set, f"{where}.counterSet")
            problems += _counters(item.counters, limits.max_counters_per_consumption, where)
        total = sum(len(item.counters) for item in items)
        if limits.max_counters_per_device is not None and total > limits.max_counters_per_device:
            problems.append(
                Problem(path, f"at most {limits.max_counters_per_device} counters, got {total}")
            )
        return problems

    def shared_counters(self, sets: list[CounterSet], path: str) -> list[Problem]:
        limits = self.limits
        if len(sets) > limits.max_counter_sets:
            return [
                Problem(path, f"at most {limits.max_counter_sets} counter sets, got {len(sets)}")
            ]
        problems: list[Problem] = []
        seen: set[str] = set()
        for i, counter_set in enumerate(sets):
            where = f"{path}[{i}]"
            if counter_set.name in seen:
                problems.append(Problem(f"{where}.name", f"duplicate {counter_set.name!r}"))
            seen.add(counter_set.name)
            problems += _dns_label(counter_set.name, f"{where}.name")
            problems += _counters(counter_set.counters, limits.max_counters_per_set, where)
        total = sum(len(s.counters) for s in sets)
        cap = limits.max_shared_counters_total
        if cap is not None and total > cap:
            problems.append(Problem(path, f"at most {cap} counters in all sets, got {total}"))
        return problems


_LIST_KINDS = ("ints", "bools", "strings", "versions")


def _list_values(attr: DeviceAttribute) -> tuple[str, list[Any] | None]:
    """The attribute's list field and values (("", None) for a scalar)."""
    for kind in _LIST_KINDS:
        values = getattr(attr, kind)
        if values is not None:
            return kind, values
    return "", None


def _attribute(attr: DeviceAttribute, path: str, lists_ok: bool = True) -> list[Problem]:
    scalars = [v for v in (attr.int_, attr.bool_, attr.string, attr.version) if v is not None]
    lists = [kind for kind in _LIST_KINDS if getattr(attr, kind) is not None]
    if lists and not lists_ok:
        return [
            Problem(
                f"{path}.{kind}",
                "list-type attributes need Kubernetes 1.36 or later with its gate "
                "DRAListTypeAttributes on (an older API server drops the field, and then "
                "the attribute has no value)",
            )
            for kind in lists
        ]
    if len(scalars) + len(lists) != 1:
        got = len(scalars) + len(lists)
        kinds = "int, bool, string, version" + (", ints, bools, strings, versions" * lists_ok)
        return [Problem(path, f"exactly one of {kinds}; got {got}")]
    if lists:
        return _list_attribute(attr, path)
    problems: list[Problem] = []
    if attr.int_ is not None:
        problems += _int64(attr.int_, f"{path}.int")
    if attr.string is not None:
        problems += _string(attr.string, f"{path}.string")
    if attr.version is not None:
        problems += _version(attr.version, f"{path}.version")
    return problems


def _list_attribute(attr: DeviceAttribute, path: str) -> list[Problem]:
    kind, values = _list_values(attr)
    assert values is not None
    where = f"{path}.{kind}"
    if not values:
        return [Problem(where, "must not be empty if specified")]
    checks: dict[str, Callable[[Any, str], list[Problem]]] = {
        "ints": _int64,
        "strings": _string,
        "versions": _version,
    }
    check = checks.get(kind)
    if check is None:
        return []
    return [p for i, v in enumerate(values) for p in check(v, f"{where}[{i}]")]


def _int64(value: int, path: str) -> list[Problem]:
    if not -(2**63) <= value < 2**63:
        return [Problem(path, "must fit an int64")]
    return []


def _string(value: str, path: str) -> list[Problem]:
    if len(value) > 64:
        return [Problem(path, f"at most 64 characters, got {len(value)}")]
    return []


def _version(value: str, path: str) -> list[Problem]:
    problems = _string(value, path)
    if not _SEMVER.match(value):
        problems.append(Problem(path, f"must be semver 2.0 (e.g. 9.0.0), got {value!r}"))
    return problems


def _quantity(value: str, path: str) -> list[Problem]:
    try:
        quantity.parse(value)
    except quantity.QuantityError as exc:
        return [Problem(path, str(exc))]
    return []


def _counters(counters: Mapping[str, Any], limit: int, path: str) -> list[Problem]:
    if not counters:
        return [Problem(f"{path}.counters", "required (at least one counter)")]
    if len(counters) > limit:
        return [Problem(f"{path}.counters", f"at most {limit} counters, got {len(counters)}")]
    problems: list[Problem] = []
    for name, counter in counters.items():
        problems += _dns_label(name, f"{path}.counters[{name}]")
        problems += _quantity(counter.value, f"{path}.counters[{name}].value")
    return problems


# ------------------------------------------------------------------ a whole pool


class _PoolChecker:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def check(self, slices: list[tuple[str, ResourceSlice]]) -> list[Problem]:
        if not slices:
            return []
        problems: list[Problem] = []
        first = slices[0][1].spec
        for where, s in slices:
            for field, got, want in (
                ("driver", s.spec.driver, first.driver),
                ("pool.name", s.spec.pool.name, first.pool.name),
                ("pool.generation", s.spec.pool.generation, first.pool.generation),
                ("pool.resourceSliceCount", s.spec.pool.resource_slice_count, len(slices)),
            ):
                if got != want:
                    problems.append(
                        Problem(f"{where}.spec.{field}", f"expected {want!r}, got {got!r}")
                    )
        return problems + self.names(slices) + self.counter_refs(slices)

    def names(self, slices: list[tuple[str, ResourceSlice]]) -> list[Problem]:
        problems: list[Problem] = []
        devices: dict[str, str] = {}
        sets: dict[str, str] = {}
        objects: dict[str, str] = {}
        for where, s in slices:
            if s.metadata.name:
                problems += _duplicate(objects, s.metadata.name, f"{where}.metadata.name")
            for i, d in enumerate(s.spec.devices or []):
                problems += _duplicate(devices, d.name, f"{where}.spec.devices[{i}].name")
            for i, c in enumerate(s.spec.shared_counters or []):
                problems += _duplicate(sets, c.name, f"{where}.spec.sharedCounters[{i}].name")
        return problems

    def counter_refs(self, slices: list[tuple[str, ResourceSlice]]) -> list[Problem]:
        """Every consumed counter exists, in the slice (1.34) or the pool (1.35+), and fits."""
        pool_sets = {c.name: c for _, s in slices for c in s.spec.shared_counters or []}
        problems: list[Problem] = []
        for where, s in slices:
            visible = (
                pool_sets
                if self.limits.split_counters
                else {c.name: c for c in s.spec.shared_counters or []}
            )
            for i, device in enumerate(s.spec.devices or []):
                for j, item in enumerate(device.consumes_counters or []):
                    path = f"{where}.spec.devices[{i}].consumesCounters[{j}]"
                    problems += _consumption_fits(item, visible.get(item.counter_set), path)
        return problems


def _duplicate(seen: dict[str, str], name: str, path: str) -> list[Problem]:
    if name in seen:
        return [Problem(path, f"{name!r} is already used at {seen[name]}")]
    seen[name] = path
    return []


def _consumption_fits(
    item: DeviceCounterConsumption, counter_set: CounterSet | None, path: str
) -> list[Problem]:
    if counter_set is None:
        return [Problem(f"{path}.counterSet", f"no counter set {item.counter_set!r} in scope")]
    problems: list[Problem] = []
    for name, counter in item.counters.items():
        have = counter_set.counters.get(name)
        if have is None:
            problems.append(Problem(f"{path}.counters[{name}]", "not in the counter set"))
            continue
        try:
            if quantity.parse(counter.value) > quantity.parse(have.value):
                problems.append(
                    Problem(f"{path}.counters[{name}]", f"{counter.value} exceeds {have.value}")
                )
        except quantity.QuantityError:
            continue  # reported by the per-slice check
    return problems


def format_problems(problems: Iterable[Problem]) -> str:
    return "\n".join(str(p) for p in problems)
