"""The part of a core/v1 Pod that services read: where it runs and which claims it uses.

The allocator's watcher and the preparer's node check both decode pods with it;
fields they do not use are skipped when decoding.
"""

from __future__ import annotations

import msgspec

from services.core.kube.resource import ObjectMeta

TERMINAL = ("Succeeded", "Failed")


class _Obj(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    pass


class PodResourceClaim(_Obj):
    name: str
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


class PodResourceClaimStatus(_Obj):
    name: str
    resource_claim_name: str | None = None


class ResourceRequirements(_Obj):
    requests: dict[str, str | int] | None = None


class Container(_Obj):
    """Only what extended resources need (the API server copies limits into requests)."""

    name: str = ""
    resources: ResourceRequirements | None = None
    restart_policy: str | None = None  # "Always": a sidecar init container


class PodSpec(_Obj):
    node_name: str | None = None
    resource_claims: list[PodResourceClaim] | None = None
    init_containers: list[Container] | None = None
    containers: list[Container] | None = None


class PodExtendedResourceClaimStatus(_Obj):
    resource_claim_name: str = ""


class PodStatus(_Obj):
    phase: str | None = None
    resource_claim_statuses: list[PodResourceClaimStatus] | None = None
    extended_resource_claim_status: PodExtendedResourceClaimStatus | None = None


class Pod(_Obj):
    metadata: ObjectMeta
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus | None = None

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def claim_names(self) -> list[str]:
        """Its ResourceClaims: named in the spec, or generated from a template (status)."""
        names = [c.resource_claim_name for c in self.spec.resource_claims or []]
        statuses = (self.status.resource_claim_statuses if self.status else None) or []
        names += [s.resource_claim_name for s in statuses]
        return sorted({n for n in names if n})

    def terminal(self) -> bool:
        """Succeeded or Failed: its containers will never run again."""
        return self.status is not None and self.status.phase in TERMINAL
