"""The core/v1 objects the claim watcher reads (Pods, Nodes) and writes (Events).

Only the fields the watcher uses; unknown fields are ignored when reading.
ResourceClaims, ResourceSlices and DeviceClasses come from services.core.resource.
"""

from __future__ import annotations

import msgspec

from services.core.resource import ObjectMeta


class _Obj(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    pass


class PodResourceClaim(_Obj):
    name: str
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


class PodResourceClaimStatus(_Obj):
    name: str
    resource_claim_name: str | None = None


class PodSpec(_Obj):
    node_name: str | None = None
    resource_claims: list[PodResourceClaim] | None = None


class PodStatus(_Obj):
    phase: str | None = None
    resource_claim_statuses: list[PodResourceClaimStatus] | None = None


class Pod(_Obj):
    metadata: ObjectMeta
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus | None = None

    def claim_names(self) -> list[str]:
        """The ResourceClaims the pod uses: named directly, or generated from a template."""
        names = [c.resource_claim_name for c in self.spec.resource_claims or []]
        names += [
            s.resource_claim_name
            for s in (self.status and self.status.resource_claim_statuses) or []
        ]
        return sorted({n for n in names if n})


class NodeObject(_Obj):
    metadata: ObjectMeta
