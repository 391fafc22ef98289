"""Binding conditions of channel claims, set by ``gpudra domains`` in a real kube-apiserver.

The controller runs in-process as the chart makes it: its own ServiceAccount with
exactly the chart's rules (rbac.rules.domains and rbac.computeDomainBindingRules)
and its own bus identity. The test does what the scheduler does to a claim (its
allocation, with the channel device's binding conditions and the node) and what
the daemons do on the bus (member keys, as the admin identity); everything is
read back from the API server. Skipped where the control plane cannot be built.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.kube import claimstatus
from services.core.kube.client import ApiError, KubeApi, http_api
from services.core.kube.resourceapi import versioned
from services.core.model import computedomain as cd
from services.core.model.schemas import DomainMember, DomainNodeState
from services.domains.objects import DaemonSettings
from services.domains.service import Controller, ControllerConfig
from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from services.local.natsserver import NatsServer
from services.local.stack import COMPUTE_DOMAIN_CRD
from tests.helpers.bus import connect
from tests.helpers.chartrbac import Account, chart_rules

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NODES = [f"bind-node-{i}" for i in range(3)]
DRIVER_NS = "gpudra"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
CLIQUE = "7d1c3e0a-0000-4000-8000-000000000002.1"


@pytest.fixture(scope="module")
def apiserver(
    controlplane_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ControlPlane, Path]]:
    with ControlPlane(controlplane_binary, nodes=NODES) as cp:
        install_crd(cp, COMPUTE_DOMAIN_CRD.read_text())
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NS}})
        rules = chart_rules("domains", "computeDomainBindingRules")
        account = Account.make(cp, "gpudra-domains", rules, namespace=DRIVER_NS)
        account.can("list", "resourceclaims.resource.k8s.io")
        yield cp, account.kubeconfig(tmp_path_factory.mktemp("domains") / "kubeconfig")


class Env:
    def __init__(self, cp: ControlPlane, admin_api: KubeApi, ctl_api: KubeApi, bus: Bus) -> None:
        self.cp, self.admin_api, self.ctl_api, self.admin = cp, admin_api, ctl_api, bus
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, ctl_bus: Bus) -> Controller:
        config = ControllerConfig(daemon=DaemonSettings(namespace=DRIVER_NS))
        controller = Controller(self.ctl_api, ctl_bus, config)
        self.tasks.append(asyncio.create_task(controller.run()))
        return controller

    async def domain(self, name: str) -> str:
        body = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate":
                                                    {"name": f"{name}-channel"}}}}  # fmt: skip
        made = json.loads(await self.admin_api.create(cd.domains_path("default"), body))
        return str(made["metadata"]["uid"])

    async def allocate(self, name: str, domain_uid: str, node: str, conditions: bool = True) -> str:
        """A channel claim of the domain, allocated on ``node`` as the scheduler does it."""
        params = {"apiVersion": "resource.nvidia.com/v1beta1",
                  "kind": "ComputeDomainChannelConfig", "domainID": domain_uid}  # fmt: skip
        config = [{"requests": ["channel"],
                   "opaque": {"driver": cd.CD_DRIVER, "parameters": params}}]  # fmt: skip
        spec = {"devices": {"requests": [{"name": "channel", "exactly": {
            "deviceClassName": cd.CHANNEL_CLASS}}], "config": config}}  # fmt: skip
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"}, "spec": spec}  # fmt: skip
        claim = json.loads(await self.admin_api.create(CLAIMS, body))
        result: dict[str, Any] = {"request": "channel", "driver": cd.CD_DRIVER, "pool": node,
                                  "device": "channel-0"}  # fmt: skip
        if conditions:
            result["bindingConditions"] = [cd.IMEX_DOMAIN_READY]
            result["bindingFailureConditions"] = [cd.IMEX_DOMAIN_FAILED]
        claim["status"] = {"allocation": {
            "devices": {"results": [result],
                        "config": [{"source": "FromClaim", **c} for c in config]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
            "allocationTimestamp": claimstatus.now()}}  # fmt: skip
        await self.admin_api.replace(f"{CLAIMS}/{name}/status", claim)
        return str(claim["metadata"]["uid"])

    async def deallocate(self, name: str) -> None:
        """What the scheduler's PostFilter does after a binding failure."""
        claim = json.loads(await self.admin_api.get(f"{CLAIMS}/{name}"))
        claim["status"] = {}
        await self.admin_api.replace(f"{CLAIMS}/{name}/status", claim)

    async def join(self, uid: str, node: str, status: DomainNodeState, reason: str = "") -> None:
        member = DomainMember(domain_uid=uid, node=node, ip_address="10.2.0.1", clique_id=CLIQUE,
                              status=status, reason=reason)  # fmt: skip
        await self.admin.kv_put(
            subjects.DOMAINS_BUCKET, subjects.domain_member_key(uid, node), member
        )

    async def condition(self, claim: str) -> dict[str, dict[str, str]]:
        """The claim's channel-0 entry: condition type -> the condition."""
        got = json.loads(await self.admin_api.get(f"{CLAIMS}/{claim}"))
        for entry in (got.get("status") or {}).get("devices") or []:
            if entry["driver"] == cd.CD_DRIVER and entry["device"] == "channel-0":
                return {c["type"]: c for c in entry.get("conditions") or []}
        return {}

    async def synced(self, uid: str, marker: str) -> None:
        """A claim change made before now has been handled: a marker claim (named to sort
        after the others, on a node of its own) allocated now has its condition written;
        the claim watch delivers changes in order, and the controller handles them in order
        of their names."""
        await self.allocate(marker, uid, NODES[1])

        async def written() -> bool:
            return bool(await self.condition(marker))

        await until(written)

    def label(self, node: str) -> str | None:
        labels = self.cp.api_get(f"/api/v1/nodes/{node}")["metadata"].get("labels", {})
        value = labels.get(cd.DOMAIN_LABEL)
        return None if value is None else str(value)


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    async def loop() -> Any:
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(loop(), timeout)


