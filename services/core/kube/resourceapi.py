"""resource.k8s.io versions: speak the newest the API server serves, convert at the edge.

Kubernetes serves DRA as resource.k8s.io/v1beta1 (1.32), v1beta2 (1.33) and v1
(1.34 and later); a server can also be told to serve only some of them
(``--runtime-config``). Every gpudra component works on the v1 model
(:mod:`services.core.kube.resource`), so the conversion lives here, in one place:
:func:`versioned` asks the server which versions it serves and, unless it is
v1, wraps the :class:`~services.core.kube.client.KubeApi` so that callers keep using
v1 paths and v1 JSON while the wire carries the server's version.

The shapes differ little (k8s.io/api v0.35, compared field by field):

* v1beta2 is v1 under another name: every JSON field is the same.
* v1beta1 nests a device's fields under ``basic`` (``Device{name, basic: {...}}``)
  and puts an exact request's fields on the request itself, where v1 has them
  under ``exactly`` (``DeviceRequest{name, deviceClassName, ..., firstAvailable}``).

Everything else (allocation results, configs, counters, capacity policies,
DeviceClasses) has the same JSON in all three.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

import msgspec

from services.core.kube.client import ApiError, Body, KubeApi, Listing, RawEvent

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
V1, V1BETA2, V1BETA1 = "v1", "v1beta2", "v1beta1"
PREFERENCE = (V1, V1BETA2, V1BETA1)  # newest first
_V1_PREFIX = f"/apis/{GROUP}/{V1}/"

Obj = dict[str, Any]
_B = TypeVar("_B", bound=Body)


class VersionError(ApiError):
    """The API server serves no resource.k8s.io version gpudra speaks."""


class _Group(msgspec.Struct):
    versions: list[dict[str, str]] = []


def group_document(versions: tuple[str, ...] = (V1,)) -> Obj:
    """What ``GET /apis/resource.k8s.io`` answers (an APIGroup), for servers in tests."""
    listed = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": listed,
            "preferredVersion": listed[0]}  # fmt: skip


async def discover(api: KubeApi) -> str:
    """The newest resource.k8s.io version the server serves (GET /apis/resource.k8s.io)."""
    try:
        body = await api.get(f"/apis/{GROUP}")
    except ApiError as exc:
        if exc.not_found:
            raise VersionError(404, f"the API server serves no {GROUP} API at all") from exc
        raise
    try:
        served = [v.get("version", "") for v in msgspec.json.decode(body, type=_Group).versions]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ApiError(0, f"undecodable /apis/{GROUP}: {exc}") from exc
    for version in PREFERENCE:
        if version in served:
            return version
    raise VersionError(
        0, f"the API server serves {GROUP} {served}; gpudra speaks {', '.join(PREFERENCE)}"
    )


class _Resources(msgspec.Struct):
    resources: list[dict[str, Any]] = []


#: Versions that may serve a resource the v1 API does not have yet (DeviceTaintRule:
#: v1alpha3 to 1.35, v1beta2 in 1.36, v1 from 1.37), newest first.
RESOURCE_PREFERENCE = (V1, V1BETA2, "v1alpha3")


async def served_path(api: KubeApi, resource: str) -> str | None:
    """``/apis/resource.k8s.io/<version>/<resource>`` of the newest version that serves
    ``resource`` (GET of each version's resource list), None when none does. The JSON of
    DeviceTaintRule is the same in all three."""
    for version in RESOURCE_PREFERENCE:
        try:
            body = await api.get(f"/apis/{GROUP}/{version}")
        except ApiError as exc:
            if exc.not_found:
                continue
            raise
        try:
            names = [r.get("name") for r in msgspec.json.decode(body, type=_Resources).resources]
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ApiError(0, f"undecodable /apis/{GROUP}/{version}: {exc}") from exc
        if resource in names:
            return f"/apis/{GROUP}/{version}/{resource}"
    return None


def versioned(api: KubeApi) -> ConvertingApi:
    """``api``, speaking the server's resource.k8s.io version (asked on first use)."""
    return ConvertingApi(api)


# ------------------------------------------------------------------ conversion


def _resource(path_after_version: str) -> str:
    """``namespaces/ns/resourceclaims/x/status`` -> ``resourceclaims``."""
    parts = path_after_version.split("?", 1)[0].split("/")
    if parts[0] == "namespaces" and len(parts) >= 3:
        return parts[2]
    return parts[0]


def _device_from_v1(device: Obj) -> Obj:
    return {"name": device.get("name"), "basic": {k: v for k, v in device.items() if k != "name"}}


def _device_to_v1(device: Obj) -> Obj:
    return {"name": device.get("name"), **(device.get("basic") or {})}


def _request_from_v1(request: Obj) -> Obj:
    out = {k: v for k, v in request.items() if k != "exactly"}
    out.update(request.get("exactly") or {})
    return out


_EXACT_KEYS = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess",
               "tolerations", "capacity")  # fmt: skip


