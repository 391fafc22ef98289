"""The one seam between the publisher and wherever slices go.

:class:`SliceApi` is what the reconciler needs from an API server: list a driver's
slices (optionally of one node), create, replace, delete with preconditions,
watch for changes, look up a Node's UID and the server's version. The real one is
:class:`services.publisher.kubeapi.KubeSliceApi`; tests and the benchmark plug in
:class:`services.publisher.memoryapi.MemorySliceApi`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol

from services.core.kube.resource import ResourceSlice


@dataclass(frozen=True)
class SliceList:
    items: list[ResourceSlice]
    resource_version: str  # where a watch continues from


EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


@dataclass(frozen=True)
class WatchEvent:
    """What the publisher needs of a slice change: which slice, whose, which version.

    A BOOKMARK names no slice; it only moves the version a watch resumes from.

    The object itself is not decoded: the watch carries every write of a whole
    fleet, and the node's slices are listed anyway when it is re-synced.
    """

    type: EventType
    name: str
    node: str
    resource_version: str


@dataclass(frozen=True)
class SliceNodes:
    """The nodes that have slices of our driver, and where a watch continues from."""

    nodes: set[str]
    resource_version: str


class SliceApi(Protocol):
    """Every call the reconciler and the service make against the API server."""

    async def server_minor(self) -> int:
        """The minor version of the API server (35 for v1.35.2)."""
        ...

    async def node_uid(self, node: str) -> str | None:
        """The Node's UID, or None when no such Node exists."""
        ...

    async def node_uids(self) -> dict[str, str]:
        """Every Node's UID, by name (one list)."""
        ...

    async def list_slices(self, node: str | None = None) -> SliceList:
        """Our driver's slices, of one node or of all."""
        ...

    async def slice_nodes(self) -> SliceNodes:
        """Which nodes have our slices, without holding every slice in memory at once."""
        ...

    async def create(self, obj: ResourceSlice) -> ResourceSlice: ...

    async def replace(self, obj: ResourceSlice) -> ResourceSlice:
        """Update in place; ``obj.metadata.resourceVersion`` must be current (else 409)."""
        ...

    async def delete(self, name: str, *, uid: str | None, resource_version: str | None) -> None:
        """Delete only that incarnation (preconditions); 404 when already gone."""
        ...

    def watch(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Our driver's slice changes after ``resource_version``; ApiError(410) when expired.

        Failures raise :class:`services.core.kube.client.ApiError`, as every call here does."""
        ...
