"""The publisher's API client and reconciler against a real kube-apiserver (v1.37).

Uses the control plane that tests/e2e builds (etcd + kube-apiserver from the Go
module proxy); skipped when it cannot be built here. The API server runs with
DRAPartitionableDevices, DRADeviceTaints (both on by default from 1.36) and
DRAListTypeAttributes (alpha) so it stores counters, taints and list attributes.
What this shows that the fake cannot: the server's own validation accepts every
rendered layout, its canonical quantities and ``timeAdded`` stamps compare equal
to what we render (a restart writes nothing), field selectors and the watch
behave as we assume, and the Node owner reference carries the real UID.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from services.core.kube.client import http_api
from services.core.model import featuregates
from services.core.model.schemas import GpuHealth, NodeInventory, Xid
from services.discovery.fleet import fleet_names
from services.local.cluster import ControlPlane
from services.offline import slicecheck
from services.offline.slices import fleet_inventory
from services.publisher.kubeapi import KubeSliceApi
from services.publisher.reconcile import Reconciler, SyncFailed
from services.publisher.render import RenderOptions, render_contents
from services.publisher.service import Publisher, PublisherConfig

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NODE = "pub-node-1"


@pytest.fixture(scope="module")
def apiserver(controlplane_binary: Path) -> Iterator[ControlPlane]:
    gates = {
        "DRAPartitionableDevices": True,
        "DRADeviceTaints": True,
        "DRAListTypeAttributes": True,
    }
    with ControlPlane(controlplane_binary, nodes=[NODE], feature_gates=gates) as cp:
        yield cp


def _sick(inv: NodeInventory) -> NodeInventory:
    import msgspec

    gpus = list(inv.gpus)
    health = GpuHealth(xids=[Xid(13, 1.0)], lost=True)
    gpus[1] = msgspec.structs.replace(gpus[1], health=health)
    return msgspec.structs.replace(inv, gpus=gpus)


def _every_layout(minor: int) -> list[tuple[str, str, int]]:
    """Every fleet profile x every valid combination of the driver's gates, one
    entry per distinct rendering (most gates do not change the slices); the gates of
    the compute-domain driver and those gpudra refuses on are left at their defaults."""
    fixed = featuregates.DOMAIN_GATES | set(featuregates.UNSUPPORTED)
    names = sorted(set(featuregates.DEFAULTS) - fixed)
    combos = []
    for bits in itertools.product((False, True), repeat=len(names)):
        spec = ",".join(f"{n}={b}" for n, b in zip(names, bits, strict=True))
        try:
            combos.append(featuregates.parse(spec))
        except featuregates.FeatureGateError:
            continue  # a mix the reference refuses at start-up
    layouts = []
    for fleet in fleet_names():
        inv = _sick(fleet_inventory(fleet, NODE))
        seen: set[bytes] = set()
        for gates in combos:
            rendered = msgspec.json.encode(render_contents(inv, RenderOptions(gates, minor)))
            if rendered not in seen:
                seen.add(rendered)
                layouts.append((fleet, gates.spec(), minor))
    return layouts


async def test_every_layout_is_accepted_and_a_restart_writes_nothing(
    apiserver: ControlPlane,
) -> None:
    """Also: the 1.34 combined layout is refused from 1.35 on, as slicecheck predicts."""
    api = KubeSliceApi(await http_api(str(apiserver.kubeconfig)))
    try:
        assert await api.server_minor() == apiserver.kube_minor
        node_uid = await api.node_uid(NODE)
        assert node_uid
        for fleet, gates, minor in _every_layout(apiserver.kube_minor):
            inv = _sick(fleet_inventory(fleet, NODE))
            contents = render_contents(inv, RenderOptions(featuregates.parse(gates), minor))
            first = await Reconciler(api).sync(NODE, contents)
            assert first.writes, (fleet, gates)
            restarted = await Reconciler(api).sync(NODE, contents)
            assert restarted.writes == 0, (fleet, gates, minor)
            stored = (await api.list_slices(NODE)).items
            assert len(stored) == len(contents)
            assert not slicecheck.check_pool(stored, kube_minor=minor)
            for s in stored:
                assert [o.uid for o in s.metadata.owner_references or []] == [node_uid]
            if "NVMLDeviceHealthCheck" in gates:
                taints = [t for s in stored for d in s.spec.devices or [] for t in d.taints or []]
                assert taints and all(t.time_added for t in taints)  # stamped by the server
        assert (await Reconciler(api).sync(NODE, None)).deleted == len(contents)
        combined = render_contents(
            fleet_inventory("dgx-h100", NODE),
            RenderOptions(featuregates.parse("DynamicMIG=true"), 34),
        )
        with pytest.raises(SyncFailed, match="only one of `sharedCounters` or `devices`"):
            await Reconciler(api).sync(NODE, combined)
        await Reconciler(api).sync(NODE, None)
    finally:
        await api.close()


async def test_the_service_puts_back_a_slice_deleted_behind_its_back(
    apiserver: ControlPlane,
) -> None:
    api = KubeSliceApi(await http_api(str(apiserver.kubeconfig)))
    config = PublisherConfig(
        render=RenderOptions(featuregates.parse("DynamicMIG=true")),
        kube_minor=apiserver.kube_minor,
        force_registered=True,
    )  # fmt: skip
    publisher = Publisher(api, config)
    rv = await publisher.relist()
    tasks = [asyncio.create_task(publisher.work()), asyncio.create_task(publisher.watch_slices(rv))]
    try:
        publisher.set_inventory(NODE, fleet_inventory("dgx-h100", NODE))
        await publisher.settle()
        names = sorted(s.metadata.name for s in (await api.list_slices(NODE)).items)
        assert len(names) == 9
        apiserver.kubectl("delete", "resourceslice", names[3])
        deadline = time.monotonic() + 20
        while len((await api.list_slices(NODE)).items) < 9:
            assert time.monotonic() < deadline, "the deleted slice did not come back"
            await asyncio.sleep(0.1)
        await publisher.settle()
        generations = {s.spec.pool.generation for s in (await api.list_slices(NODE)).items}
        assert generations == {2}  # re-created slice: the whole pool moved on together
        publisher.set_inventory(NODE, None)
        await publisher.settle()
        assert (await api.list_slices(NODE)).items == []
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await api.close()
