"""Read DeviceClasses, ResourceSlices, ResourceClaims, DeviceTaintRules, Nodes and Namespaces
from YAML or JSON.

A file may hold several YAML documents, one JSON object, or a ``kind: List``.
Anything we cannot use is refused with :class:`InputError` naming the file and
the document (1-based; ``item`` for entries of a List), so a what-if run never
silently drops an object. Each object is decoded strictly and validated as
kube-apiserver does on create (:mod:`services.offline.strict`,
:mod:`services.offline.validation`), so what a cluster would refuse is refused
here in the API server's words. Namespaces are read first wherever they stand,
as their labels decide whether a claim may ask for adminAccess.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import yaml

from services.allocator.cel.env import CelEnvironment
from services.allocator.structured.admission import admit_claim, admit_slice
from services.allocator.structured.features import DEFAULT_MINOR, Features
from services.allocator.structured.pools import Node
from services.allocator.structured.snapshot import Inputs
from services.core.kube.quantity import Quantity, QuantityError
from services.core.kube.resource import (
    API_VERSION,
    DeviceClass,
    DeviceTaintRule,
    ResourceClaim,
    ResourceSlice,
)
from services.offline import validation
from services.offline.strict import StrictError, strict
from services.offline.validation.rules import Rules
from services.offline.validation.taints import validate_taint_rule


def drop_new_slice_fields(slice_: ResourceSlice, features: Features) -> None:
    """The 1.36/1.37 fields a slice loses on create when their gate is off
    (resourceslice/strategy.go's dropDisabled*Fields; services/allocator/structured/
    admission.py drops the older ones)."""
    spec = slice_.spec
    if not features.partitionable_devices_type:
        spec.partition_type_attribute = None
    if not features.optional_node_operations:
        spec.skip_node_operations = None
    for device in spec.devices or []:
        if not features.node_allocatable_resources:
            device.node_allocatable_resources = None
        if not features.compatibility_groups:
            for consumption in device.consumes_counters or []:
                consumption.compatibility_groups = None
        if not features.list_type_attributes:
            for attribute in (device.attributes or {}).values():
                attribute.ints = attribute.bools = attribute.strings = attribute.versions = None


def drop_new_claim_fields(claim: ResourceClaim, features: Features) -> None:
    """The 1.37 fields a claim loses on create (spec) or on the scheduler's status
    update when their gate is off (resourceclaim/strategy.go)."""
    devices = claim.spec.devices
    if not features.derived_attributes:
        for request in (devices.requests if devices else None) or []:
            if request.exactly is not None:
                request.exactly.derived_attributes = None
            for sub in request.first_available or []:
                sub.derived_attributes = None
    allocation = claim.status.allocation if claim.status else None
    results = allocation.devices.results if allocation and allocation.devices else None
    if not features.optional_node_operations:
        for result in results or []:
            result.skip_node_operations = None


_KINDS: dict[str, type[msgspec.Struct]] = {
    "DeviceClass": DeviceClass,
    "ResourceSlice": ResourceSlice,
    "ResourceClaim": ResourceClaim,
}


# DeviceTaintRule by release: v1alpha3 up to 1.35, v1beta2 from 1.36, v1 from 1.37.
_TAINT_RULE_VERSIONS = {
    34: ("resource.k8s.io/v1alpha3",),
    35: ("resource.k8s.io/v1alpha3",),
    36: ("resource.k8s.io/v1alpha3", "resource.k8s.io/v1beta2"),
    37: ("resource.k8s.io/v1alpha3", "resource.k8s.io/v1beta2", API_VERSION),
}


class InputError(ValueError):
    """An input object that is not usable, with where it came from."""


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it


def _json_document(text: str) -> list[Any] | None:
    """A JSON file as its one document (JSON is YAML, but a JSON parser is far faster);
    None when the text is not JSON, so YAML parsing (and its error messages) follows."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return [json.loads(text)]
    except ValueError:
        return None


