"""A channel claim's way into its ComputeDomain (services/preparer/computedomain/gate.py).

Against a real kube-apiserver and nats-server, as the node's preparer identity:
the domain must exist in the claim's namespace, the node takes one domain's label
at a time (and loses it only to that domain), and readiness is the node's daemon's
own word on the bus, waited for up to a deadline. Skipped where the control plane
cannot be built.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.kube.client import KubeApi, http_api
from services.core.model import computedomain as cd
from services.core.model.schemas import DomainMember
from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from services.local.natsserver import NatsServer
from services.local.stack import COMPUTE_DOMAIN_CRD
from services.preparer.computedomain.gate import DomainGate, GateError
from tests.helpers.bus import connect

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NODE = "gate-node"


@pytest.fixture(scope="module")
def apiserver(controlplane_binary: Path) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_binary, nodes=[NODE]) as cp:
        install_crd(cp, COMPUTE_DOMAIN_CRD.read_text())
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})
        yield cp


@pytest.fixture
async def parts(
    apiserver: ControlPlane, nats_server: NatsServer
) -> AsyncIterator[tuple[DomainGate, KubeApi, Bus]]:
    api = await http_api(str(apiserver.kubeconfig))
    admin = await connect(nats_server)
    preparer = await connect(nats_server, Role.PREPARER, NODE)
    try:
        yield DomainGate(api, preparer, NODE), api, admin
    finally:
        await api.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {cd.DOMAIN_LABEL: None}}})
        await preparer.close()
        await admin.close()
        await api.close()


async def domain(api: KubeApi, name: str, namespace: str = "default") -> str:
    spec = {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": name}}}
    body = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip
    return str(json.loads(await api.create(cd.domains_path(namespace), body))["metadata"]["uid"])


async def label(api: KubeApi) -> Any:
    node = json.loads(await api.get(f"/api/v1/nodes/{NODE}"))
    return node["metadata"].get("labels", {}).get(cd.DOMAIN_LABEL)


async def test_a_missing_domain_or_one_in_another_namespace_is_permanent(
    parts: tuple[DomainGate, KubeApi, Bus],
) -> None:
    gate, api, _ = parts
    with pytest.raises(GateError, match="ComputeDomain not found: no-such-uid") as info:
        await gate.admit("no-such-uid", "default", 1)
    assert info.value.permanent
    uid = await domain(api, "elsewhere", "team-b")
    with pytest.raises(GateError, match=r"namespace is different .*default != team-b") as info:
        await gate.admit(uid, "default", 1)
    assert info.value.permanent
    assert await label(api) is None  # nothing was touched


async def test_one_domain_per_node_and_the_label_goes_only_with_its_domain(
    parts: tuple[DomainGate, KubeApi, Bus],
) -> None:
    gate, api, admin = parts
    first, second = await domain(api, "first"), await domain(api, "second")
    ready = DomainMember(domain_uid=first, node=NODE, ip_address="10.0.0.1", clique_id="c.1",
                         status="Ready")  # fmt: skip
    await admin.kv_put(subjects.DOMAINS_BUCKET, subjects.domain_member_key(first, NODE), ready)
    got = await gate.admit(first, "default", 5)
    assert got.name == "first" and await label(api) == first
    await gate.admit(first, "default", 5)  # a second pod of the same domain on this node
    with pytest.raises(GateError, match=r"label already exists for a different ComputeDomain"):
        await gate.admit(second, "default", 1)
    await gate.unlabel(second)  # not its label: stays
    assert await label(api) == first
    await gate.unlabel(first)
    assert await label(api) is None


async def test_readiness_is_waited_for_and_a_timeout_says_why(
    parts: tuple[DomainGate, KubeApi, Bus],
) -> None:
    gate, api, admin = parts
    uid = await domain(api, "slow")
    key = subjects.domain_member_key(uid, NODE)
    with pytest.raises(GateError, match=r"not ready in ComputeDomain default/slow after 0.5s "
                       r"\(its IMEX daemon has not joined\)") as info:  # fmt: skip
        await gate.admit(uid, "default", 0.5)
    assert not info.value.permanent
    member = DomainMember(domain_uid=uid, node=NODE, ip_address="10.0.0.1", clique_id="c.1",
                          status="NotReady", reason="IMEX not READY: peers missing")  # fmt: skip
    await admin.kv_put(subjects.DOMAINS_BUCKET, key, member)
    with pytest.raises(GateError, match="its IMEX daemon is NotReady: IMEX not READY"):
        await gate.ready(await gate.domain(uid, "default"), 0.5)
    waiting = asyncio.create_task(gate.admit(uid, "default", 30))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    ready = DomainMember(domain_uid=uid, node=NODE, ip_address="10.0.0.1", clique_id="c.1",
                         status="Ready")  # fmt: skip
    await admin.kv_put(subjects.DOMAINS_BUCKET, key, ready)
    assert (await asyncio.wait_for(waiting, 30)).uid == uid