def _request_to_v1(request: Obj) -> Obj:
    out = {k: v for k, v in request.items() if k not in _EXACT_KEYS}
    exact = {k: request[k] for k in _EXACT_KEYS if k in request}
    if exact and not request.get("firstAvailable"):
        out["exactly"] = exact
    return out


def _map_devices(spec: Obj, convert: Callable[[Obj], Obj]) -> None:
    if isinstance(spec.get("devices"), list):
        spec["devices"] = [convert(d) for d in spec["devices"]]


def _map_requests(claim_spec: Obj | None, convert: Callable[[Obj], Obj]) -> None:
    devices = (claim_spec or {}).get("devices")
    if isinstance(devices, dict) and isinstance(devices.get("requests"), list):
        devices["requests"] = [convert(r) for r in devices["requests"]]


def convert(obj: Obj, resource: str, version: str, *, to_v1: bool) -> Obj:
    """``obj`` (one object of ``resource``) between v1 and ``version``; changed in place."""
    if version == V1:
        return obj
    if "apiVersion" in obj:
        obj["apiVersion"] = f"{GROUP}/{V1 if to_v1 else version}"
    if version != V1BETA1:
        return obj
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return obj
    if resource == "resourceslices":
        _map_devices(spec, _device_to_v1 if to_v1 else _device_from_v1)
    elif resource == "resourceclaims":
        _map_requests(spec, _request_to_v1 if to_v1 else _request_from_v1)
    elif resource == "resourceclaimtemplates":
        _map_requests(spec.get("spec"), _request_to_v1 if to_v1 else _request_from_v1)
    return obj


class ConvertingApi:
    """A :class:`KubeApi` that speaks v1 to its callers and the server's version to it.

    The version is asked for on the first call that needs it (not at start-up, so
    a component still starts while the API server is away) and kept; on a v1
    server every call goes straight through.
    """

    def __init__(self, api: KubeApi, version: str | None = None) -> None:
        self.api = api
        self.version = version
        self._lock = asyncio.Lock()

    async def _route(self, path: str) -> tuple[str, str | None]:
        """(path on the wire, the resource it names: None when nothing is converted)."""
        if not path.startswith(_V1_PREFIX):
            return path, None
        if self.version is None:
            async with self._lock:
                if self.version is None:
                    self.version = await discover(self.api)
                    log.info("resource.k8s.io version", extra={"version": self.version})
        if self.version == V1:
            return path, None
        rest = path[len(_V1_PREFIX) :]
        return f"/apis/{GROUP}/{self.version}/{rest}", _resource(rest)

    def _in(self, body: bytes | msgspec.Raw, resource: str | None) -> bytes:
        if resource is None or self.version is None:
            return bytes(body)
        obj = msgspec.json.decode(body)
        if not isinstance(obj, dict):
            return bytes(body)
        if obj.get("kind") == "Status":
            return bytes(body)
        return msgspec.json.encode(convert(obj, resource, self.version, to_v1=True))

    def _out(self, body: _B, resource: str | None) -> _B | Obj:
        if resource is None or self.version is None:
            return body
        copied = msgspec.json.decode(msgspec.json.encode(body))  # a copy, as plain data
        return convert(copied, resource, self.version, to_v1=False)

    async def list(self, path: str, params: Mapping[str, str]) -> Listing:
        wire, resource = await self._route(path)
        listing = await self.api.list(wire, params)
        if resource is None:
            return listing
        items = [msgspec.Raw(self._in(raw, resource)) for raw in listing.items]
        return Listing(items, listing.resource_version)

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[RawEvent]:
        wire, resource = await self._route(path)
        async for event in self.api.watch(wire, params, resource_version):
            if event.type == "BOOKMARK" or resource is None:
                yield event
            else:
                yield RawEvent(event.type, msgspec.Raw(self._in(event.object, resource)))

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> bytes:
        wire, resource = await self._route(path)
        return self._in(await self.api.get(wire, params), resource)

    async def create(self, path: str, body: Body) -> bytes:
        wire, resource = await self._route(path)
        return self._in(await self.api.create(wire, self._out(body, resource)), resource)

    async def replace(self, path: str, body: Body) -> bytes:
        wire, resource = await self._route(path)
        return self._in(await self.api.replace(wire, self._out(body, resource)), resource)

    async def patch(self, path: str, body: dict[str, Any]) -> bytes:
        wire, resource = await self._route(path)
        return self._in(await self.api.patch(wire, self._out(body, resource)), resource)

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        wire, resource = await self._route(path)
        return self._in(await self.api.delete(wire, body), resource)

    async def close(self) -> None:
        await self.api.close()
