"""The core/v1 objects the claim watcher reads: Pods (services.core.pods) and Nodes.

Only the fields the watcher uses; unknown fields are ignored when reading.
ResourceClaims, ResourceSlices and DeviceClasses come from services.core.resource.
"""

from __future__ import annotations

import msgspec

from services.core.pods import Pod
from services.core.resource import ObjectMeta

__all__ = ["NodeObject", "Pod"]


class NodeObject(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    metadata: ObjectMeta
