"""The one Kubernetes API client every service uses: raw JSON over aiohttp.

:mod:`services.core.kube.kubeconfig` says where the server is and how to
authenticate (the Kubernetes client library is imported only for kubeconfigs
that run a credential program); callers decode the JSON themselves into
:mod:`services.core.kube.resource` models (faster than the generated models, and
the exact wire shape). Every failure is an
:class:`ApiError` with the HTTP status (0: no answer), so callers decide on
retries by status alone. :mod:`services.core.kube.informer` keeps a watch going on
top of :meth:`HttpKubeApi.watch`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import msgspec

from services.core.kit import limits
from services.core.kit.ratelimit import TokenBucket
from services.core.kube.kubeconfig import Endpoint, load

PAGE_SIZE = 500
WATCH_TIMEOUT_S = 300  # the server ends a watch after this; we resume from the last RV
REQUEST_TIMEOUT_S = 30.0


class ApiError(Exception):
    """A failed API call, with the HTTP status (0: no answer at all)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"HTTP {status} {reason}: {message}".replace("  ", " "))
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def gone(self) -> bool:
        """The resourceVersion or continue token is too old (compacted): list again."""
        return self.status == 410

    @property
    def conflict(self) -> bool:
        """Stale resourceVersion, AlreadyExists or a failed precondition."""
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def retryable(self) -> bool:
        """Worth another try after a pause; 400/403/422 need a different request."""
        return self.status in (0, 404, 409, 410, 429) or self.status >= 500


@dataclass(frozen=True, slots=True)
class Listing:
    items: list[msgspec.Raw]
    resource_version: str  # where a watch continues from


@dataclass(frozen=True, slots=True)
class RawEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: msgspec.Raw


#: A request's JSON body: plain data, or a model (:mod:`services.core.kube.resource`)
#: that is encoded straight from its struct (no copy into dicts first).
Body = dict[str, Any] | msgspec.Struct