@pytest.fixture
async def env(
    apiserver: tuple[ControlPlane, Path], nats_server: NatsServer
) -> AsyncIterator[tuple[Env, Bus]]:
    cp, kubeconfig = apiserver
    admin_api = versioned(await http_api(str(cp.kubeconfig)))
    ctl_api = versioned(await http_api(str(kubeconfig)))
    admin = await connect(nats_server)
    ctl_bus = await connect(nats_server, Role.DOMAINS)
    e = Env(cp, admin_api, ctl_api, admin)
    try:
        yield e, ctl_bus
    finally:
        for task in e.tasks:
            task.cancel()
        await asyncio.gather(*e.tasks, return_exceptions=True)
        for node in NODES:
            cp.kubectl("label", "node", node, f"{cd.DOMAIN_LABEL}-", check=False)
        cp.kubectl(
            "delete", "resourceclaims", "--all", "-n", "default", "--wait=false", check=False
        )
        await ctl_bus.close()
        await admin.close()
        await ctl_api.close()
        await admin_api.close()


def _is(want: str, reason: str = "") -> Callable[[dict[str, dict[str, str]]], bool]:
    def check(conditions: dict[str, dict[str, str]]) -> bool:
        ready = conditions.get(cd.IMEX_DOMAIN_READY, {})
        return ready.get("status") == want and (not reason or ready.get("reason") == reason)

    return check


async def test_a_channel_claim_is_ready_to_bind_once_its_nodes_daemon_is(
    env: tuple[Env, Bus],
) -> None:
    e, ctl_bus = env
    await e.start(ctl_bus)
    uid = await e.domain("bind-ready")
    await e.allocate("ready-ch", uid, NODES[0])

    # The node is labelled for the domain before any pod is on it (the DaemonSet's
    # nodeSelector), and the claim says why it is not ready yet.
    async def waiting(reason: str) -> dict[str, dict[str, str]] | None:
        got = await e.condition("ready-ch")
        return got if _is("False", reason)(got) else None

    first = await until(lambda: waiting("IMEXDaemonNotJoined"))
    assert e.label(NODES[0]) == uid
    assert cd.IMEX_DOMAIN_FAILED not in first
    await e.join(uid, NODES[0], "NotReady", "peers unreachable")
    second = await until(lambda: waiting("IMEXDaemonNotReady"))
    assert "peers unreachable" in second[cd.IMEX_DOMAIN_READY]["message"]
    await e.join(uid, NODES[0], "Ready")

    async def ready() -> dict[str, dict[str, str]] | None:
        got = await e.condition("ready-ch")
        return got if _is("True", "IMEXDaemonReady")(got) else None

    done = await until(ready)
    assert cd.IMEX_DOMAIN_FAILED not in done

    # The controller's own token: its driver's entries only (least privilege), so it
    # cannot forge the GPU driver's status in the same claim.
    claim = json.loads(await e.admin_api.get(f"{CLAIMS}/ready-ch"))
    gpu = claimstatus.entry("gpu.nvidia.com", NODES[0], "gpu-0", [])
    with pytest.raises(ApiError) as refused:
        await claimstatus.write(e.ctl_api, "default", "ready-ch", uid=claim["metadata"]["uid"],
                                resource_version=claim["metadata"]["resourceVersion"],
                                devices=[*claim["status"]["devices"], gpu])  # fmt: skip
    assert refused.value.status == 422 and "resourceclaims/driver" in str(refused.value)


