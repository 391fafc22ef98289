""":class:`SliceApi` against a real API server, through the one client in services.core.kube.client.

Slices are decoded straight into :mod:`services.core.kube.resource` models, the
exact wire shape we render; a watch event is decoded only as far as the
publisher needs (name, node, version), since the watch carries every write of
a whole fleet.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TypeVar

import msgspec

from services.core.kube.client import ApiError, KubeApi, server_minor
from services.core.kube.resource import ResourceSlice
from services.core.model import nvidia
from services.publisher.sliceapi import SliceList, SliceNodes, WatchEvent

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
T = TypeVar("T")


class _Meta(msgspec.Struct, rename="camel"):
    uid: str = ""
    name: str = ""
    resource_version: str = ""


class _LiteSpec(msgspec.Struct, rename="camel"):
    node_name: str = ""


class _LiteSlice(msgspec.Struct):
    """Only what identifies a slice; decoding skips the devices without building them."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _LiteSpec = msgspec.field(default_factory=_LiteSpec)


class _Named(msgspec.Struct):
    metadata: _Meta


def _selector(node: str | None, driver: str) -> dict[str, str]:
    selector = f"spec.driver={driver}"
    return {"fieldSelector": f"{selector},spec.nodeName={node}" if node else selector}


def _decode(data: bytes | msgspec.Raw, kind: type[T], what: str) -> T:
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise ApiError(0, f"undecodable {what}: {exc}") from exc


class KubeSliceApi:
    """ResourceSlices in resource.k8s.io/v1, Nodes in core/v1, /version."""

    def __init__(
        self, api: KubeApi, field_manager: str = "", driver: str = nvidia.DRIVER_NAME
    ) -> None:
        """``field_manager``: the name the API server records for our writes (managedFields;
        a replica's own name when replicas share the nodes, so each write says whose it is).
        ``driver``: whose slices are listed and watched."""
        self.api = api
        self.driver = driver
        self.field_manager = field_manager
        self._query = f"?fieldManager={field_manager}" if field_manager else ""

    async def close(self) -> None:
        await self.api.close()

    async def server_minor(self) -> int:
        return await server_minor(self.api)

    async def node_uid(self, node: str) -> str | None:
        try:
            body = await self.api.get(f"/api/v1/nodes/{node}")
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        return _decode(body, _Named, "Node").metadata.uid or None

    async def node_uids(self) -> dict[str, str]:
        listing = await self.api.list("/api/v1/nodes", {})
        named = (_decode(raw, _Named, "Node").metadata for raw in listing.items)
        return {meta.name: meta.uid for meta in named if meta.name and meta.uid}

    async def list_slices(self, node: str | None = None) -> SliceList:
        listing = await self.api.list(SLICES_PATH, _selector(node, self.driver))
        items = [_decode(raw, ResourceSlice, "ResourceSlice") for raw in listing.items]
        return SliceList(items, listing.resource_version)

    async def slice_nodes(self) -> SliceNodes:
        listing = await self.api.list(SLICES_PATH, _selector(None, self.driver))
        lite = (_decode(raw, _LiteSlice, "ResourceSlice") for raw in listing.items)
        nodes = {s.spec.node_name for s in lite if s.spec.node_name}
        return SliceNodes(nodes, listing.resource_version)

    async def create(self, obj: ResourceSlice) -> ResourceSlice:
        body = await self.api.create(SLICES_PATH + self._query, obj)
        return _decode(body, ResourceSlice, "ResourceSlice")

    async def replace(self, obj: ResourceSlice) -> ResourceSlice:
        path = f"{SLICES_PATH}/{obj.metadata.name}{self._query}"
        body = await self.api.replace(path, obj)
        return _decode(body, ResourceSlice, "ResourceSlice")

    async def delete(self, name: str, *, uid: str | None, resource_version: str | None) -> None:
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
        await self.api.delete(f"{SLICES_PATH}/{name}", options)

    async def watch(self, resource_version: str) -> AsyncGenerator[WatchEvent, None]:
        async for event in self.api.watch(
            SLICES_PATH, _selector(None, self.driver), resource_version
        ):
            obj = _decode(event.object, _LiteSlice, "ResourceSlice in a watch event")
            meta = obj.metadata
            yield WatchEvent(event.type, meta.name, obj.spec.node_name, meta.resource_version)  # type: ignore[arg-type]