class KubeApi(Protocol):
    """Every call the services make; :class:`HttpKubeApi` is the real one."""

    async def list(self, path: str, params: Mapping[str, str]) -> Listing: ...

    def watch(
        self, path: str, params: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[RawEvent]: ...

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> bytes: ...

    async def create(self, path: str, body: Body) -> bytes: ...

    async def replace(self, path: str, body: Body) -> bytes: ...

    async def patch(self, path: str, body: dict[str, Any]) -> bytes: ...

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> bytes: ...

    async def close(self) -> None: ...


class _ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _List(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] | None = None


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Status(msgspec.Struct):
    code: int = 0
    reason: str = ""
    message: str = ""


async def http_api(
    kubeconfig: str | None, *, connections: int = 100, qps: float = 0.0, burst: int = 1
) -> HttpKubeApi:
    """:class:`HttpKubeApi` from a kubeconfig file, or in-cluster when empty.

    ``connections``: the most requests in flight at once (HTTP/1.1, one per
    connection; a publisher writing slices concurrently wants enough); ``qps``
    and ``burst``: the request budget (:class:`TokenBucket`; 0: none)."""
    return HttpKubeApi(await load(kubeconfig), connections=connections, qps=qps, burst=burst)


_JSON = msgspec.json.Encoder()


class HttpKubeApi:
    """:class:`KubeApi` over one aiohttp session (created on first use, in the loop)."""

    def __init__(
        self, endpoint: Endpoint, *, connections: int = 100, qps: float = 0.0, burst: int = 1
    ) -> None:
        self.endpoint = endpoint
        self.connections = connections
        self.budget = TokenBucket(qps, burst)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.endpoint.ssl, limit=self.connections)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def list(self, path: str, params: Mapping[str, str]) -> Listing:
        """Every page of a list (``limit``/``continue``), and the list's resourceVersion."""
        items: list[msgspec.Raw] = []
        token = ""
        while True:
            query = {**params, "limit": str(PAGE_SIZE)}
            if token:
                query["continue"] = token
            body = await self._call("GET", path, query)
            try:
                page = _decode_page(body)
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                raise ApiError(0, f"undecodable list of {path}: {exc}") from exc
            items += page.items or []
            token = page.metadata.continue_
            if not token:
                return Listing(items, page.metadata.resource_version)

    async def watch(
        self, path: str, params: Mapping[str, str], resource_version: str
    ) -> AsyncIterator[RawEvent]:
        """Changes after ``resource_version`` (bookmarks included); ApiError(410) when expired."""
        query = {
            **params,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }
        resp = await self._open("GET", path, query, timeout=None)
        try:
            async for line in watch_lines(resp):
                try:
                    raw = _decode_event(line)
                except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                    raise ApiError(0, f"undecodable watch event on {path}: {exc}") from exc
                if raw.type == "ERROR":
                    raise status_error(0, bytes(raw.object))
                yield RawEvent(raw.type, raw.object)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ApiError(0, f"watch of {path} broke: {type(exc).__name__}: {exc}") from exc
        finally:
            resp.release()

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> bytes:
        return await self._call("GET", path, params or {})

    async def create(self, path: str, body: Body) -> bytes:
        return await self._call("POST", path, {}, body=body)

    async def replace(self, path: str, body: Body) -> bytes:
        return await self._call("PUT", path, {}, body=body)

    async def patch(self, path: str, body: dict[str, Any]) -> bytes:
        headers = {"Content-Type": "application/merge-patch+json"}
        return await self._call("PATCH", path, {}, body=body, headers=headers)

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        return await self._call("DELETE", path, {}, body=body)

    async def _call(
        self,
        method: str,
        path: str,
        query: Mapping[str, str],
        body: Body | None = None,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        resp = await self._open(method, path, query, body, headers, timeout=REQUEST_TIMEOUT_S)
        try:
            return await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ApiError(0, f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        finally:
            resp.release()

    async def _open(
        self,
        method: str,
        path: str,
        query: Mapping[str, str],
        body: Body | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = REQUEST_TIMEOUT_S,
    ) -> aiohttp.ClientResponse:
        sent = {"Accept": "application/json"}
        sent.update(await self.endpoint.headers())
        data = None
        if body is not None:
            data = _JSON.encode(body)
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        limit = aiohttp.ClientTimeout(total=timeout, sock_connect=REQUEST_TIMEOUT_S)
        await self.budget.acquire()
        try:
            resp = await self._client().request(
                method,
                self.endpoint.server + path,
                params=query,
                data=data,
                headers=sent,
                timeout=limit,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ApiError(0, f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= resp.status <= 299:
            data = await resp.read()
            resp.release()
            raise status_error(resp.status, data)
        return resp


async def watch_lines(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """Newline-delimited watch events of any size (aiohttp's readline caps line length)."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


def _decode_page(body: bytes) -> _List:
    """A list page; one item too deep for the decoder is split off, to fail on its own."""
    try:
        return msgspec.json.decode(body, type=_List)
    except RecursionError:
        fields = limits.members(body)
        meta = msgspec.json.decode(fields.get("metadata", b"{}"), type=_ListMeta)
        items = [msgspec.Raw(item) for item in limits.elements(fields.get("items", b"[]"))]
        return _List(meta, items)


def _decode_event(line: bytes) -> _Event:
    """A watch event; an object too deep for the decoder is passed on as it is."""
    try:
        return msgspec.json.decode(line, type=_Event)
    except RecursionError:
        fields = limits.members(line)
        kind = msgspec.json.decode(fields.get("type", b'""'), type=str)
        return _Event(kind, msgspec.Raw(fields.get("object", b"{}")))


def status_error(code: int, body: bytes) -> ApiError:
    """The API server's ``Status`` answer as an :class:`ApiError` (or its first bytes)."""
    try:
        status = msgspec.json.decode(body, type=_Status)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ApiError(code, body[:200].decode(errors="replace"))
    return ApiError(status.code or code, status.message, status.reason)


class _Version(msgspec.Struct):
    git_version: str = msgspec.field(default="", name="gitVersion")
    minor: str = ""


async def _version(api: KubeApi) -> _Version:
    try:
        return msgspec.json.decode(await api.get("/version"), type=_Version)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ApiError(0, f"GET /version: not a version document: {exc}") from exc


async def server_version(api: KubeApi) -> str:
    """The API server's release (``GET /version``: its ``gitVersion``, e.g. ``v1.37.2``)."""
    return (await _version(api)).git_version


async def server_minor(api: KubeApi) -> int:
    """The API server's minor version (``GET /version``: ``minor``, e.g. ``37`` or ``37+``);
    ApiError when unreadable."""
    minor = (await _version(api)).minor
    digits = re.match(r"\d+", minor)
    if digits is None:
        raise ApiError(0, f"unreadable server minor version {minor!r}")
    return int(digits.group())
