"""The publisher process against a real nats-server and a recording fake of the Kubernetes API.

The fake speaks the HTTP of the few endpoints the publisher uses (/version,
Nodes, resource.k8s.io/v1 ResourceSlices with field selectors, paging, watch,
delete preconditions) on 127.0.0.1 and keeps state in
:class:`MemorySliceApi`, so every write is recorded. It stands in until the real
kube-apiserver fixture of tests/e2e is available to this tier.
"""

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
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web

from services.core import subjects
from services.core.bus import Bus
from services.core.kube import ApiError, http_api
from services.core.natsserver import NatsServer, free_port
from services.core.resource import ResourceSlice, to_builtins
from services.core.schemas import NodeInventory, PluginPresence
from services.publisher.kubeapi import KubeSliceApi
from services.publisher.memoryapi import MemorySliceApi
from tests.unit.test_render import h100, node

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


# --------------------------------------------------------------------------- fake API server


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    return web.json_response({**body, "reason": reason, "message": message}, status=code)


def _selected_node(request: web.Request) -> str | None:
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
        self.app.router.add_get("/api/v1/nodes/{name}", self.node)
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
            return _status(exc.status, exc.reason or "Failure", exc.message)

    async def version(self, request: web.Request) -> web.Response:
        minor = await self.api.server_minor()
        return web.json_response({"major": "1", "minor": str(minor), "gitVersion": f"v1.{minor}.0"})

    async def node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        uid = await self.api.node_uid(name)
        if uid is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        return web.json_response({"kind": "Node", "metadata": {"name": name, "uid": uid}})

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        node = _selected_node(request)
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


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    fake = FakeKube(MemorySliceApi(history_size=1000))
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


# --------------------------------------------------------------------------- the process


