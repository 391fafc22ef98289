"""Nodes: which nodes a slice, a device or an allocation is for (node names and
ValidateNodeSelector), and which node operations a slice's devices skip."""

from __future__ import annotations

import msgspec

from services.core.kube.resource import (
    Device,
    NodeSelector,
    NodeSelectorRequirement,
    ResourceSliceSpec,
)
from services.offline.validation.fields import forbidden, invalid, required
from services.offline.validation.names import dns_subdomain, label_key, label_value

_SLICE_FIELDS = "`nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
_PER_DEVICE = (
    "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
    "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
)


def node_selector(selector: NodeSelector, path: str) -> list[str]:
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
    errors += label_key(req.key, f"{path}.key")
    for i, value in enumerate(values):
        errors += label_value(value, f"{path}.values[{i}]")
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
            errors += dns_subdomain(value, f"{path}.values[{i}]")
    return errors


def slice_nodes(spec: ResourceSliceSpec) -> list[str]:
    """A slice is for exactly one of a node, the nodes a selector picks, all nodes, or
    whichever each of its devices names."""
    errors: list[str] = []
    chosen = []
    if spec.node_name is not None:
        if spec.node_name:
            chosen.append("`nodeName`")
            errors += dns_subdomain(spec.node_name, "spec.nodeName")
        else:
            errors.append(
                invalid("spec.nodeName", "", "must be either unset or set to a non-empty string")
            )
    if spec.node_selector is not None:
        chosen.append("`nodeSelector`")
        errors += node_selector(spec.node_selector, "spec.nodeSelector")
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
    if not chosen:
        errors.append(required("spec", f"exactly one of {_SLICE_FIELDS} is required"))
    elif len(chosen) > 1:
        errors.append(
            invalid(
                "spec",
                "{" + ", ".join(chosen) + "}",
                f"exactly one of {_SLICE_FIELDS} is required, but multiple fields are set",
            )
        )
    return errors


def device_nodes(device: Device, path: str, per_device: bool | None) -> list[str]:
    """A device names its nodes exactly when its slice says ``perDeviceNodeSelection``."""
    if not per_device:
        if device.node_name is None and device.node_selector is None and device.all_nodes is None:
            return []
        return [
            invalid(
                path,
                None,
                "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            )
        ]
    errors: list[str] = []
    chosen = []
    if device.node_name is not None:
        if device.node_name:
            chosen.append("`nodeName`")
            errors += dns_subdomain(device.node_name, f"{path}.nodeName")
        else:
            errors.append(invalid(f"{path}.nodeName", "", "must not be empty"))
    if device.node_selector is not None:
        chosen.append("`nodeSelector`")
        errors += node_selector(device.node_selector, f"{path}.nodeSelector")
    if device.all_nodes is not None:
        if device.all_nodes:
            chosen.append("`allNodes`")
        else:
            errors.append(invalid(f"{path}.allNodes", False, "must be either unset or set to true"))
    if not chosen:
        errors.append(required(path, _PER_DEVICE))
    elif len(chosen) > 1:
        errors.append(invalid(path, "{" + ", ".join(chosen) + "}", _PER_DEVICE))
    return errors


def skip_node_operations(ops: list[str] | None, path: str) -> list[str]:
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
