""":class:`SliceApi` against a real API server, through kubernetes-asyncio.

kubernetes-asyncio builds the requests (auth, TLS, kubeconfig); we read the raw
JSON ourselves into :mod:`services.core.resource` models, which is both faster
than its generated models and exactly the wire shape we render.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp
import msgspec
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from services.core import nvidia
from services.core.resource import ResourceSlice, to_builtins
from services.publisher.sliceapi import ApiError, SliceList, SliceNodes, WatchEvent

_PAGE = 500
WATCH_TIMEOUT_S = 300


class _ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _SliceList(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[ResourceSlice] = []


class _Status(msgspec.Struct):
    code: int = 0
    reason: str = ""
    message: str = ""


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Meta(msgspec.Struct, rename="camel"):
    uid: str = ""
    name: str = ""
    resource_version: str = ""


class _LiteSpec(msgspec.Struct, rename="camel"):
    node_name: str = ""


class _LiteSlice(msgspec.Struct):
    """Only what identifies a slice; decoding skips the devices without building them."""

    metadata: _Meta
    spec: _LiteSpec = msgspec.field(default_factory=_LiteSpec)


class _LiteList(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[_LiteSlice] = []


class _Named(msgspec.Struct):
    metadata: _Meta


class _Version(msgspec.Struct):
    minor: str


def _selector(node: str | None) -> str:
    selector = f"spec.driver={nvidia.DRIVER_NAME}"
    return f"{selector},spec.nodeName={node}" if node else selector


class KubeSliceApi:
    """ResourceSlices in resource.k8s.io/v1, Nodes in core/v1, /version."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.resource = client.ResourceV1Api(api_client)
        self.core = client.CoreV1Api(api_client)

    async def close(self) -> None:
        await self.api_client.close()

    async def server_minor(self) -> int:
        body = await _call(client.VersionApi(self.api_client).get_code)
        minor = msgspec.json.decode(body, type=_Version).minor
        digits = re.match(r"\d+", minor)
        if digits is None:
            raise ApiError(0, f"unreadable server minor version {minor!r}")
        return int(digits.group())

    async def node_uid(self, node: str) -> str | None:
        try:
            body = await _call(self.core.read_node, node)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise
        return msgspec.json.decode(body, type=_Named).metadata.uid or None

    async def list_slices(self, node: str | None = None) -> SliceList:
        items: list[ResourceSlice] = []
        token = ""
        while True:
            kwargs: dict[str, Any] = {"field_selector": _selector(node), "limit": _PAGE}
            if token:
                kwargs["_continue"] = token
            page = msgspec.json.decode(
                await _call(self.resource.list_resource_slice, **kwargs), type=_SliceList
            )
            items += page.items
            token = page.metadata.continue_
            if not token:
                return SliceList(items, page.metadata.resource_version)

    async def slice_nodes(self) -> SliceNodes:
        nodes: set[str] = set()
        token = ""
        while True:
            kwargs: dict[str, Any] = {"field_selector": _selector(None), "limit": _PAGE}
            if token:
                kwargs["_continue"] = token
            page = msgspec.json.decode(
                await _call(self.resource.list_resource_slice, **kwargs), type=_LiteList
            )
            nodes.update(item.spec.node_name for item in page.items if item.spec.node_name)
            token = page.metadata.continue_
            if not token:
                return SliceNodes(nodes, page.metadata.resource_version)

    async def create(self, obj: ResourceSlice) -> ResourceSlice:
        body = await _call(self.resource.create_resource_slice, to_builtins(obj))
        return msgspec.json.decode(body, type=ResourceSlice)

    async def replace(self, obj: ResourceSlice) -> ResourceSlice:
        body = await _call(
            self.resource.replace_resource_slice, obj.metadata.name, to_builtins(obj)
        )
        return msgspec.json.decode(body, type=ResourceSlice)

    async def delete(self, name: str, *, uid: str | None, resource_version: str | None) -> None:
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
        await _call(self.resource.delete_resource_slice, name, body=options)

    async def watch(self, resource_version: str) -> AsyncGenerator[WatchEvent, None]:
        resp = await _open(
            self.resource.list_resource_slice,
            field_selector=_selector(None),
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
        )
        try:
            async for line in _lines(resp):
                event = _decode_event(line)
                if event is not None:
                    yield event
        finally:
            resp.release()


def _decode_event(line: bytes) -> WatchEvent | None:
    try:
        raw = msgspec.json.decode(line, type=_Event)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ApiError(0, f"undecodable watch event: {exc}") from exc
    if raw.type == "ERROR":
        status = msgspec.json.decode(raw.object, type=_Status)
        raise ApiError(status.code, status.message, reason=status.reason)
    if raw.type not in ("ADDED", "MODIFIED", "DELETED"):
        return None  # BOOKMARK
    try:
        obj = msgspec.json.decode(raw.object, type=_LiteSlice)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ApiError(0, f"undecodable ResourceSlice in a watch event: {exc}") from exc
    meta = obj.metadata
    return WatchEvent(raw.type, meta.name, obj.spec.node_name, meta.resource_version)  # type: ignore[arg-type]


async def _lines(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Newline-delimited watch events of any size (aiohttp's readline caps line length)."""
    buffer = b""
    try:
        async for chunk in resp.content.iter_any():
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                if line.strip():
                    yield line
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ApiError(0, f"watch stream broke: {type(exc).__name__}: {exc}") from exc
    if buffer.strip():
        yield buffer


async def _open(method: Any, *args: Any, **kwargs: Any) -> aiohttp.ClientResponse:
    """Send the request; raise :class:`ApiError` for a non-2xx answer or no answer."""
    try:
        resp: aiohttp.ClientResponse = await method(*args, _preload_content=False, **kwargs)
    except ApiException as exc:
        raise ApiError(int(exc.status or 0), str(exc.reason)) from exc
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ApiError(0, f"{type(exc).__name__}: {exc}") from exc
    if not 200 <= resp.status <= 299:
        body = await resp.read()
        resp.release()
        raise _status_error(resp.status, body)
    return resp


async def _call(method: Any, *args: Any, **kwargs: Any) -> bytes:
    resp = await _open(method, *args, **kwargs)
    try:
        return await resp.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ApiError(0, f"{type(exc).__name__}: {exc}") from exc
    finally:
        resp.release()


def _status_error(code: int, body: bytes) -> ApiError:
    try:
        status = msgspec.json.decode(body, type=_Status)
        return ApiError(code, status.message, reason=status.reason)
    except (msgspec.DecodeError, msgspec.ValidationError, json.JSONDecodeError):
        return ApiError(code, body[:200].decode(errors="replace"))
