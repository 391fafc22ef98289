"""The publisher process against a real nats-server and a recording fake of the Kubernetes API.

The fake speaks the HTTP of the few endpoints the publisher uses (/version,
Nodes, resource.k8s.io/v1 ResourceSlices with field selectors, paging, watch,
delete preconditions) on 127.0.0.1 and keeps state in
:class:`MemorySliceApi`, so every write is recorded. It stands in until the real
kube-apiserver fixture of tests/e2e is available to this tier.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kube.client import ApiError, http_api
from services.core.model.schemas import PluginPresence
from services.local.natsserver import NatsServer
from services.publisher.kubeapi import KubeSliceApi
from services.publisher.memoryapi import MemorySliceApi
from tests.helpers.inventories import h100, node
from tests.helpers.publisher import (
    FakeKube,
    nodes_of,
    publisher,
    put_inventory,
    until,
)

pytestmark = pytest.mark.integration

#: Syncs done, whatever their outcome (the sync-time histogram counts each).
SYNCS = "gpudra_publisher_sync_seconds_count"


# --------------------------------------------------------------------------- fake API server


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    fake = FakeKube(MemorySliceApi(history_size=1000))
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


# --------------------------------------------------------------------------- the process


# --------------------------------------------------------------------------- tests


async def test_inventory_in_kv_becomes_slices_once_the_plugin_is_registered(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    with publisher(nats_server, kube, tmp_path) as proc:
        await put_inventory(bus, node("gpu-node-1"))
        # The node synced (the histogram counts every sync) with no presence record:
        # nothing published.
        await until(lambda: proc.metric(SYNCS) >= 1, "gpu-node-1 synced", proc)
        assert kube.api.writes == []
        presence = PluginPresence(node="gpu-node-1", driver="gpu.nvidia.com", endpoint="/x")
        key = subjects.presence_key("gpu-node-1", "gpu.nvidia.com")
        await bus.kv_put(subjects.PRESENCE_BUCKET, key, presence)
        await until(lambda: nodes_of(kube) == {"gpu-node-1": 8}, "slices of gpu-node-1", proc)
        (s,) = kube.api.stored()
        assert [d.name for d in s.spec.devices or []] == [f"gpu-{i}" for i in range(8)]
        assert (s.metadata.owner_references or [])[0].uid == kube.api.nodes["gpu-node-1"]
        await bus.kv_delete(subjects.PRESENCE_BUCKET, key)
        await until(lambda: not kube.api.stored(), "slices removed with the plugin", proc)


async def test_malformed_inventory_is_counted_and_skipped_and_the_service_keeps_going(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    with publisher(nats_server, kube, tmp_path, "--force-registered") as proc:
        kv = await bus.kv(subjects.INVENTORY_BUCKET)
        await kv.put("broken", b"\xc1 this is not msgpack")
        await until(
            lambda: (
                proc.metric("gpudra_bus_malformed_messages_total", '{source="kv:inventory"}') >= 1
            ),
            "the malformed inventory to be counted",
            proc,
        )
        unpublishable = node("n-bad", [h100(0, cuda_compute_capability="nine")])
        await put_inventory(bus, unpublishable)
        await until(
            lambda: (
                proc.metric("gpudra_publisher_invalid_inventories_total", '{reason="render"}') == 1
            ),
            "the unpublishable inventory to be counted",
            proc,
        )
        await put_inventory(bus, node("n2"))
        await until(lambda: nodes_of(kube) == {"n2": 8}, "slices of n2", proc)
        log = proc.log.read_text()
        assert "skipping malformed message" in log and "cuda_compute_capability: 'nine'" in log
        assert proc.alive()


async def test_restart_writes_nothing_and_removal_deletes(
    nats_server: NatsServer, bus: Bus, kube: FakeKube, tmp_path: Path
) -> None:
    gates = ("--force-registered", "--feature-gates", "DynamicMIG=true")
    await put_inventory(bus, node("n1"))
    await put_inventory(bus, node("n2"))
    with publisher(nats_server, kube, tmp_path, *gates) as proc:
        await until(lambda: len(kube.api.stored()) == 18, "18 slices", proc)
        await until(lambda: proc.metric("gpudra_publisher_published_nodes") == 2, "2 nodes", proc)
        assert {s.spec.pool.generation for s in kube.api.stored()} == {1}
    writes = len(kube.api.writes)
    with publisher(nats_server, kube, tmp_path, *gates) as proc:
        await until(lambda: proc.metric("gpudra_publisher_published_nodes") == 2, "restart", proc)
        assert len(kube.api.writes) == writes  # both nodes synced: a restart writes nothing
        await kube.api.remove("n1-gpu.nvidia.com-3")  # the kubelet or an admin deletes one
        await until(lambda: len(kube.api.stored()) == 18, "the deleted slice back", proc)
        await bus.kv_delete(subjects.INVENTORY_BUCKET, subjects.inventory_key("n2"))
        await until(lambda: nodes_of(kube) == {"n1": 26 * 8}, "n2's slices deleted", proc)


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
