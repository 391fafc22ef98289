"""Claim constraints ``matchAttribute`` and ``distinctAttribute``, as each release checks them.

Constraints are checked device by device while the search goes on; ``add``
says whether one more device keeps the constraint satisfiable and records it,
``remove`` undoes exactly one successful ``add``. A constraint with a request
list applies only to devices of those requests (``req`` also covers every
``req/sub``). The attribute comes from the device, or (1.37,
DRADerivedAttributes) from the request's derived attribute of that name
(``lookup``, which may raise: a derived attribute that cannot be evaluated
stops the claim).

Semantics per release (structured/internal/*/allocator_*.go and constraint.go):

* scalar comparison (every release; 1.37 without DRAListTypeAttributes): the
  first device in scope is taken whatever its value; each later one must have
  a value of the same type and the same value as the first (a list value never
  matches). ``distinctAttribute`` refuses a value equal to one already taken;
* set comparison (1.37 experimental with DRAListTypeAttributes): a scalar is a
  one-element set; ``matchAttribute`` keeps the intersection of the devices'
  sets and needs it non-empty, ``distinctAttribute`` needs the sets pairwise
  disjoint;
* ``distinctAttribute`` up to 1.36 remembers one value per *request name*, so a
  second device of the same request replaces the first one's value (reproduced);
  1.37 remembers every device's value.
"""

from __future__ import annotations

from collections.abc import Callable

from services.core.kube.resource import Device, DeviceAttribute

Lookup = Callable[[str, Device], DeviceAttribute | None]  # (attribute, device) -> value
Typed = tuple[str, object]
ValueSet = tuple[str, frozenset[object]]


def lookup_attribute(device: Device, driver: str, name: str) -> DeviceAttribute | None:
    """A fully qualified attribute; the driver's own domain may be left off in the slice."""
    attributes = device.attributes or {}
    if name in attributes:
        return attributes[name]
    domain, sep, ident = name.partition("/")
    if not sep or domain != driver:
        return None
    return attributes.get(ident)


def typed(attr: DeviceAttribute) -> Typed | None:
    """The scalar value with its type (a list value has none)."""
    for kind, value in (
        ("string", attr.string),
        ("int", attr.int_),
        ("bool", attr.bool_),
        ("version", attr.version),
    ):
        if value is not None:
            return kind, value
    return None


def as_set(attr: DeviceAttribute) -> ValueSet | None:
    """attributeAsSet: a non-empty list first, then a scalar as a one-element set."""
    for kind, values in (
        ("int", attr.ints),
        ("bool", attr.bools),
        ("string", attr.strings),
        ("version", attr.versions),
    ):
        if values:
            return kind, frozenset(values)
    scalar = typed(attr)
    if scalar is None:
        return None
    kind = {"string": "string", "int": "int", "bool": "bool", "version": "version"}[scalar[0]]
    return kind, frozenset((scalar[1],))


def _intersection(a: ValueSet, b: ValueSet) -> ValueSet | None:
    if a[0] != b[0]:
        return None
    both = a[1] & b[1]
    return (a[0], both) if both else None


class Constraint:
    kind = ""

    def __init__(self, attribute: str, requests: list[str] | None, sets: bool) -> None:
        self.attribute = attribute
        self.requests = set(requests or ())
        self.sets = sets

    def applies(self, request: str, subrequest: str | None) -> bool:
        if not self.requests:
            return True
        return request in self.requests or (
            subrequest is not None and f"{request}/{subrequest}" in self.requests
        )

    def add(self, request: str, subrequest: str | None, device: Device, lookup: Lookup) -> bool:
        """May raise what ``lookup`` raises (a derived attribute that cannot be evaluated)."""
        raise NotImplementedError

    def remove(self, request: str, subrequest: str | None) -> None:
        raise NotImplementedError


class MatchAttribute(Constraint):
    """Every device in scope has the attribute, all with the same value (or, as sets,
    a common element)."""

    kind = "matchAttribute"

    def __init__(self, attribute: str, requests: list[str] | None, sets: bool = False) -> None:
        super().__init__(attribute, requests, sets)
        self.first: DeviceAttribute | None = None
        self.stack: list[ValueSet] = []
        self.count = 0

    def add(self, request: str, subrequest: str | None, device: Device, lookup: Lookup) -> bool:
        if not self.applies(request, subrequest):
            return True
        attr = lookup(self.attribute, device)
        if attr is None:
            return False
        if self.sets:
            values = as_set(attr)
            if values is None:
                return False
            if self.count:
                narrowed = _intersection(self.stack[-1], values)
                if narrowed is None:
                    return False
                values = narrowed
            self.stack.append(values)
        elif self.count == 0:
            self.first = attr
        else:
            value = typed(attr)
            if value is None or self.first is None or typed(self.first) != value:
                return False
        self.count += 1
        return True

    def remove(self, request: str, subrequest: str | None) -> None:
        if self.applies(request, subrequest):
            self.count -= 1
            if self.sets:
                del self.stack[self.count :]


class DistinctAttribute(Constraint):
    """Devices in scope have the attribute with pairwise different values (as sets:
    pairwise disjoint); up to 1.36 one value per request name (``per_request``)."""

    kind = "distinctAttribute"

    def __init__(
        self,
        attribute: str,
        requests: list[str] | None,
        sets: bool = False,
        per_request: bool = False,
    ) -> None:
        super().__init__(attribute, requests, sets)
        self.per_request = per_request
        self.by_request: dict[str, DeviceAttribute] = {}
        self.taken: list[DeviceAttribute] = []
        self.count = 0

    def _distinct(self, attr: DeviceAttribute, others: list[DeviceAttribute]) -> bool:
        if self.sets:
            values = as_set(attr)
            if values is None:
                return False
            for other in others:
                existing = as_set(other)
                if existing is not None and _intersection(values, existing) is not None:
                    return False
            return True
        value = typed(attr)
        for other in others:
            if value is None:
                return False  # upstream: a value of no known scalar type never passes
            if typed(other) == value:
                return False
        return True

    def add(self, request: str, subrequest: str | None, device: Device, lookup: Lookup) -> bool:
        if not self.applies(request, subrequest):
            return True
        attr = lookup(self.attribute, device)
        if attr is None:
            return False
        if self.per_request:
            if self.count and not self._distinct(attr, list(self.by_request.values())):
                return False
            self.by_request[request] = attr
        else:
            if not self._distinct(attr, self.taken):
                return False
            self.taken.append(attr)
        self.count += 1
        return True

    def remove(self, request: str, subrequest: str | None) -> None:
        if not self.applies(request, subrequest):
            return
        self.count -= 1
        if self.per_request:
            self.by_request.pop(request, None)
        else:
            self.taken.pop()
