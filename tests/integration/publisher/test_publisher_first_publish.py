"""A first publish is one write per slice: the publisher process, a real nats-server
and the fake API server of tests/helpers/publisher.py, counting every call.

The full listing at start says which nodes have no slices of ours and every Node's
UID; listing each node's slices and reading each Node again doubled or tripled the
API server's work per node (bench/scale.py: 0.60x a plain client's ingest).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services.core.bus.client import Bus
from services.local.natsserver import NatsServer
from services.publisher.memoryapi import MemorySliceApi
from tests.helpers.inventories import node
from tests.helpers.publisher import FakeKube, nodes_of, publisher, put_inventory, until

pytestmark = pytest.mark.integration

NODES = [f"n{i}" for i in range(5)]


async def test_a_first_publish_makes_one_create_per_slice_and_no_other_call(
    nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    api = MemorySliceApi(minor=37, history_size=1000, auto_nodes=False)
    api.nodes = {name: str(uuid.uuid4()) for name in NODES}
    kube = FakeKube(api)
    await kube.start()
    try:
        for name in NODES:
            await put_inventory(bus, node(name))
        with publisher(nats_server, kube, tmp_path, "--force-registered") as proc:
            await until(lambda: set(nodes_of(kube)) == set(NODES), "every node's slices", proc)
            await until(lambda: proc.metric("gpudra_publisher_published_nodes") == 5, "all", proc)
            slices = len(api.stored())
            assert api.calls.get("create") == slices
            assert api.calls.get("list_nodes") == 1
            assert "node_uid" not in api.calls  # every owner from the one list
            assert api.calls.get("list") == 1  # the full listing; no node listed again
            for stored in api.stored():
                refs = stored.metadata.owner_references
                assert refs and refs[0].uid == api.nodes[stored.spec.node_name or ""]
    finally:
        await kube.stop()


async def test_a_node_without_a_listed_uid_is_read_and_published(
    nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    """A Node the list did not show (created since): read with a GET, as before."""
    api = MemorySliceApi(minor=37, history_size=1000)  # every name exists, none listed
    kube = FakeKube(api)
    await kube.start()
    try:
        await put_inventory(bus, node("late"))
        with publisher(nats_server, kube, tmp_path, "--force-registered") as proc:
            await until(lambda: "late" in nodes_of(kube), "late's slices", proc)
            assert api.calls.get("node_uid") == 1
    finally:
        await kube.stop()