async def test_a_failed_daemon_or_a_node_of_another_domain_fails_the_binding(
    env: tuple[Env, Bus],
) -> None:
    e, ctl_bus = env
    await e.start(ctl_bus)
    uid = await e.domain("bind-fail")
    other = await e.domain("bind-other")
    e.cp.kubectl("label", "node", NODES[1], f"{cd.DOMAIN_LABEL}={other}")

    await e.allocate("taken-ch", uid, NODES[1])

    async def failed(claim: str) -> dict[str, dict[str, str]] | None:
        got = await e.condition(claim)
        return got if got.get(cd.IMEX_DOMAIN_FAILED, {}).get("status") == "True" else None

    taken = await until(lambda: failed("taken-ch"))
    assert taken[cd.IMEX_DOMAIN_FAILED]["reason"] == "NodeServesAnotherComputeDomain"
    assert taken[cd.IMEX_DOMAIN_READY]["status"] == "False"
    assert e.label(NODES[1]) == other  # the other domain's node stays its own
    selector = "reason=NodeServesAnotherComputeDomain"
    events = e.cp.kubectl_json("get", "events", "-n", "default", "--field-selector", selector)
    assert any(ev["involvedObject"]["uid"] == uid for ev in events["items"])

    await e.allocate("broken-ch", uid, NODES[2])
    await e.join(uid, NODES[2], "Failed", "nvidia-imex: executable not found")
    broken = await until(lambda: failed("broken-ch"))
    assert broken[cd.IMEX_DOMAIN_FAILED]["reason"] == "IMEXDaemonFailed"
    assert "executable not found" in broken[cd.IMEX_DOMAIN_FAILED]["message"]


async def test_the_label_it_placed_goes_with_the_last_claim_that_never_bound(
    env: tuple[Env, Bus],
) -> None:
    e, ctl_bus = env
    await e.start(ctl_bus)
    uid = await e.domain("bind-label")
    await e.allocate("first-ch", uid, NODES[0])
    await e.allocate("second-ch", uid, NODES[0])
    await until(lambda: _ready_async(e, "second-ch", "False"))
    assert e.label(NODES[0]) == uid

    await e.deallocate("first-ch")  # after a binding failure: another claim still wants it
    await e.synced(uid, "zz-marker-1")
    assert e.label(NODES[0]) == uid
    await e.deallocate("second-ch")  # the last one: the label goes, the daemon with it

    async def unlabelled() -> bool:
        return e.label(NODES[0]) is None

    await until(unlabelled)


async def test_claims_without_binding_conditions_are_left_to_the_node(
    env: tuple[Env, Bus],
) -> None:
    """An allocation made before the slices had conditions (or on a server without them):
    the preparer labels at prepare, as before; the controller writes nothing for it, and
    does not take away a label such a claim may be using."""
    e, ctl_bus = env
    await e.start(ctl_bus)
    uid = await e.domain("bind-plain")
    await e.allocate("plain-ch", uid, NODES[2], conditions=False)
    await e.allocate("cond-ch", uid, NODES[2])
    await until(lambda: _ready_async(e, "cond-ch", "False"))
    await e.deallocate("cond-ch")
    await e.synced(uid, "zz-marker-2")
    assert await e.condition("plain-ch") == {}
    assert e.label(NODES[2]) == uid


async def _ready_async(e: Env, claim: str, status: str) -> bool:
    return _is(status)(await e.condition(claim))
