"""The publisher's node logic (presence, removal, restart, the slice watch) on the in-memory API.

The bus wiring is exercised against a real nats-server in
tests/integration/publisher/test_publisher.py; here the service is driven through the
same methods the bus handlers call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import msgspec
import pytest

from services.core.bus.client import KvUpdate
from services.core.kube.informer import WATCH_RESTARTS
from services.core.model import featuregates
from services.core.model.schemas import PluginPresence
from services.publisher import metrics
from services.publisher.memoryapi import MemorySliceApi
from services.publisher.reconcile import Reconciler, RetryPolicy
from services.publisher.render import RenderOptions, render_contents
from services.publisher.service import Publisher, PublisherConfig
from tests.helpers.inventories import h100, node

FAST = RetryPolicy(attempts=3, initial_s=0.001, max_s=0.01)


def _publisher(api: MemorySliceApi, *, force: bool = False, gates: str = "") -> Publisher:
    config = PublisherConfig(
        render=RenderOptions(gates=featuregates.parse(gates)),
        kube_minor=35,
        force_registered=force,
        retry_failed_s=0.05,
    )
    return Publisher(api, config, Reconciler(api, FAST))


@contextlib.asynccontextmanager
async def _running(publisher: Publisher, *, watch: bool = True) -> AsyncIterator[Publisher]:
    rv = await publisher.relist()
    tasks = [asyncio.create_task(publisher.work()) for _ in range(2)]
    if watch:
        tasks.append(asyncio.create_task(publisher.watch_slices(rv)))
    try:
        await publisher.settle()
        yield publisher
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _nodes(api: MemorySliceApi) -> set[str]:
    return {s.spec.node_name or "" for s in api.stored()}


async def test_a_node_is_published_only_while_its_plugin_is_registered() -> None:
    api = MemorySliceApi()
    async with _running(_publisher(api)) as pub:
        pub.set_inventory("n1", node("n1"))
        await pub.settle()
        assert api.writes == []  # no presence record yet
        pub.inputs.apply_presence(KvUpdate("n1.gpu=2Envidia=2Ecom", _presence("n1"), 1))
        await pub.settle()
        assert _nodes(api) == {"n1"}
        pub.inputs.apply_presence(KvUpdate("n1.other=2Edriver", _presence("n1"), 2))  # not ours
        pub.inputs.apply_presence(KvUpdate("n1.gpu=2Envidia=2Ecom", None, 3))
        await pub.settle()
        assert api.stored() == []


async def test_a_re_registered_plugin_gets_its_wiped_slices_back() -> None:
    api = MemorySliceApi()
    key = "n1.gpu=2Envidia=2Ecom"
    async with _running(_publisher(api), watch=False) as pub:
        pub.set_inventory("n1", node("n1"))
        pub.inputs.apply_presence(KvUpdate(key, _presence("n1", at=100.0), 1))
        await pub.settle()
        await api.remove("n1-gpu.nvidia.com-0")  # the restarted kubelet wipes the node's slices
        same = KvUpdate(key, _presence("n1", at=100.0), 2)
        pub.inputs.apply_presence(same)  # the same record: no news
        await pub.settle()
        assert api.stored() == []
        pub.inputs.apply_presence(KvUpdate(key, _presence("n1", at=200.0), 3))  # registered again
        await pub.settle()
        assert _nodes(api) == {"n1"}


async def test_identical_inventories_cause_no_api_calls_at_all() -> None:
    api = MemorySliceApi()
    async with _running(_publisher(api, force=True), watch=False) as pub:
        pub.set_inventory("n1", node("n1"))
        await pub.settle()
        calls = dict(api.calls)
        pub.set_inventory("n1", node("n1"))
        pub.set_inventory("n1", msgspec.convert(msgspec.to_builtins(node("n1")), type=type(node())))
        await pub.settle()
        assert api.calls == calls


async def test_a_restarted_publisher_writes_nothing() -> None:
    api = MemorySliceApi()
    async with _running(_publisher(api, force=True, gates="DynamicMIG=true")) as pub:
        for n in ("n1", "n2"):
            pub.set_inventory(n, node(n))
        await pub.settle()
    writes = len(api.writes)
    assert writes == 18
    again = _publisher(api, force=True, gates="DynamicMIG=true")
    for n in ("n1", "n2"):
        again.set_inventory(n, node(n))
    async with _running(again):
        await again.settle()
    assert len(api.writes) == writes


async def test_slices_of_nodes_that_are_gone_are_removed() -> None:
    api = MemorySliceApi()
    async with _running(_publisher(api, force=True)) as pub:
        pub.set_inventory("n1", node("n1"))
        pub.set_inventory("n2", node("n2"))
        await pub.settle()
        pub.set_inventory("n2", None)
        await pub.settle()
        assert _nodes(api) == {"n1"}
    # A new process that only knows n1 cleans up what an old one left for n3.
    stale = _publisher(api, force=True)
    await stale.reconciler.sync("n3", render_contents(node("n3"), RenderOptions()))
    assert _nodes(api) == {"n1", "n3"}
    fresh = _publisher(api, force=True)
    fresh.set_inventory("n1", node("n1"))
    async with _running(fresh):
        assert _nodes(api) == {"n1"}


async def test_slices_someone_else_deletes_or_edits_are_put_back() -> None:
    api = MemorySliceApi()
    async with _running(_publisher(api, force=True, gates="DynamicMIG=true")) as pub:
        pub.set_inventory("n1", node("n1"))
        await pub.settle()
        before = len(api.writes)
        await api.remove("n1-gpu.nvidia.com-2")
        await _until(lambda: "n1-gpu.nvidia.com-2" in {s.metadata.name for s in api.stored()})
        await pub.settle()
        ops = sorted(w.op for w in api.writes[before:])
        assert ops == ["create"] + ["update"] * 8  # a new slice: all move to the next generation
        assert {s.spec.pool.generation for s in api.stored()} == {2}
        # An annotation is not a difference; nothing more is written.
        settled = len(api.writes)
        await api.mutate("n1-gpu.nvidia.com-0")
        await asyncio.sleep(0.05)
        await pub.settle()
        assert len(api.writes) == settled


async def test_an_expired_watch_relists_and_keeps_following() -> None:
    api = MemorySliceApi(history_size=4)
    async with _running(_publisher(api, force=True)) as pub:
        pub.set_inventory("n1", node("n1"))
        await pub.settle()
        expired = WATCH_RESTARTS.labels(resource="resourceslices", reason="expired")
        gone = expired._value.get()
        api.expire_history()
        for i in range(6):  # the watcher falls behind a short history
            await api.mutate("n1-gpu.nvidia.com-0", change=str(i))
        await api.remove("n1-gpu.nvidia.com-0")
        await _until(lambda: bool(api.stored()))
        await pub.settle()
        assert _nodes(api) == {"n1"}
        assert expired._value.get() > gone


async def test_an_unpublishable_inventory_is_counted_and_old_slices_stay() -> None:
    api = MemorySliceApi()
    async with _running(_publisher(api, force=True), watch=False) as pub:
        pub.set_inventory("n1", node("n1"))
        await pub.settle()
        stored = api.stored()
        before = metrics.INVALID_INVENTORIES.labels(reason="render")._value.get()
        pub.set_inventory("n1", node("n1", [h100(0, cuda_compute_capability="nine")]))
        await pub.settle()
        assert metrics.INVALID_INVENTORIES.labels(reason="render")._value.get() == before + 1
        assert api.stored() == stored


async def test_an_inventory_under_another_nodes_key_is_skipped() -> None:
    api = MemorySliceApi()
    pub = _publisher(api, force=True)
    before = metrics.INVALID_INVENTORIES.labels(reason="node-mismatch")._value.get()
    pub.inputs.apply_inventory(KvUpdate("n2", node("n1"), 1))
    assert pub.nodes == set()
    assert metrics.INVALID_INVENTORIES.labels(reason="node-mismatch")._value.get() == before + 1


async def test_a_missing_node_object_is_retried_until_it_appears() -> None:
    api = MemorySliceApi(missing_nodes={"n1"})
    async with _running(_publisher(api, force=True), watch=False) as pub:
        pub.set_inventory("n1", node("n1"))
        await pub.settle()
        assert api.stored() == []
        api.missing_nodes.clear()
        await _until(lambda: bool(api.stored()))
        assert _nodes(api) == {"n1"}


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail("condition not reached")
        await asyncio.sleep(0.01)


def _presence(n: str, at: float = 1.0) -> PluginPresence:
    endpoint = "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"
    return PluginPresence(node=n, driver="gpu.nvidia.com", endpoint=endpoint, registered_at=at)
