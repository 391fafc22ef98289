"""The claim the scheduler would make for a pod's extended resources, to explain it.

With Kubernetes' DRAExtendedResource gate, a pod asking ``nvidia.com/gpu: 2`` is
served from a DeviceClass whose ``extendedResourceName`` is ``nvidia.com/gpu``
(or by ``deviceclass.resource.kubernetes.io/<class>``). The scheduler creates its
special ResourceClaim only once it has found the devices, so a pod it cannot
place has no claim to explain. This builds the claim the scheduler would create
(its pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go):
one ExactCount request per long-lived container (and sidecar) and resource,
named ``container-<i>-request-<j>`` (``i`` indexes init containers then
containers, ``j`` the resource among the container's requests sorted by name),
plus, for an init container that runs alone, what it needs beyond the requests
before it; so the watcher explains it like any other claim.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.core.kube import quantity
from services.core.kube.pods import Container, Pod
from services.core.kube.resource import (
    DeviceClaim,
    DeviceClass,
    DeviceRequest,
    ExactDeviceRequest,
    ObjectMeta,
    ResourceClaim,
    ResourceClaimSpec,
)

CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
SUFFIX = "-extended-resources"


def class_for(resource: str, classes: Mapping[str, DeviceClass]) -> str | None:
    """The DeviceClass serving extended resource ``resource``, if any."""
    if resource.startswith(CLASS_PREFIX):
        name = resource.removeprefix(CLASS_PREFIX)
        return name if name in classes else None
    for name in sorted(classes):
        if classes[name].spec.extended_resource_name == resource:
            return name
    return None


def _count(value: str | int) -> int:
    try:
        amount = quantity.parse(str(value))
    except quantity.QuantityError:
        return 0
    return int(amount) if amount == int(amount) and amount > 0 else 0


def _requests(container: Container) -> dict[str, str | int]:
    return dict((container.resources.requests if container.resources else None) or {})


def extended_claim(pod: Pod, classes: Mapping[str, DeviceClass]) -> ResourceClaim | None:
    """The claim the scheduler would create for ``pod``; None if it asks no extended
    resource a DeviceClass serves."""
    init = list(pod.spec.init_containers or [])
    containers = [*init, *(pod.spec.containers or [])]
    requests: list[DeviceRequest] = []
    given: dict[str, int] = {}  # resource -> devices of long-lived containers so far
    for index, container in enumerate(containers):
        wants = _requests(container)
        names = sorted(wants)
        short_lived = index < len(init) and container.restart_policy != "Always"
        for resource in names:
            class_name = class_for(resource, classes)
            count = _count(wants[resource])
            if class_name is None or count == 0:
                continue
            if short_lived:
                count -= given.get(resource, 0)  # it reuses what runs before it
                if count <= 0:
                    continue
            else:
                given[resource] = given.get(resource, 0) + count
            requests.append(
                DeviceRequest(
                    name=f"container-{index}-request-{names.index(resource)}",
                    exactly=ExactDeviceRequest(
                        device_class_name=class_name, allocation_mode="ExactCount", count=count
                    ),
                )
            )
    if not requests:
        return None
    meta = pod.metadata
    return ResourceClaim(
        metadata=ObjectMeta(name=f"{meta.name}{SUFFIX}", namespace=meta.namespace, uid=meta.uid),
        spec=ResourceClaimSpec(devices=DeviceClaim(requests=requests)),
    )
