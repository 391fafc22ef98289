"""The values a device carries: attributes (one of eight kinds; lists from 1.36) and the
quantities of its capacities and counters."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from services.core.kube import quantity
from services.core.kube.resource import DeviceAttribute
from services.offline.slicecheck.problem import Problem

_NUM = r"(0|[1-9]\d*)"
_PRE = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD = r"[0-9a-zA-Z-]+"
_SEMVER = re.compile(rf"^{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+{_BUILD}(\.{_BUILD})*)?$")
_LIST_KINDS = ("ints", "bools", "strings", "versions")


def list_values(attr: DeviceAttribute) -> tuple[str, list[Any] | None]:
    """The attribute's list field and values (("", None) for a scalar)."""
    for kind in _LIST_KINDS:
        values = getattr(attr, kind)
        if values is not None:
            return kind, values
    return "", None


def attribute(attr: DeviceAttribute, path: str, lists_ok: bool = True) -> list[Problem]:
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
    kind, values = list_values(attr)
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


def quantity_value(value: str, path: str) -> list[Problem]:
    try:
        quantity.parse(value)
    except quantity.QuantityError as exc:
        return [Problem(path, str(exc))]
    return []
