"""A device's attributes (validateDeviceAttribute): one value each, of one of eight kinds
(1.36 adds the four list kinds), strings and versions bounded."""

from __future__ import annotations

import json
import re

from services.core.kube.resource import Device, DeviceAttribute
from services.offline.validation.fields import invalid, required, too_long
from services.offline.validation.rules import Rules

MAX_STRING = 64

_NUM = r"(0|[1-9]\d*)"
_PRE = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD = r"[0-9a-zA-Z-]+"
_SEMVER = re.compile(rf"^{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+{_BUILD}(\.{_BUILD})*)?$")


def attribute(attr: DeviceAttribute, where: str, rules: Rules) -> list[str]:
    """validateDeviceAttribute: exactly one value (1.34: none is a Required value)."""
    errors: list[str] = []
    count = 0
    for value in (attr.int_, attr.bool_):
        count += value is not None
    if attr.string is not None:
        count += 1
        if len(attr.string.encode()) > MAX_STRING:
            errors.append(too_long(f"{where}.string", MAX_STRING))
    if attr.version is not None:
        count += 1
        errors += _version(attr.version, f"{where}.version")
    for field, items in (
        ("bools", attr.bools),
        ("ints", attr.ints),
        ("strings", attr.strings),
        ("versions", attr.versions),
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
            f"{where}: Invalid value: {as_go_json(attr)}: exactly one value must be specified"
        )
    if attr.strings:
        for i, item in enumerate(attr.strings):
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


def as_go_json(item: DeviceAttribute) -> str:
    """The attribute as field.Error prints a Go struct (JSON of its Go field names)."""
    fields = {
        "IntValue": item.int_,
        "BoolValue": item.bool_,
        "StringValue": item.string,
        "VersionValue": item.version,
    }
    return json.dumps(fields, separators=(",", ":"))


def has_lists(device: Device) -> bool:
    return any(a.is_list for a in (device.attributes or {}).values())


def value_count(item: DeviceAttribute) -> int:
    """numEntriesDeviceAttribute's count for one attribute: its list items, or 1."""
    lists = (item.ints, item.bools, item.strings, item.versions)
    items = sum(len(values or []) for values in lists)
    return items or 1