def _documents(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    docs = _json_document(text)
    if docs is None:
        try:
            docs = list(yaml.load_all(text, Loader=_LOADER))
        except yaml.YAMLError as exc:
            raise InputError(f"{path}: not valid YAML or JSON: {exc}") from exc
    for number, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if isinstance(doc, dict) and doc.get("kind") == "List":
            for item_number, item in enumerate(doc.get("items") or [], start=1):
                yield f"{path}: document {number}, item {item_number}", item
        else:
            yield f"{path}: document {number}", doc


def _check_quantities(obj: msgspec.Struct) -> None:
    """Every quantity a slice or claim carries must parse (the API server would refuse it)."""
    values: list[tuple[str, str]] = []
    if isinstance(obj, ResourceSlice):
        for i, device in enumerate(obj.spec.devices or []):
            for name, capacity in (device.capacity or {}).items():
                values.append((f"spec.devices[{i}].capacity[{name}].value", capacity.value))
            for j, consumption in enumerate(device.consumes_counters or []):
                for name, counter in consumption.counters.items():
                    where = f"spec.devices[{i}].consumesCounters[{j}].counters[{name}]"
                    values.append((where, counter.value))
        for i, counter_set in enumerate(obj.spec.shared_counters or []):
            for name, counter in counter_set.counters.items():
                values.append((f"spec.sharedCounters[{i}].counters[{name}]", counter.value))
    elif isinstance(obj, ResourceClaim) and obj.spec.devices:
        for i, request in enumerate(obj.spec.devices.requests or []):
            bodies = [request.exactly] if request.exactly else list(request.first_available or [])
            for body in bodies:
                for name, value in (
                    (body.capacity.requests if body.capacity else None) or {}
                ).items():
                    values.append((f"spec.devices.requests[{i}] capacity {name}", value))
    for where, value in values:
        try:
            Quantity.parse(value)
        except QuantityError as exc:
            raise QuantityError(f"{where}: {value!r}: {exc}") from exc


def load(paths: list[Path], features: Features | None = None) -> Inputs:
    """Read every file; raises :class:`InputError` at the first unusable document.

    With ``features``, each object is admitted as the API server would store it
    under those gates (see :mod:`services.allocator.structured.admission`) and
    validated under them.
    """
    documents = [(where, doc) for path in paths for where, doc in _documents(path)]
    reader = _Reader(features)
    for where, doc in documents:
        if isinstance(doc, dict) and (doc.get("apiVersion"), doc.get("kind")) == (
            "v1",
            "Namespace",
        ):
            reader.namespace(where, doc)
    for where, doc in documents:
        reader.add(where, doc)
    return reader.inputs


class _Reader:
    """One load: the objects so far, the Namespaces' labels and the CEL environment."""

    def __init__(self, features: Features | None) -> None:
        self.inputs = Inputs()
        self.features = features
        self.namespaces: dict[str, dict[str, str]] = {}
        self.rules = Rules.of(features)
        self.minor = features.minor if features else DEFAULT_MINOR
        consumable = features.consumable_capacity if features else True
        lists = bool(features and features.list_type_attributes)
        # Selectors of objects created now: kube-apiserver's NewExpressions environment.
        self.env = CelEnvironment(
            consumable_capacity=consumable, list_attributes=lists, new_expressions=self.minor
        )

    def namespace(self, where: str, doc: dict[str, Any]) -> None:
        meta = doc.get("metadata") or {}
        name, labels = meta.get("name"), meta.get("labels") or {}
        if not isinstance(name, str) or not name or not isinstance(labels, dict):
            raise InputError(f"{where}: Namespace needs metadata.name and string labels")
        self.namespaces[name] = {str(k): str(v) for k, v in labels.items()}

    def add(self, where: str, doc: Any) -> None:
        if not isinstance(doc, dict):
            raise InputError(f"{where}: expected an object, got {type(doc).__name__}")
        api_version, kind = doc.get("apiVersion"), doc.get("kind")
        if api_version == "v1" and kind == "Namespace":
            return  # read first, see load()
        if api_version == "v1" and kind == "Node":
            self._node(where, doc)
            return
        if kind == "DeviceTaintRule" and api_version in self._taint_rule_versions():
            self._taint_rule(where, doc)
            return
        if api_version != API_VERSION or kind not in _KINDS:
            raise InputError(
                f"{where}: unsupported object apiVersion={api_version!r} kind={kind!r}; expected "
                f"{API_VERSION} DeviceClass, ResourceSlice or ResourceClaim, or v1 Node or "
                "Namespace"
            )
        try:
            strict(doc, _KINDS[kind], self.minor)
            obj = msgspec.convert(doc, _KINDS[kind])
        except (msgspec.ValidationError, StrictError) as exc:
            raise InputError(f"{where}: invalid {kind}: {exc}") from exc
        label = _label(obj)
        try:
            self._admit(obj)
        except ValueError as exc:
            raise InputError(f"{where}: invalid {kind} {label}: {exc}") from exc
        self._keep(where, obj, label)

    def _node(self, where: str, doc: dict[str, Any]) -> None:
        meta = doc.get("metadata") or {}
        name, labels = meta.get("name"), meta.get("labels") or {}
        if not isinstance(name, str) or not name or not isinstance(labels, dict):
            raise InputError(f"{where}: Node needs metadata.name and string labels")
        declared = (doc.get("status") or {}).get("declaredFeatures") or []
        if not isinstance(declared, list) or not all(isinstance(f, str) for f in declared):
            raise InputError(f"{where}: Node status.declaredFeatures must be a list of strings")
        self.inputs.nodes[name] = Node(
            name, {str(k): str(v) for k, v in labels.items()}, frozenset(declared)
        )

    def _taint_rule_versions(self) -> tuple[str, ...]:
        minor = self.features.minor if self.features else max(_TAINT_RULE_VERSIONS)
        return _TAINT_RULE_VERSIONS.get(minor, ())

    def _taint_rule(self, where: str, doc: dict[str, Any]) -> None:
        """A DeviceTaintRule, strict; applied to the slices by the allocator
        (services/allocator/structured/taintrules.py) when its gate is on."""
        try:
            strict(doc, DeviceTaintRule)
            rule = msgspec.convert(doc, DeviceTaintRule)
        except (msgspec.ValidationError, StrictError) as exc:
            raise InputError(f"{where}: invalid DeviceTaintRule: {exc}") from exc
        errors = validate_taint_rule(rule, self.minor)
        if errors:
            name = rule.metadata.name
            raise InputError(f"{where}: DeviceTaintRule {name}: {'; '.join(errors)}")
        self.inputs.taint_rules.append(rule)

    def _admit(self, obj: msgspec.Struct) -> None:
        features = self.features
        if features is not None and isinstance(obj, ResourceSlice):
            admit_slice(obj, features)
            drop_new_slice_fields(obj, features)
        elif features is not None and isinstance(obj, ResourceClaim):
            admit_claim(obj, features)
            drop_new_claim_fields(obj, features)
        if features is not None and isinstance(obj, DeviceClass):
            if not features.extended_resource:  # deviceclass/strategy.go drops it
                obj.spec.extended_resource_name = None
        _check_quantities(obj)
        errors = validation.validate(obj, self.env, self.rules, self.namespaces)
        if errors:
            raise ValueError("; ".join(errors))

    def _keep(self, where: str, obj: msgspec.Struct, label: str) -> None:
        inputs = self.inputs
        if isinstance(obj, DeviceClass):
            if obj.metadata.name in inputs.classes:
                raise InputError(f"{where}: DeviceClass {label} given twice")
            inputs.classes[obj.metadata.name] = obj
        elif isinstance(obj, ResourceSlice):
            inputs.slices.append(obj)
        elif isinstance(obj, ResourceClaim):
            if any(_label(other) == label for other in inputs.claims):
                raise InputError(f"{where}: ResourceClaim {label} given twice")
            inputs.claims.append(obj)


def _label(obj: msgspec.Struct) -> str:
    meta = getattr(obj, "metadata", None)
    name = getattr(meta, "name", "") or ""
    if isinstance(obj, ResourceClaim):
        return f"{obj.metadata.namespace or 'default'}/{name}"
    return name
