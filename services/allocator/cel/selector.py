"""A compiled selector and what it reads of a device.

A selector that reads a device only through literal lookups
(``device.attributes["domain"].name``, ``device.driver``) has a *signature*:
the device facts it reads. Two devices with equal facts get the same answer, so
the allocator evaluates such a selector once per distinct set of facts, not once
per device (:func:`signature`, :func:`device_facts`). The references it spells
out feed the explainer's "did you mean".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from services.allocator.cel.parse import Node, device_path
from services.allocator.cel.semver import Semver
from services.core.kube.quantity import Quantity
from services.core.kube.resource import Device

MULTI_ALLOC_FIELD = "allowMultipleAllocations"


class CelError(Exception):
    """A selector that cannot be compiled (``kind="compile"``) or failed on a device."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class Reference:
    """``device.attributes["domain"].name`` (or ``capacity``) as written in a selector."""

    map_name: str  # "attributes" or "capacity"
    domain: str | None  # None when the key is not a literal
    name: str | None


Fact = tuple[str, ...]  # ("driver",), ("allowMultipleAllocations",), (map, domain, name)


@dataclass(slots=True)
class Selector:
    """A compiled selector; ``error`` is set instead of a program when it does not compile."""

    expression: str
    program: Any = None
    error: str | None = None
    cost: int | None = None
    references: list[Reference] = field(default_factory=list)
    # The device facts the result depends on, when that is all it depends on
    # (see :func:`signature`); None: evaluate on every device.
    facts: tuple[Fact, ...] | None = None


@dataclass(frozen=True, slots=True)
class DeviceInput:
    """What a selector sees of one device (cel.Device upstream)."""

    driver: str
    device: Device


def split_name(name: str, driver: str) -> tuple[str, str]:
    """A qualified attribute name as (domain, id); a bare name is in the driver's domain."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def is_device_map(node: Node) -> bool:
    """``device.attributes`` or ``device.capacity``."""
    return device_path(node) in (["attributes"], ["capacity"])


def signature(tree: Node) -> tuple[Fact, ...] | None:
    """The facts of a device an expression reads, if it reads nothing else of it.

    True when every use of ``device`` is ``device.driver``,
    ``device.allowMultipleAllocations``, or a lookup with literal keys
    ``device.attributes["domain"].name`` / ``["domain"]["name"]`` (the same for
    ``capacity``, optional forms included). Then two devices with equal facts
    get the same result (or the same error), so a result can be shared. Any
    other use (a whole map, a computed key, a variable named ``device``) gives
    None.
    """
    facts: list[Fact] = []

    def visit(node: Node) -> bool:
        fact = _fact(node)
        if fact is not None:
            if fact not in facts:
                facts.append(fact)
            return True
        if node.kind == "ident" and node.name == "device":
            return False
        return all(visit(arg) for arg in node.args)

    return tuple(facts) if visit(tree) else None


def _fact(node: Node) -> Fact | None:
    if node.kind == "select" and node.args[0].kind == "ident" and node.args[0].name == "device":
        return (node.name,) if node.name in ("driver", MULTI_ALLOC_FIELD) else None
    if node.kind == "select":
        base, name = node.args[0], node.name
    elif node.kind == "index" and _string_literal(node.args[1]):
        base, name = node.args[0], str(node.args[1].value)
    else:
        return None
    if base.kind != "index" or not is_device_map(base.args[0]):
        return None
    key = base.args[1]
    if not _string_literal(key):
        return None
    path = device_path(base.args[0]) or [""]
    return (path[0], str(key.value), name)


def _string_literal(node: Node) -> bool:
    return node.kind == "lit" and isinstance(node.value, str)


def device_facts(device: DeviceInput) -> dict[Fact, object] | None:
    """What :func:`signature` facts read, per device; None when building the device's
    activation would fail (then every selector fails on it, as in Kubernetes)."""
    facts: dict[Fact, object] = {("driver",): device.driver}
    facts[(MULTI_ALLOC_FIELD,)] = bool(device.device.allow_multiple_allocations)
    for name, attr in (device.device.attributes or {}).items():
        domain, ident = split_name(name, device.driver)
        if attr.version is not None:
            if not _semver_ok(attr.version):
                return None
            value: object = ("version", attr.version)
        elif attr.int_ is not None:
            value = ("int", attr.int_)
        elif attr.bool_ is not None:
            value = ("bool", attr.bool_)
        elif attr.string is not None:
            value = ("string", attr.string)
        elif attr.versions is not None:
            if not all(_semver_ok(v) for v in attr.versions):
                return None
            value = ("versions", tuple(attr.versions))
        else:
            lists = (("ints", attr.ints), ("bools", attr.bools), ("strings", attr.strings))
            found = next(((kind, tuple(v)) for kind, v in lists if v is not None), None)
            if found is None:
                return None
            value = found
        facts[("attributes", domain, ident)] = value
    for name, cap in (device.device.capacity or {}).items():
        if not _quantity_ok(cap.value):
            return None
        domain, ident = split_name(name, device.driver)
        facts[("capacity", domain, ident)] = cap.value
    return facts


@lru_cache(maxsize=1024)
def _quantity_ok(text: str) -> bool:
    try:
        Quantity.parse(text)
    except ValueError:
        return False
    return True


@lru_cache(maxsize=1024)
def _semver_ok(text: str) -> bool:
    try:
        Semver.parse(text)
    except ValueError:
        return False
    return True


def references(tree: Node) -> list[Reference]:
    """Every attribute/capacity lookup spelled out in the expression."""
    refs: list[Reference] = []
    for node in tree.walk():
        base: Node | None = None
        name: str | None = None
        if node.kind == "select":
            base, name = node.args[0], node.name
        elif node.kind == "index" and node.args[1].kind == "lit":
            base, name = node.args[0], str(node.args[1].value)
        if base is None or base.kind != "index" or not is_device_map(base.args[0]):
            continue
        key = base.args[1]
        domain = str(key.value) if key.kind == "lit" else None
        path = device_path(base.args[0]) or [""]
        refs.append(Reference(path[0], domain, name))
    return refs
