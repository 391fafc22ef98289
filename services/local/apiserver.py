"""An in-memory API server for the node's preparer, for benchmarks and tests (never deployed).

It serves what ``gpudra preparer`` reads, over HTTP on 127.0.0.1, with the
API server's wire shapes: GET of a ResourceClaim, GET of a Pod, and the list
and watch of Pods with the field selector ``spec.nodeName=<node>`` (the
preparer's pod watch). Objects are plain JSON data; every change gets the next
resourceVersion and is kept for watches that start from an older one. It
counts the GETs it answers, so a test can say how many API calls a prepare
cost. Given a ``version`` (``v1.37.2``) it also answers ``GET /version`` and
merge patches of a claim's status (``status.devices``, with the UID and
resourceVersion preconditions), so a preparer there writes its claims' device
status (services/preparer/devicestatus.py); without one it serves neither, as
before, and the preparer writes nothing.

    api = MemoryApiServer()
    await api.start()
    api.put_claim(claim)
    api.put_pod(pod_object("p", "default", "n1", ["claim"]))
    ... gpudra preparer --kubeconfig api.kubeconfig(path) ...
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from services.core.kube import resourceapi
from services.core.kube.resource import ResourceClaim, to_builtins
from services.local.ports import free_port

GROUP = "/apis/resource.k8s.io"  # API discovery: which versions are served (v1 here)
CLAIM = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
POD = "/api/v1/namespaces/{ns}/pods/{name}"
PODS = "/api/v1/pods"

Obj = dict[str, Any]


def pod_object(
    name: str,
    namespace: str,
    node: str,
    claims: Sequence[str],
    *,
    uid: str | None = None,
    phase: str = "Pending",
) -> Obj:
    """A Pod bound to ``node`` that uses the named ResourceClaims (``node`` "": unscheduled)."""
    refs = [{"name": f"c{i}", "resourceClaimName": claim} for i, claim in enumerate(claims)]
    spec: Obj = {"containers": [{"name": "main", "image": "x"}], "resourceClaims": refs}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": spec,
        "status": {"phase": phase},
    }


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    return web.json_response({**body, "reason": reason, "message": message}, status=code)


class MemoryApiServer:
    def __init__(self, version: str | None = None) -> None:
        self.version = version
        self.claims: dict[tuple[str, str], Obj] = {}
        self.pods: dict[tuple[str, str], Obj] = {}
        self.served: collections.Counter[str] = collections.Counter()  # "claim", "pod", "pods"
        self.port = free_port()
        self._rv = 0
        self._events: list[tuple[int, str, Obj]] = []  # (resourceVersion, type, pod)
        self._event_rvs: list[int] = []
        self._changed = asyncio.Event()
        self._answered = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._watches: set[asyncio.Task[Any]] = set()

    @property
    def started(self) -> bool:
        return self._runner is not None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(GROUP, self._group)
        app.router.add_get(CLAIM, self._get_claim)
        app.router.add_get(POD, self._get_pod)
        app.router.add_get(PODS, self._list_or_watch)
        if self.version is not None:
            app.router.add_get("/version", self._version)
            app.router.add_patch(CLAIM + "/status", self._patch_claim_status)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        for task in list(self._watches):  # a watch never ends by itself
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "memory", "cluster": {"server": self.url}}],
            "users": [{"name": "memory", "user": {"token": "memory"}}],
            "contexts": [{"name": "memory", "context": {"cluster": "memory", "user": "memory"}}],
            "current-context": "memory",
        }
        path.write_text(json.dumps(config))
        return path

    # ------------------------------------------------------------ objects

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def put_claim(self, claim: ResourceClaim) -> None:
        obj = to_builtins(claim)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self.claims[(claim.metadata.namespace or "", claim.metadata.name)] = obj

    def delete_claim(self, namespace: str, name: str) -> None:
        self.claims.pop((namespace, name), None)

    def put_pod(self, pod: Obj) -> Obj:
        """Add or change a pod (a new uid under an old name replaces the old pod)."""
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        old = self.pods.get(key)
        if old is not None and old["metadata"]["uid"] != meta["uid"]:
            self.delete_pod(*key)
            old = None
        meta["resourceVersion"] = self._next_rv()
        self.pods[key] = pod
        self._emit("MODIFIED" if old is not None else "ADDED", pod)
        return pod

    def delete_pod(self, namespace: str, name: str) -> None:
        pod = self.pods.pop((namespace, name), None)
        if pod is not None:
            pod["metadata"]["resourceVersion"] = self._next_rv()
            self._emit("DELETED", pod)

    def _emit(self, kind: str, pod: Obj) -> None:
        self._events.append((self._rv, kind, json.loads(json.dumps(pod))))
        self._event_rvs.append(self._rv)
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_served(self, kind: str, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` GETs of ``kind`` ("claim", "pod") were answered in all."""
        async with asyncio.timeout(timeout):
            while self.served[kind] < count:
                await self._answered.wait()

    def _serve(self, kind: str) -> None:
        self.served[kind] += 1
        self._answered.set()
        self._answered = asyncio.Event()

    # ------------------------------------------------------------ HTTP

    async def _group(self, request: web.Request) -> web.Response:
        return web.json_response(resourceapi.group_document())

    async def _get_claim(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        claim = self.claims.get((ns, name))
        if request.query.get("resourceVersion") == "0":  # any version: the watch cache's
            self.served["claim from cache"] += 1
        self._serve("claim" if claim is not None else "missing claim")
        if claim is None:
            return _status(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found')
        return web.json_response(claim)

    async def _version(self, request: web.Request) -> web.Response:
        minor = (self.version or "").lstrip("v").split(".")[1]
        return web.json_response({"major": "1", "minor": minor, "gitVersion": self.version})

    async def _patch_claim_status(self, request: web.Request) -> web.Response:
        """A merge patch of ``status.devices`` only, as the device-status writer sends it."""
        self._serve("status")
        ns, name = request.match_info["ns"], request.match_info["name"]
        claim = self.claims.get((ns, name))
        if claim is None:
            return _status(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found')
        patch = await request.json()
        meta = patch.get("metadata") or {}
        if meta.get("uid") not in (None, claim["metadata"].get("uid")):
            return _status(422, "Invalid", "metadata.uid: field is immutable")
        if meta.get("resourceVersion") not in (None, claim["metadata"]["resourceVersion"]):
            return _status(409, "Conflict", "the object has been modified")
        status = dict(claim.get("status") or {})
        devices = (patch.get("status") or {}).get("devices")
        if devices:
            status["devices"] = devices
        else:
            status.pop("devices", None)
        claim = {**claim, "status": status}
        claim["metadata"] = {**claim["metadata"], "resourceVersion": self._next_rv()}
        self.claims[(ns, name)] = claim
        return web.json_response(claim)

    async def _get_pod(self, request: web.Request) -> web.Response:
        self._serve("pod")
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        return web.json_response(pod)

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        node = None
        for term in filter(None, request.query.get("fieldSelector", "").split(",")):
            key, _, value = term.partition("=")
            if key != "spec.nodeName":
                return _status(400, "BadRequest", f"unsupported field selector {term!r}")
            node = value
        if request.query.get("watch", "").lower() in ("true", "1"):
            return await self._watch(request, node, int(request.query.get("resourceVersion") or 0))
        self._serve("pods")
        items = [p for p in self.pods.values() if node is None or _node(p) == node]
        meta = {"resourceVersion": str(self._rv)}
        return web.json_response({"kind": "PodList", "metadata": meta, "items": items})

    async def _watch(
        self, request: web.Request, node: str | None, since: int
    ) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        task = asyncio.current_task()
        assert task is not None
        self._watches.add(task)
        try:
            while True:
                changed = self._changed
                start = bisect.bisect_right(self._event_rvs, since)
                for rv, kind, pod in self._events[start:]:
                    if node is None or _node(pod) == node:
                        line = json.dumps({"type": kind, "object": pod}).encode() + b"\n"
                        await response.write(line)
                    since = rv
                await changed.wait()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the server stops
        finally:
            self._watches.discard(task)
        return response


def _node(pod: Obj) -> str:
    return str(pod.get("spec", {}).get("nodeName") or "")
