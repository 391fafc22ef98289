"""Derived attributes (1.37, DRADerivedAttributes): the result type their expression
may have, and its value as a DeviceAttribute (``valToDeviceAttribute``).

A derived attribute is an expression of the selector environment whose value a
constraint compares like a device's own attribute; its type and conversion
errors read as kube-scheduler's.
"""

from __future__ import annotations

from typing import Any

from services.allocator.cel import types as celtypes
from services.allocator.cel.messages import kubernetes_names, type_name
from services.allocator.cel.selector import CelError
from services.core.kube.resource import DeviceAttribute

_DERIVED_SCALARS = ("bool", "int", "string", "dyn", "error", "google.protobuf.Any")


def output_problem(out: Any) -> str | None:
    """validateOutputType for a derived attribute (stored expressions: lists allowed)."""
    name = type_name(out)
    inner = name[5:-1] if name.startswith("list(") and name.endswith(")") else None
    for candidate in (name, inner):
        if candidate in _DERIVED_SCALARS or candidate == celtypes.SEMVER_TYPE:
            return None
    shown = kubernetes_names(name)
    return (
        "must evaluate to a primitive scalar (string, integer, boolean, semver) or a list of "
        f"these scalars, not {shown}"
    )


def plain(value: Any) -> Any:
    """A cel-expr-python result as plain Python (lists element by element)."""
    if isinstance(value, list | tuple):
        return [plain(getattr(v, "value", lambda v=v: v)()) for v in value]
    return value


_GO_TYPES = {bool: "bool", int: "int64", str: "string", float: "float64", bytes: "[]uint8"}


def _go_type(value: Any) -> str:
    if isinstance(value, celtypes.SemverMessage):
        return "semver.Version"
    return _GO_TYPES.get(type(value), type(value).__name__)


def device_attribute(value: Any) -> DeviceAttribute:
    """valToDeviceAttribute: a scalar or a list of one scalar type; an empty list is
    an empty string list."""
    if isinstance(value, bool):
        return DeviceAttribute(bool_=value)
    if isinstance(value, int):
        return DeviceAttribute(int_=value)
    if isinstance(value, str):
        return DeviceAttribute(string=value)
    if isinstance(value, celtypes.SemverMessage):
        return DeviceAttribute(version=str(celtypes.semver_of(value)))
    if isinstance(value, list):
        if not value:
            return DeviceAttribute(strings=[])
        first = value[0]
        kinds: tuple[tuple[type, str, str], ...] = (
            (bool, "bools", "bool"),
            (int, "ints", "int"),
            (str, "strings", "string"),
        )
        for kind, field_name, word in kinds:
            if type(first) is kind:
                for i, item in enumerate(value):
                    if type(item) is not kind:
                        raise CelError(
                            "runtime",
                            f"expected list element at index {i} to be {word}, "
                            f"got {_go_type(item)}",
                        )
                attribute = DeviceAttribute()
                setattr(attribute, field_name, list(value))
                return attribute
        if isinstance(first, celtypes.SemverMessage):
            versions = []
            for i, item in enumerate(value):
                if not isinstance(item, celtypes.SemverMessage):
                    raise CelError(
                        "runtime",
                        f"expected list element at index {i} to be semver, got {_go_type(item)}",
                    )
                versions.append(str(celtypes.semver_of(item)))
            return DeviceAttribute(versions=versions)
        raise CelError("runtime", f"unsupported list element type: {_go_type(first)}")
    raise CelError("runtime", f"unsupported CEL return type: {_go_type(value)}")
