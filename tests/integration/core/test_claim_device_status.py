"""status.devices of GPU claims, written by the node's preparer into a real kube-apiserver.

The preparer runs as the chart makes it: its own ServiceAccount with exactly the
chart's rules (rbac.rules.preparer and rbac.claimDeviceStatusRules) and a token
bound to a pod on its node, as the node DaemonSet's projected token is. A claim
allocated to the node (a time-sliced GPU and a MIG device the prepare creates, beside
another driver's device) is prepared through the bus as the kubelet plugin asks; its
status then names each device Ready with its UUIDs, PCI address and sharing, and the
other driver's entry is kept; the unprepare removes ours. The same token cannot write
a claim allocated to another node (the insider: a compromised node). Skipped where
the control plane cannot be built.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.bus.client import Bus
from services.core.kube import claimstatus
from services.core.kube.client import ApiError, KubeApi, http_api
from services.core.kube.resourceapi import versioned
from services.core.model import nvidia
from services.core.model.schemas import ClaimRef
from services.local.cluster import ControlPlane
from services.local.natsserver import NatsServer
from tests.helpers.chartrbac import Account, chart_rules
from tests.helpers.preparer import API, Node

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NODE, OTHER = "n1", "n2"  # the preparer's node (tests.helpers.preparer.Node) and another
DRIVER_NS = "gpudra"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
GATES = "TimeSlicingSettings=true,DynamicMIG=true"
MIG = nvidia.mig_device_name(1, "1g.10gb", 19, 0)  # made by the prepare (DynamicMIG)
NIC = "nic.example.com"


@pytest.fixture(scope="module")
def cluster(controlplane_binary: Path) -> Iterator[tuple[ControlPlane, Account]]:
    with ControlPlane(controlplane_binary, nodes=[NODE, OTHER]) as cp:
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NS}})
        rules = chart_rules("preparer", "claimDeviceStatusRules")
        account = Account.make(cp, "gpudra-preparer", rules, namespace=DRIVER_NS)
        for node in (NODE, OTHER):  # each node's gpudra pod, which its token is bound to
            spec = {"nodeName": node, "serviceAccountName": account.name,
                    "containers": [{"name": "preparer", "image": "gpudra"}]}  # fmt: skip
            meta = {"name": f"gpudra-node-{node}", "namespace": DRIVER_NS}
            cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
        account.can("list", "pods")
        yield cp, account


class Cluster:
    def __init__(self, cp: ControlPlane, admin: KubeApi) -> None:
        self.cp, self.admin = cp, admin

    async def claim(self, name: str, node: str, devices: list[tuple[str, str]]) -> dict[str, Any]:
        """A claim allocated on ``node`` (driver, device per result) and reserved for a pod
        bound there, as the scheduler leaves it; returns the claim."""
        requests = [{"name": f"r{i}", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                    for i in range(len(devices))]  # fmt: skip
        gpu_config = {"apiVersion": API, "kind": "GpuConfig",
                      "sharing": {"strategy": "TimeSlicing",
                                  "timeSlicingConfig": {"interval": "Long"}}}  # fmt: skip
        config = [{"requests": ["r0"],
                   "opaque": {"driver": nvidia.DRIVER_NAME, "parameters": gpu_config}}]  # fmt: skip
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {"requests": requests, "config": config}}}  # fmt: skip
        claim = json.loads(await self.admin.create(CLAIMS, body))
        pod = json.loads(await self.admin.create("/api/v1/namespaces/default/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-pod"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}],
                     "resourceClaims": [{"name": "c", "resourceClaimName": name}]}}))  # fmt: skip
        results = [{"request": f"r{i}", "driver": driver, "pool": node, "device": device}
                   for i, (driver, device) in enumerate(devices)]  # fmt: skip
        claim["status"] = {
            "allocation": {
                "devices": {"results": results,
                            "config": [{"source": "FromClaim", **c} for c in config]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"],
                             "uid": pod["metadata"]["uid"]}],
        }  # fmt: skip
        return dict(json.loads(await self.admin.replace(f"{CLAIMS}/{name}/status", claim)))

    async def entries(self, name: str, driver: str) -> dict[str, dict[str, Any]]:
        got = json.loads(await self.admin.get(f"{CLAIMS}/{name}"))
        devices = (got.get("status") or {}).get("devices") or []
        return {e["device"]: e for e in devices if e["driver"] == driver}


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    async def loop() -> Any:
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(loop(), timeout)


@pytest.fixture
async def setup(
    cluster: tuple[ControlPlane, Account], short_root: Path, nats_server: NatsServer, bus: Bus
) -> AsyncIterator[tuple[Node, Cluster, Path]]:
    cp, account = cluster
    kubeconfig = account.kubeconfig(short_root / "preparer.kubeconfig", pod=f"gpudra-node-{NODE}")
    node = Node(short_root, nats_server, bus, name=NODE, fleet="dgx-h100")
    admin = versioned(await http_api(str(cp.kubeconfig)))
    try:
        await node.start_discovery()
        await node.start_preparer(
            gates=GATES, claims="none", extra=["--kubeconfig", str(kubeconfig)]
        )
        yield node, Cluster(cp, admin), kubeconfig
    finally:
        await node.close()
        await admin.close()


def _ref(claim: dict[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


async def test_a_prepared_claim_says_which_gpu_and_mig_device_it_got(
    setup: tuple[Node, Cluster, Path],
) -> None:
    node, cluster, _ = setup
    devices = [(nvidia.DRIVER_NAME, "gpu-0"), (nvidia.DRIVER_NAME, MIG), (NIC, "eth-0")]
    claim = await cluster.claim("train", NODE, devices)
    up = claimstatus.condition("Ready", True, "Up", "", claimstatus.now())
    nic = claimstatus.entry(NIC, NODE, "eth-0", [up], data={"ip": "10.9.8.7"})
    claim = json.loads(await claimstatus.write(
        cluster.admin, "default", "train", uid=claim["metadata"]["uid"],
        resource_version=claim["metadata"]["resourceVersion"], devices=[nic]))  # fmt: skip
    reply = await node.request("prepare", [_ref(claim)])
    assert reply.claims[claim["metadata"]["uid"]].error == ""

    inventory = await node.inventory()
    assert inventory is not None
    gpu0, gpu1 = inventory.gpus[0], inventory.gpus[1]
    made = [m for m in gpu1.mig_devices if m.profile == "1g.10gb"]
    assert len(made) == 1  # the prepare made it: no slice could have named its UUID

    async def ours() -> dict[str, dict[str, Any]] | None:
        got = await cluster.entries("train", nvidia.DRIVER_NAME)
        return got if len(got) == 2 else None

    entries = await until(ours)
    for entry in entries.values():
        (ready,) = entry["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert entries["gpu-0"]["data"] | {"cdiDeviceIDs": None} == {
        "uuid": gpu0.uuid, "pciBusID": gpu0.pci_bus_id, "sharing": "TimeSlicing",
        "cdiDeviceIDs": None}  # fmt: skip
    assert entries["gpu-0"]["data"]["cdiDeviceIDs"] == [
        f"k8s.gpu.nvidia.com/claim={claim['metadata']['uid']}-gpu-0"
    ]
    mig = entries[MIG]["data"]
    assert (mig["uuid"], mig["parentUUID"], mig["migProfile"]) == (made[0].uuid, gpu1.uuid,
                                                                   "1g.10gb")  # fmt: skip
    assert await cluster.entries("train", NIC) == {"eth-0": nic}  # another driver's: kept

    reply = await node.request("unprepare", [_ref(claim)])
    assert reply.claims[claim["metadata"]["uid"]].error == ""

    async def removed() -> bool:
        return not await cluster.entries("train", nvidia.DRIVER_NAME)

    await until(removed)
    assert await cluster.entries("train", NIC) == {"eth-0": nic}


async def test_a_nodes_token_cannot_write_another_nodes_claims(
    setup: tuple[Node, Cluster, Path],
) -> None:
    """The insider: a compromised node writes the status of a claim on another node."""
    _, cluster, kubeconfig = setup
    theirs = await cluster.claim("elsewhere", OTHER, [(nvidia.DRIVER_NAME, "gpu-3")])
    mine = await cluster.claim("here", NODE, [(nvidia.DRIVER_NAME, "gpu-3")])
    node_api = versioned(await http_api(str(kubeconfig)))
    try:
        for claim, allowed in ((theirs, False), (mine, True)):
            meta = claim["metadata"]
            node = claim["status"]["allocation"]["devices"]["results"][0]["pool"]
            forged = claimstatus.entry(
                nvidia.DRIVER_NAME, node, "gpu-3", [], data={"uuid": "GPU-x"}
            )
            write = claimstatus.write(node_api, "default", meta["name"], uid=meta["uid"],
                                      resource_version=meta["resourceVersion"],
                                      devices=[forged])  # fmt: skip
            if allowed:
                await write
                continue
            with pytest.raises(ApiError) as refused:
                await write
            assert refused.value.status == 422, refused.value
            assert 'resource="resourceclaims/driver"' in refused.value.message
            assert "arbitrary-node:patch" in refused.value.message
        assert await cluster.entries("elsewhere", nvidia.DRIVER_NAME) == {}
        assert set(await cluster.entries("here", nvidia.DRIVER_NAME)) == {"gpu-3"}
    finally:
        await node_api.close()
