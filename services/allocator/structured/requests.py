"""One view of a claim's requests: a plain request and a ``firstAvailable`` subrequest alike.

Upstream reads both through a ``requestAccessor`` interface; this is the same
idea as a value, with the API defaults applied (``ExactCount`` of 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.core.kube.quantity import Quantity
from services.core.kube.resource import (
    DeviceDerivedAttribute,
    DeviceRequest,
    DeviceSelector,
    DeviceSubRequest,
    Toleration,
)

EXACT_COUNT = "ExactCount"
ALL = "All"


@dataclass(frozen=True, slots=True)
class RequestSpec:
    name: str  # the request, or the subrequest's own name
    parent: str | None  # the request name when this is a subrequest
    class_name: str
    selectors: tuple[DeviceSelector, ...]
    mode: str
    count: int
    admin_access: bool | None  # None: not set
    tolerations: tuple[Toleration, ...]
    capacity: dict[str, Quantity] | None
    derived_attributes: tuple[DeviceDerivedAttribute, ...] = ()  # 1.37, DRADerivedAttributes

    @property
    def result_name(self) -> str:
        """The name an allocation result carries: ``req`` or ``req/sub``."""
        return f"{self.parent}/{self.name}" if self.parent else self.name

    @property
    def base_name(self) -> str:
        return self.parent or self.name

    @property
    def admin(self) -> bool:
        return bool(self.admin_access)


def _capacity(requests: dict[str, str] | None) -> dict[str, Quantity] | None:
    if requests is None:
        return None
    return {name: Quantity.parse(value) for name, value in requests.items()}


def exact(request: DeviceRequest) -> RequestSpec:
    body = request.exactly
    assert body is not None
    return RequestSpec(
        name=request.name,
        parent=None,
        class_name=body.device_class_name,
        selectors=tuple(body.selectors or ()),
        mode=body.allocation_mode or EXACT_COUNT,
        count=body.count if body.count is not None else 1,
        admin_access=body.admin_access,
        tolerations=tuple(body.tolerations or ()),
        capacity=_capacity(body.capacity.requests if body.capacity else None),
        derived_attributes=tuple(body.derived_attributes or ()),
    )


def sub(request: DeviceRequest, subrequest: DeviceSubRequest) -> RequestSpec:
    return RequestSpec(
        name=subrequest.name,
        parent=request.name,
        class_name=subrequest.device_class_name,
        selectors=tuple(subrequest.selectors or ()),
        mode=subrequest.allocation_mode or EXACT_COUNT,
        count=subrequest.count if subrequest.count is not None else 1,
        admin_access=None,
        tolerations=tuple(subrequest.tolerations or ()),
        capacity=_capacity(subrequest.capacity.requests if subrequest.capacity else None),
        derived_attributes=tuple(subrequest.derived_attributes or ()),
    )


def alternatives(request: DeviceRequest) -> list[RequestSpec]:
    """The ways to satisfy ``request``: itself, or its subrequests in order."""
    if request.first_available:
        return [sub(request, s) for s in request.first_available]
    return [exact(request)]