class PublisherProcess:
    def __init__(self, nats: NatsServer, kubeconfig: Path, log: Path, *extra: str) -> None:
        self.metrics_port = free_port()
        args = [
            sys.executable, "-m", "services.cli", "publisher",
            "--nats-url", nats.url,
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
def _publisher(
    nats: NatsServer, kube: FakeKube, tmp: Path, *extra: str
) -> Iterator[PublisherProcess]:
    proc = PublisherProcess(
        nats, kube.kubeconfig(tmp / "kubeconfig"), tmp / "publisher.log", *extra
    )
    try:
        yield proc
    finally:
        proc.stop()


async def _until(
    condition: Callable[[], bool], what: str, proc: PublisherProcess, timeout: float = 20.0
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


def _nodes(kube: FakeKube) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in kube.api.stored():
        out[s.spec.node_name or ""] = out.get(s.spec.node_name or "", 0) + len(s.spec.devices or [])
    return out


async def _put_inventory(bus: Bus, inv: NodeInventory) -> None:
    await bus.kv_put(subjects.INVENTORY_BUCKET, subjects.inventory_key(inv.node), inv)


# --------------------------------------------------------------------------- tests


async def test_inventory_in_kv_becomes_slices_once_the_plugin_is_registered(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    with _publisher(nats_server, kube, tmp_path) as proc:
        await _put_inventory(bus, node("gpu-node-1"))
        await asyncio.sleep(1.0)
        assert proc.alive() and kube.api.writes == []  # no presence record: nothing published
        presence = PluginPresence(node="gpu-node-1", driver="gpu.nvidia.com", endpoint="/x")
        key = subjects.presence_key("gpu-node-1", "gpu.nvidia.com")
        await bus.kv_put(subjects.PRESENCE_BUCKET, key, presence)
        await _until(lambda: _nodes(kube) == {"gpu-node-1": 8}, "slices of gpu-node-1", proc)
        (s,) = kube.api.stored()
        assert [d.name for d in s.spec.devices or []] == [f"gpu-{i}" for i in range(8)]
        assert (s.metadata.owner_references or [])[0].uid == kube.api.nodes["gpu-node-1"]
        await bus.kv_delete(subjects.PRESENCE_BUCKET, key)
        await _until(lambda: not kube.api.stored(), "slices removed with the plugin", proc)


async def test_malformed_inventory_is_counted_and_skipped_and_the_service_keeps_going(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    with _publisher(nats_server, kube, tmp_path, "--force-registered") as proc:
        kv = await bus.kv(subjects.INVENTORY_BUCKET)
        await kv.put("broken", b"\xc1 this is not msgpack")
        await _until(
            lambda: (
                proc.metric("gpudra_bus_malformed_messages_total", '{source="kv:inventory"}') >= 1
            ),
            "the malformed inventory to be counted",
            proc,
        )
        unpublishable = node("n-bad", [h100(0, cuda_compute_capability="nine")])
        await _put_inventory(bus, unpublishable)
        await _until(
            lambda: (
                proc.metric("gpudra_publisher_invalid_inventories_total", '{reason="render"}') == 1
            ),
            "the unpublishable inventory to be counted",
            proc,
        )
        await _put_inventory(bus, node("n2"))
        await _until(lambda: _nodes(kube) == {"n2": 8}, "slices of n2", proc)
        log = proc.log.read_text()
        assert "skipping malformed message" in log and "cuda_compute_capability: 'nine'" in log
        assert proc.alive()


async def test_restart_writes_nothing_and_removal_deletes(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    gates = ("--force-registered", "--feature-gates", "DynamicMIG=true")
    await _put_inventory(bus, node("n1"))
    await _put_inventory(bus, node("n2"))
    with _publisher(nats_server, kube, tmp_path, *gates) as proc:
        await _until(lambda: len(kube.api.stored()) == 18, "18 slices", proc)
        await _until(lambda: proc.metric("gpudra_publisher_published_nodes") == 2, "2 nodes", proc)
        assert {s.spec.pool.generation for s in kube.api.stored()} == {1}
    writes = len(kube.api.writes)
    with _publisher(nats_server, kube, tmp_path, *gates) as proc:
        await _until(lambda: proc.metric("gpudra_publisher_published_nodes") == 2, "restart", proc)
        await asyncio.sleep(0.5)
        assert len(kube.api.writes) == writes  # a restart causes zero writes
        await kube.api.remove("n1-gpu.nvidia.com-3")  # the kubelet or an admin deletes one
        await _until(lambda: len(kube.api.stored()) == 18, "the deleted slice back", proc)
        await bus.kv_delete(subjects.INVENTORY_BUCKET, subjects.inventory_key("n2"))
        await _until(lambda: _nodes(kube) == {"n1": 26 * 8}, "n2's slices deleted", proc)


# --------------------------------------------------------------------------- the client alone


async def test_kube_slice_api_pages_watches_and_reports_errors(
    kube: FakeKube, tmp_path: Path
) -> None:
    client = KubeSliceApi(await http_api(str(kube.kubeconfig(tmp_path / "kc"))))
    try:
        assert await client.server_minor() == 35
        assert await client.node_uid("nope") is not None  # the fake knows every node
        kube.api.missing_nodes.add("gone")
        assert await client.node_uid("gone") is None
        from services.publisher.render import RenderOptions, render_slices

        many = render_slices(node("n1", [h100(i) for i in range(8)]), RenderOptions())
        for i in range(600):  # more than one page of 500
            s = msgspec.structs.replace(
                many[0], metadata=msgspec.structs.replace(many[0].metadata, name=f"s-{i}")
            )
            await client.create(s)
        listing = await client.list_slices("n1")
        assert len(listing.items) == 600 and listing.resource_version == "600"
        assert (await client.slice_nodes()).nodes == {"n1"}
        with pytest.raises(ApiError) as conflict:
            await client.create(listing.items[0])
        assert conflict.value.conflict and conflict.value.reason == "AlreadyExists"
        stale = listing.items[0]
        await client.replace(stale)
        with pytest.raises(ApiError) as again:
            await client.replace(stale)
        assert again.value.status == 409
        events = client.watch(listing.resource_version)
        await client.delete("s-1", uid=None, resource_version=None)
        first = await asyncio.wait_for(anext(events), 5)
        assert (first.type, first.name, first.node) == ("MODIFIED", "s-0", "n1")
        second = await asyncio.wait_for(anext(events), 5)
        assert (second.type, second.name) == ("DELETED", "s-1")
        assert int(second.resource_version) > int(first.resource_version)
        await events.aclose()
        with pytest.raises(ApiError) as missing:
            await client.delete("s-1", uid=None, resource_version=None)
        assert missing.value.not_found
        kube.api.expire_history()
        with pytest.raises(ApiError) as expired:
            async for _ in client.watch("1"):
                pass
        assert expired.value.gone
    finally:
        await client.close()
