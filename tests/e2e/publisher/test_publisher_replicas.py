"""Three publisher replicas share the nodes through shard leases on the bus; one is killed.

Real ``gpudra publisher`` processes (``--replica-id``), a real nats-server with
the production permissions and a real kube-apiserver. Every write names its
replica (``fieldManager=gpudra-publisher-<id>``), so the API server's
managedFields say who wrote each slice. Checked: every node is published, each
by exactly one replica; every shard lease has one holder; after one replica is
SIGKILLed, a change to every node reaches the API server for all of them,
written by the survivors only. How long the hand-over took is printed (the
design bound is the lease TTL plus a renewal period, about 7.5 s), not asserted.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import GpuHealth, NodeInventory, Xid
from services.local.cluster import ControlPlane
from services.local.natsserver import NatsServer
from services.offline.slices import fleet_inventory
from tests.helpers.publisher import PublisherProcess

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NODES = [f"rep-node-{i}" for i in range(18)]
REPLICAS = ("r0", "r1", "r2")
MANAGER = "gpudra-publisher-"


@pytest.fixture(scope="module")
def apiserver(controlplane_binary: Path) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_binary, nodes=NODES) as cp:
        yield cp


def slices(cp: ControlPlane) -> dict[str, list[dict[str, Any]]]:
    """node -> its slices as the API server stores them (kubectl, JSON)."""
    items = json.loads(
        cp.kubectl("get", "resourceslices", "-o", "json", "--show-managed-fields", timeout=60)
    )["items"]
    by_node: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        by_node.setdefault(item["spec"].get("nodeName", ""), []).append(item)
    return by_node


def last_writer(item: dict[str, Any]) -> str:
    """The replica whose write is the slice's latest (managedFields times, then order)."""
    entries = [
        m for m in item["metadata"].get("managedFields", []) if m["manager"].startswith(MANAGER)
    ]
    latest = max(entries, key=lambda m: m.get("time", ""))
    return str(latest["manager"]).removeprefix(MANAGER)


def writers(cp: ControlPlane) -> dict[str, set[str]]:
    return {node: {last_writer(s) for s in items} for node, items in slices(cp).items()}


def sick(inv: NodeInventory) -> NodeInventory:
    gpus = list(inv.gpus)
    gpus[1] = msgspec.structs.replace(gpus[1], health=GpuHealth(xids=[Xid(13, 1.0)], lost=True))
    return msgspec.structs.replace(inv, gpus=gpus)


async def wait_for(condition: Any, what: str, procs: list[PublisherProcess]) -> None:
    deadline = time.monotonic() + 60
    while not await asyncio.to_thread(condition):
        for p in procs:
            if p.proc.returncode is None and not p.alive():
                pytest.fail(f"a publisher exited:\n{p.log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.5)


async def lease_holders(bus: Bus) -> dict[str, str]:
    kv = await bus.kv(subjects.PUBLISHERS_BUCKET)
    held = {}
    for key in await bus.kv_keys(subjects.PUBLISHERS_BUCKET):
        if key.startswith("shard."):
            entry = await kv.get(key)
            held[key] = (entry.value or b"").decode()
    return held


async def test_replicas_share_nodes_and_a_dead_ones_are_taken_over(
    apiserver: ControlPlane, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    procs = [
        PublisherProcess(nats_server, apiserver.kubeconfig, tmp_path / f"{r}.log",
                         "--replica-id", r, "--force-registered", "--shards", "12")
        for r in REPLICAS
    ]  # fmt: skip
    try:
        balanced = {r: 4 for r in REPLICAS}  # 12 shards over 3 replicas

        async def leases_balanced() -> bool:
            held = list((await lease_holders(bus)).values())
            return {r: held.count(r) for r in REPLICAS} == balanced

        deadline = time.monotonic() + 60
        while not await leases_balanced():
            assert time.monotonic() < deadline, await lease_holders(bus)
            await asyncio.sleep(0.2)
        inventories = {n: fleet_inventory("dgx-h100", n) for n in NODES}
        for node, inv in inventories.items():
            await bus.kv_put(subjects.INVENTORY_BUCKET, subjects.inventory_key(node), inv)

        def all_published_once() -> bool:
            found = writers(apiserver)
            return set(found) >= set(NODES) and all(len(w) == 1 for w in found.values())

        await wait_for(all_published_once, "every node published by one replica", procs)
        before = writers(apiserver)
        owner = {node: next(iter(w)) for node, w in before.items()}
        counts = {r: sum(1 for o in owner.values() if o == r) for r in REPLICAS}
        print(f"nodes per replica: {counts}")
        assert sum(counts.values()) == len(NODES) and all(counts.values()), counts
        holders = await lease_holders(bus)
        assert len(holders) == 12 and set(holders.values()) <= set(REPLICAS), holders

        versions = {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
                    for items in slices(apiserver).values() for s in items}  # fmt: skip
        victim = max(counts, key=lambda r: counts[r])
        orphans = sorted(n for n, o in owner.items() if o == victim)
        procs[REPLICAS.index(victim)].proc.send_signal(signal.SIGKILL)
        procs[REPLICAS.index(victim)].proc.wait()
        killed = time.monotonic()
        for node, inv in inventories.items():  # a change every node must get
            await bus.kv_put(subjects.INVENTORY_BUCKET, subjects.inventory_key(node), sick(inv))
        survivors = set(REPLICAS) - {victim}

        def rewritten(item: dict[str, Any]) -> bool:
            return bool(
                versions.get(item["metadata"]["name"]) != item["metadata"]["resourceVersion"]
            )

        def everything_rewritten() -> bool:
            stored = slices(apiserver)
            return all(any(rewritten(s) for s in stored.get(n, [])) for n in NODES)

        await wait_for(everything_rewritten, "the survivors to take over and write", procs)
        print(f"hand-over of {len(orphans)} nodes after SIGKILL: {time.monotonic() - killed:.1f} s")
        after = slices(apiserver)
        for node in NODES:
            changed = [s for s in after[node] if rewritten(s)]
            assert len({last_writer(s) for s in changed}) == 1, node  # one replica per node
            assert {last_writer(s) for s in changed} <= survivors, node

        # A shard with none of NODES may still be free: each survivor takes its share
        # of the dead one's shards in its own rounds, in random order.
        async def survivors_hold_every_shard() -> bool:
            holders = await lease_holders(bus)
            return set(holders.values()) <= survivors and len(holders) == 12

        deadline = time.monotonic() + 60
        while not await survivors_hold_every_shard():
            assert time.monotonic() < deadline, await lease_holders(bus)
            await asyncio.sleep(0.2)
    finally:
        for p in procs:
            p.stop()
