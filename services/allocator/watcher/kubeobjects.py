"""The core/v1 objects the claim watcher reads: Pods (services.core.kube.pods) and Nodes.

Only the fields the watcher uses; unknown fields are ignored when reading.
ResourceClaims, ResourceSlices and DeviceClasses come from services.core.kube.resource.
"""

from __future__ import annotations

import msgspec

from services.core.kube.pods import Pod
from services.core.kube.resource import ObjectMeta

__all__ = ["NodeObject", "Pod"]


class NodeStatus(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    # What the node's kubelet supports (1.35+, NodeDeclaredFeatures): the 1.37 allocator
    # gives a device that skips node operations only to a node declaring
    # DRAOptionalNodeOperations.
    declared_features: list[str] | None = None


class NodeObject(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    metadata: ObjectMeta
    status: NodeStatus | None = None

    @property
    def declared_features(self) -> frozenset[str]:
        return frozenset((self.status.declared_features if self.status else None) or ())
