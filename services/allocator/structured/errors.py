"""How allocation stops a claim, and how its messages name a claim and a device.

:class:`AllocationError` is upstream's error return: the claim cannot be
allocated at all (a CEL error, a missing class, too many devices), as opposed
to "does not fit on this node". The labels are the names kube-scheduler's
messages use, so ours read the same.
"""

from __future__ import annotations

from services.allocator.structured.state import DeviceID
from services.core.kube.resource import ResourceClaim


class AllocationError(Exception):
    """Allocation of the claim must stop (bad input such as a CEL error); not "does not fit"."""


def claim_label(claim: ResourceClaim) -> str:
    return f"{claim.metadata.namespace or 'default'}/{claim.metadata.name}"


def device_label(device_id: DeviceID) -> str:
    return "/".join(device_id)
