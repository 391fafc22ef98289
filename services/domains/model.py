"""The ComputeDomain object as the controller reads it (resource.nvidia.com/v1beta1).

Decoding is lenient about what the controller does not use (metadata it never
reads, unknown status fields) and strict about what it does: a domain whose spec
does not decode is reported by the informer as unreadable and left alone.
"""

from __future__ import annotations

import msgspec


class Meta(msgspec.Struct, rename="camel", kw_only=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    deletion_timestamp: str | None = None
    finalizers: list[str] = []
    labels: dict[str, str] = {}


class Listed(msgspec.Struct, kw_only=True):
    """Any domain, readable or not: what the orphan sweep needs to know it exists."""

    metadata: Meta


class ClaimTemplateRef(msgspec.Struct, kw_only=True):
    name: str


class ChannelSpec(msgspec.Struct, rename="camel", kw_only=True):
    resource_claim_template: ClaimTemplateRef
    allocation_mode: str = "Single"


class DomainSpec(msgspec.Struct, rename="camel", kw_only=True):
    num_nodes: int = 0
    channel: ChannelSpec


class DomainNode(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=False):
    name: str
    ip_address: str
    clique_id: str = msgspec.field(name="cliqueID")
    index: int
    status: str


class DomainStatus(msgspec.Struct, kw_only=True):
    """Written whole (a merge patch leaves out what is omitted: status and nodes always go)."""

    status: str = "NotReady"
    nodes: list[DomainNode] = []


class ComputeDomain(msgspec.Struct, kw_only=True):
    metadata: Meta
    spec: DomainSpec
    status: DomainStatus | None = None

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    @property
    def uid(self) -> str:
        return self.metadata.uid

    @property
    def deleting(self) -> bool:
        return self.metadata.deletion_timestamp is not None
