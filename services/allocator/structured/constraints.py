"""Claim constraints ``matchAttribute`` and ``distinctAttribute``, checked as in 1.35.

Constraints are checked device by device while the search goes on; ``add``
says whether one more device keeps the constraint satisfiable and records it,
``remove`` undoes exactly one successful ``add``. A constraint with a request
list applies only to devices of those requests (``req`` also covers every
``req/sub``).
"""

from __future__ import annotations

from services.core.resource import Device, DeviceAttribute


def lookup_attribute(device: Device, driver: str, name: str) -> DeviceAttribute | None:
    """A fully qualified attribute; the driver's own domain may be left off in the slice."""
    attributes = device.attributes or {}
    if name in attributes:
        return attributes[name]
    domain, sep, ident = name.partition("/")
    if not sep or domain != driver:
        return None
    return attributes.get(ident)


def _typed(attr: DeviceAttribute) -> tuple[str, object] | None:
    for kind, value in (
        ("string", attr.string),
        ("int", attr.int_),
        ("bool", attr.bool_),
        ("version", attr.version),
    ):
        if value is not None:
            return kind, value
    return None


class Constraint:
    def __init__(self, attribute: str, requests: list[str] | None) -> None:
        self.attribute = attribute
        self.requests = set(requests or ())

    def applies(self, request: str, subrequest: str | None) -> bool:
        if not self.requests:
            return True
        return request in self.requests or (
            subrequest is not None and f"{request}/{subrequest}" in self.requests
        )

    def add(self, request: str, subrequest: str | None, device: Device, driver: str) -> bool:
        raise NotImplementedError

    def remove(self, request: str, subrequest: str | None) -> None:
        raise NotImplementedError


class MatchAttribute(Constraint):
    """Every device in scope has the attribute, all with the same type and value."""

    kind = "matchAttribute"

    def __init__(self, attribute: str, requests: list[str] | None) -> None:
        super().__init__(attribute, requests)
        self.value: tuple[str, object] | None = None
        self.count = 0

    def add(self, request: str, subrequest: str | None, device: Device, driver: str) -> bool:
        if not self.applies(request, subrequest):
            return True
        attr = lookup_attribute(device, driver, self.attribute)
        typed = _typed(attr) if attr is not None else None
        if typed is None:
            return False
        if self.count == 0:
            self.value = typed
        elif typed != self.value:
            return False
        self.count += 1
        return True

    def remove(self, request: str, subrequest: str | None) -> None:
        if self.applies(request, subrequest):
            self.count -= 1


class DistinctAttribute(Constraint):
    """Devices in scope have the attribute with pairwise different values.

    Upstream (1.35) remembers one value per *request name*, so a second device
    of the same request replaces the first one's value; reproduced here.
    """

    kind = "distinctAttribute"

    def __init__(self, attribute: str, requests: list[str] | None) -> None:
        super().__init__(attribute, requests)
        self.values: dict[str, tuple[str, object]] = {}
        self.count = 0

    def add(self, request: str, subrequest: str | None, device: Device, driver: str) -> bool:
        if not self.applies(request, subrequest):
            return True
        attr = lookup_attribute(device, driver, self.attribute)
        typed = _typed(attr) if attr is not None else None
        if typed is None:
            return False
        if self.count > 0 and typed in self.values.values():
            return False
        self.values[request] = typed
        self.count += 1
        return True

    def remove(self, request: str, subrequest: str | None) -> None:
        if self.applies(request, subrequest):
            self.values.pop(request, None)
            self.count -= 1
