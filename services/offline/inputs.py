"""Read DeviceClasses, ResourceSlices, ResourceClaims and Nodes from YAML or JSON files.

A file may hold several YAML documents, one JSON object, or a ``kind: List``.
Anything we cannot use is refused with :class:`InputError` naming the file and
the document (1-based; ``item`` for entries of a List), so a what-if run never
silently drops an object.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import yaml

from services.allocator.structured.admission import admit_claim, admit_slice
from services.allocator.structured.features import Features
from services.allocator.structured.pools import Node
from services.allocator.structured.snapshot import Inputs
from services.core.quantity import Quantity, QuantityError
from services.core.resource import API_VERSION, DeviceClass, ResourceClaim, ResourceSlice

_KINDS: dict[str, type[msgspec.Struct]] = {
    "DeviceClass": DeviceClass,
    "ResourceSlice": ResourceSlice,
    "ResourceClaim": ResourceClaim,
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


def _check_claim(claim: ResourceClaim) -> None:
    if not claim.metadata.name:
        raise ValueError("metadata.name: a claim needs a name")
    for i, request in enumerate(
        (claim.spec.devices.requests if claim.spec.devices else None) or []
    ):
        if (request.exactly is None) == (not request.first_available):
            raise ValueError(
                f"spec.devices.requests[{i}] ({request.name}): "
                "exactly one of exactly or firstAvailable must be set"
            )


def load(paths: list[Path], features: Features | None = None) -> Inputs:
    """Read every file; raises :class:`InputError` at the first unusable document.

    With ``features``, each object is admitted as the API server would store it
    under those gates (see :mod:`services.allocator.structured.admission`).
    """
    inputs = Inputs()
    for path in paths:
        for where, doc in _documents(path):
            _add(inputs, where, doc, features)
    return inputs


def _add(inputs: Inputs, where: str, doc: Any, features: Features | None = None) -> None:
    if not isinstance(doc, dict):
        raise InputError(f"{where}: expected an object, got {type(doc).__name__}")
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if api_version == "v1" and kind == "Node":
        meta = doc.get("metadata") or {}
        name, labels = meta.get("name"), meta.get("labels") or {}
        if not isinstance(name, str) or not name or not isinstance(labels, dict):
            raise InputError(f"{where}: Node needs metadata.name and string labels")
        inputs.nodes[name] = Node(name, {str(k): str(v) for k, v in labels.items()})
        return
    if api_version != API_VERSION or kind not in _KINDS:
        raise InputError(
            f"{where}: unsupported object apiVersion={api_version!r} kind={kind!r}; expected "
            f"{API_VERSION} DeviceClass, ResourceSlice or ResourceClaim, or v1 Node"
        )
    try:
        obj = msgspec.convert(doc, _KINDS[kind])
        if features is not None and isinstance(obj, ResourceSlice):
            admit_slice(obj, features)
        elif features is not None and isinstance(obj, ResourceClaim):
            admit_claim(obj, features)
        _check_quantities(obj)
        if isinstance(obj, ResourceClaim):
            _check_claim(obj)
    except (msgspec.ValidationError, ValueError) as exc:
        raise InputError(f"{where}: invalid {kind}: {exc}") from exc
    if isinstance(obj, DeviceClass):
        inputs.classes[obj.metadata.name] = obj
    elif isinstance(obj, ResourceSlice):
        inputs.slices.append(obj)
    elif isinstance(obj, ResourceClaim):
        inputs.claims.append(obj)
