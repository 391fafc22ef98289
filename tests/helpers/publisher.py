"""The publisher as a process against a recording fake of the Kubernetes API's slice endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.kube import resourceapi
from services.core.kube.client import ApiError
from services.core.kube.resource import ResourceSlice, to_builtins
from services.core.model.schemas import NodeInventory
from services.local.natsserver import NatsServer
from services.local.ports import free_port
from services.publisher.memoryapi import MemorySliceApi

REPO = Path(__file__).resolve().parents[2]

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    return web.json_response({**body, "reason": reason, "message": message}, status=code)


def selected_node(request: web.Request) -> str | None:
    node = None
    for term in filter(None, request.query.get("fieldSelector", "").split(",")):
        key, _, value = term.partition("=")
        if key == "spec.nodeName":
            node = value
        elif key != "spec.driver" or value != "gpu.nvidia.com":
            raise web.HTTPBadRequest(text=f"unsupported field selector {term!r}")
    return node


class FakeKube:
    """HTTP in front of a MemorySliceApi."""

    def __init__(self, api: MemorySliceApi) -> None:
        self.api = api
        self.app = web.Application()
        self.app.router.add_get("/version", self.version)
        self.app.router.add_get("/version/", self.version)
        self.app.router.add_get("/api/v1/nodes", self.node_list)
        self.app.router.add_get("/api/v1/nodes/{name}", self.node)
        self.app.router.add_get("/apis/resource.k8s.io", self.group)
        self.app.router.add_get(SLICES, self.list_or_watch)
        self.app.router.add_post(SLICES, self.create)
        self.app.router.add_put(SLICES + "/{name}", self.replace)
        self.app.router.add_delete(SLICES + "/{name}", self.delete)
        self.runner = web.AppRunner(self.app)
        self.port = free_port()
        self.watches: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        for task in self.watches:  # a watch never ends by itself
            task.cancel()
        await self.runner.cleanup()

    def kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "test"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    async def _guard(self, call: Callable[[], Any]) -> Any:
        try:
            return await call()
        except ApiError as exc:
            return status(exc.status, exc.reason or "Failure", exc.message)

    async def group(self, request: web.Request) -> web.Response:
        return web.json_response(resourceapi.group_document())

    async def version(self, request: web.Request) -> web.Response:
        minor = await self.api.server_minor()
        return web.json_response({"major": "1", "minor": str(minor), "gitVersion": f"v1.{minor}.0"})

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        uid = await self.api.node_uid(name)
        if uid is None:
            return status(404, "NotFound", f'nodes "{name}" not found')
        return web.json_response({"kind": "Node", "metadata": {"name": name, "uid": uid}})

    async def node_list(self, request: web.Request) -> web.Response:
        uids = await self.api.node_uids()
        items = [{"metadata": {"name": n, "uid": uid}} for n, uid in sorted(uids.items())]
        meta = {"resourceVersion": str(len(items))}
        return web.json_response({"kind": "NodeList", "metadata": meta, "items": items})

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        node = selected_node(request)
        if request.query.get("watch", "").lower() in ("true", "1"):
            return await self._watch(request, node)
        listing = await self.api.list_slices(node)
        limit = int(request.query.get("limit", "0")) or len(listing.items) or 1
        start = int(request.query.get("continue", "0") or 0)
        page = listing.items[start : start + limit]
        more = start + limit < len(listing.items)
        meta = {"resourceVersion": listing.resource_version}
        if more:
            meta["continue"] = str(start + limit)
        items = [to_builtins(s) for s in page]
        return web.json_response({"kind": "ResourceSliceList", "metadata": meta, "items": items})

    async def _watch(self, request: web.Request, node: str | None) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        task = asyncio.current_task()
        assert task is not None
        self.watches.add(task)
        try:
            since = request.query.get("resourceVersion", "0")
            async for kind, obj in self.api.watch_objects(since):
                if node is None or obj.spec.node_name == node:
                    line = {"type": kind, "object": to_builtins(obj)}
                    await response.write(json.dumps(line).encode() + b"\n")
        except ApiError as exc:
            status = {"kind": "Status", "code": exc.status, "reason": exc.reason,
                      "message": exc.message}  # fmt: skip
            await response.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
        except ConnectionError:
            pass  # the client went away
        finally:
            self.watches.discard(task)
        return response

    async def create(self, request: web.Request) -> web.Response:
        obj = msgspec.json.decode(await request.read(), type=ResourceSlice)

        async def call() -> web.Response:
            return web.json_response(to_builtins(await self.api.create(obj)), status=201)

        return await self._guard(call)  # type: ignore[no-any-return]

    async def replace(self, request: web.Request) -> web.Response:
        obj = msgspec.json.decode(await request.read(), type=ResourceSlice)

        async def call() -> web.Response:
            return web.json_response(to_builtins(await self.api.replace(obj)))

        return await self._guard(call)  # type: ignore[no-any-return]

    async def delete(self, request: web.Request) -> web.Response:
        options = json.loads(await request.read() or b"{}")
        pre = options.get("preconditions") or {}

        async def call() -> web.Response:
            await self.api.delete(
                request.match_info["name"],
                uid=pre.get("uid"),
                resource_version=pre.get("resourceVersion"),
            )
            return web.json_response({"kind": "Status", "status": "Success"})

        return await self._guard(call)  # type: ignore[no-any-return]


class PublisherProcess:
    def __init__(self, nats: NatsServer, kubeconfig: Path, log: Path, *extra: str) -> None:
        self.metrics_port = free_port()
        args = [
            sys.executable, "-m", "services.cli", "publisher",
            *nats.client_argv(Role.PUBLISHER),
            "--kubeconfig", str(kubeconfig),
            "--metrics-port", str(self.metrics_port),
            "--resync-interval", "3600",
            *extra,
        ]  # fmt: skip
        self.log = log
        self.proc = subprocess.Popen(
            args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(log, "ab"), env=os.environ.copy()
        )

    def metric(self, name: str, labels: str = "") -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as resp:
                text = resp.read().decode()
        except OSError:  # not serving yet
            return 0.0
        for line in text.splitlines():
            if line.startswith(name + (labels or "")) and not line.startswith("#"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def publisher(
    nats: NatsServer, kube: FakeKube, tmp: Path, *extra: str
) -> Iterator[PublisherProcess]:
    proc = PublisherProcess(
        nats, kube.kubeconfig(tmp / "kubeconfig"), tmp / "publisher.log", *extra
    )
    try:
        yield proc
    finally:
        proc.stop()


async def until(
    condition: Callable[[], bool], what: str, proc: PublisherProcess, timeout: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if not proc.alive():
            pytest.fail(
                f"publisher exited while waiting for {what}:\n{proc.log.read_text()[-3000:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{proc.log.read_text()[-3000:]}")
        await asyncio.sleep(0.05)


def nodes_of(kube: FakeKube) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in kube.api.stored():
        out[s.spec.node_name or ""] = out.get(s.spec.node_name or "", 0) + len(s.spec.devices or [])
    return out


async def put_inventory(bus: Bus, inv: NodeInventory) -> None:
    await bus.kv_put(subjects.INVENTORY_BUCKET, subjects.inventory_key(inv.node), inv)
