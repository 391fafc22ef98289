"""``gpudra domains`` (the ComputeDomain controller) against a real kube-apiserver and nats-server.

The controller runs in-process with the controller's own bus identity (its
permissions are the production ones); the test stands in for the IMEX daemons
by writing member keys as the admin identity. Everything is observed through
the API server and the bus. Skipped where the control plane cannot be built.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.kube.client import ApiError, KubeApi, http_api
from services.core.kube.resourceapi import versioned
from services.core.model import computedomain as cd
from services.core.model.schemas import DomainIndex, DomainMember, DomainNodeState
from services.domains.objects import DaemonSettings
from services.domains.service import Controller, ControllerConfig
from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from services.local.natsserver import NatsServer
from services.local.stack import COMPUTE_DOMAIN_CLIQUE_CRD, COMPUTE_DOMAIN_CRD
from tests.helpers.bus import connect
from tests.helpers.imex import Daemons

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NODES = [f"cd-node-{i}" for i in range(3)]
DRIVER_NS = "gpudra"
RCT = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"
DS = f"/apis/apps/v1/namespaces/{DRIVER_NS}/daemonsets"
BUCKET = subjects.DOMAINS_BUCKET
CLIQUE = "7d1c3e0a-0000-4000-8000-000000000001.1"
CLIQUES = f"/apis/resource.nvidia.com/v1beta1/namespaces/{DRIVER_NS}/computedomaincliques"


@pytest.fixture(scope="module")
def apiserver(controlplane_binary: Path) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_binary, nodes=NODES) as cp:
        install_crd(cp, COMPUTE_DOMAIN_CRD.read_text())
        install_crd(cp, COMPUTE_DOMAIN_CLIQUE_CRD.read_text())
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DRIVER_NS}})
        yield cp


class Env:
    def __init__(self, api: KubeApi, admin: Bus, ctl_bus: Bus) -> None:
        self.api, self.admin, self.ctl_bus = api, admin, ctl_bus
        self.controller: Controller | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self, **config: Any) -> Controller:
        settings = ControllerConfig(daemon=DaemonSettings(namespace=DRIVER_NS), **config)
        self.controller = Controller(self.api, self.ctl_bus, settings)
        self.task = asyncio.create_task(self.controller.run())
        return self.controller

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await self.task
        self.task = None

    async def domain(
        self, name: str, num_nodes: int | None = 2, template: str = ""
    ) -> dict[str, Any]:
        """Create a domain; ``num_nodes=None`` leaves numNodes out (the CRD defaults it)."""
        spec: dict[str, Any] = {
            "channel": {"resourceClaimTemplate": {"name": template or f"{name}-channel"}}
        }
        if num_nodes is not None:
            spec["numNodes"] = num_nodes
        body = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        }
        return dict(json.loads(await self.api.create(cd.domains_path("default"), body)))

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return dict(json.loads(await self.api.get(path)))
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def join(
        self, uid: str, node: str, status: DomainNodeState = "NotReady", **extra: Any
    ) -> None:
        member = DomainMember(
            domain_uid=uid, node=node, ip_address=f"10.0.0.{NODES.index(node) + 1}"
            if node in NODES else "10.1.0.1", clique_id=extra.pop("clique_id", CLIQUE),
            status=status, **extra,
        )  # fmt: skip
        await self.admin.kv_put(BUCKET, subjects.domain_member_key(uid, node), member)


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    async def loop() -> Any:
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.05)

    return await asyncio.wait_for(loop(), timeout)


@pytest.fixture
async def env(apiserver: ControlPlane, nats_server: NatsServer) -> AsyncIterator[Env]:
    api = versioned(await http_api(str(apiserver.kubeconfig)))
    admin = await connect(nats_server)
    ctl_bus = await connect(nats_server, Role.DOMAINS)
    e = Env(api, admin, ctl_bus)
    try:
        yield e
    finally:
        await e.stop()
        await ctl_bus.close()
        await admin.close()
        await api.close()


async def status_of(env: Env, name: str) -> dict[str, Any]:
    obj = await env.get(cd.domains_path("default", name))
    assert obj is not None
    return dict(obj.get("status") or {})


async def test_a_domain_gets_its_templates_and_daemonset(env: Env) -> None:
    await env.start()
    made = await env.domain("cd-objects")
    uid = made["metadata"]["uid"]
    name = cd.daemon_name(uid)
    workload = await until(lambda: env.get(RCT.format(ns="default") + "/cd-objects-channel"))
    daemon_rct = await until(lambda: env.get(RCT.format(ns=DRIVER_NS) + f"/{name}"))
    ds = await until(lambda: env.get(f"{DS}/{name}"))
    for obj in (workload, daemon_rct, ds):
        assert obj["metadata"]["labels"][cd.DOMAIN_LABEL] == uid
        assert obj["metadata"]["finalizers"] == [cd.FINALIZER]
    assert workload["metadata"]["labels"][cd.TARGET_LABEL] == "Workload"
    assert daemon_rct["metadata"]["labels"][cd.TARGET_LABEL] == "Daemon"
    request = workload["spec"]["spec"]["devices"]["requests"][0]
    assert request["name"] == "channel"
    assert request["exactly"]["deviceClassName"] == cd.CHANNEL_CLASS
    params = workload["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params == {"apiVersion": "resource.nvidia.com/v1beta1",
                      "kind": "ComputeDomainChannelConfig", "domainID": uid,
                      "allocationMode": "Single"}  # fmt: skip
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {cd.DOMAIN_LABEL: uid}
    env_of = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env_of["COMPUTE_DOMAIN_NUM_NODES"] == "2"  # IMEX waits for them by IP address
    assert pod["resourceClaims"] == [{"name": "compute-domain-daemon",
                                      "resourceClaimTemplateName": name}]  # fmt: skip
    domain = await until(lambda: env.get(cd.domains_path("default", "cd-objects")))
    assert cd.FINALIZER in domain["metadata"]["finalizers"]


async def test_status_follows_the_members_readiness(env: Env) -> None:
    await env.start()
    uid = (await env.domain("cd-status"))["metadata"]["uid"]
    await env.join(uid, NODES[0])
    await env.join(uid, NODES[1])

    async def nodes_are(want: str, count: int = 2) -> bool:
        status = await status_of(env, "cd-status")
        nodes = status.get("nodes", [])
        return len(nodes) == count and status.get("status") == want

    await until(lambda: nodes_are("NotReady"))
    status = await status_of(env, "cd-status")
    assert sorted(n["index"] for n in status["nodes"]) == [0, 1]
    await env.join(uid, NODES[0], "Ready")
    await asyncio.sleep(0)  # one Ready of two: still NotReady
    await env.join(uid, NODES[1], "Ready")
    await until(lambda: nodes_are("Ready"))
    await env.join(uid, NODES[1], "NotReady")  # a daemon dies
    await until(lambda: nodes_are("NotReady"))
    await env.join(uid, NODES[1], "Ready")  # and comes back
    await until(lambda: nodes_are("Ready"))
    after = await status_of(env, "cd-status")
    assert {n["name"]: n["index"] for n in after["nodes"]} == {
        n["name"]: n["index"] for n in status["nodes"]
    }


async def test_a_domain_without_num_nodes_is_ready_while_every_member_is(env: Env) -> None:
    """numNodes left out: the CRD defaults it to 0, as the reference's does, and the
    status is the reference's for 0 (calculateGlobalStatus): Ready with no member yet,
    NotReady while a member that joined is not Ready."""
    await env.start()
    made = await env.domain("cd-zero", num_nodes=None)
    assert made["spec"]["numNodes"] == 0
    uid = made["metadata"]["uid"]

    async def status_is(want: str, count: int) -> bool:
        status = await status_of(env, "cd-zero")
        return status.get("status") == want and len(status.get("nodes", [])) == count

    await until(lambda: status_is("Ready", 0))
    await env.join(uid, NODES[0])
    await until(lambda: status_is("NotReady", 1))
    await env.join(uid, NODES[0], "Ready")
    await until(lambda: status_is("Ready", 1))


async def test_concurrent_joins_lose_no_peer_and_indices_are_unique(env: Env) -> None:
    await env.start()
    uid = (await env.domain("cd-many", num_nodes=18))["metadata"]["uid"]
    nodes = [f"rack-node-{i:02d}" for i in range(19)]
    await asyncio.gather(*(env.join(uid, n, "Ready") for n in nodes))

    async def all_there() -> list[dict[str, Any]] | None:
        status = await status_of(env, "cd-many")
        return status.get("nodes") if len(status.get("nodes", [])) == 19 else None

    listed = await until(all_there)
    indices = [n["index"] for n in listed if n["index"] >= 0]
    assert sorted(indices) == list(range(18))  # the 19th exceeds the clique's 18
    (extra,) = [n for n in listed if n["index"] < 0]
    assert extra["status"] == "NotReady"
    assert (await status_of(env, "cd-many"))["status"] == "NotReady"


async def test_indices_survive_a_controller_restart_and_a_daemon_restart(env: Env) -> None:
    await env.start()
    uid = (await env.domain("cd-stable"))["metadata"]["uid"]
    for node in NODES[:2]:
        await env.join(uid, node, "Ready")
    await until(lambda: _indexed(env, uid, 2))
    before = await _indices(env, uid)
    await env.stop()
    await env.admin.kv_delete(BUCKET, subjects.domain_member_key(uid, NODES[0]))
    await env.join(uid, NODES[2], "Ready")  # joins while no controller runs
    await env.join(uid, NODES[0], "Ready")  # node 0's daemon restarted meanwhile
    await env.start()
    await until(lambda: _indexed(env, uid, 3))
    after = await _indices(env, uid)
    assert after[NODES[1]] == before[NODES[1]]
    assert len(set(after.values())) == 3


async def _indices(env: Env, uid: str) -> dict[str, int]:
    out = {}
    for key in await env.admin.kv_keys(BUCKET):
        parsed = subjects.parse_domain_key(key)
        if parsed and parsed[0] == uid and parsed[1] == subjects.INDEX:
            got = await env.admin.kv_get(BUCKET, key, DomainIndex)
            if got:
                out[parsed[2]] = got[0].index
    return out


async def _indexed(env: Env, uid: str, count: int) -> bool:
    return len(await _indices(env, uid)) == count


async def test_a_daemon_that_cannot_start_is_an_event_on_the_domain(env: Env) -> None:
    await env.start()
    uid = (await env.domain("cd-failed", num_nodes=1))["metadata"]["uid"]
    why = "nvidia-imex exited: fabric-imex-mgmt capability missing"
    await env.join(uid, NODES[0], "Failed", reason=why)

    async def event() -> dict[str, Any] | None:
        listing = await env.api.list("/api/v1/namespaces/default/events", {})
        for raw in listing.items:
            e = json.loads(bytes(raw))
            if e["involvedObject"].get("uid") == uid:
                return dict(e)
        return None

    found = await until(event)  # the event is sent before the status is written
    assert found["reason"] == "IMEXDaemonFailed" and why in found["message"]
    status = await until(lambda: status_of(env, "cd-failed"))
    assert status["status"] == "NotReady" and status["nodes"][0]["status"] == "Failed"


async def test_deleting_a_domain_removes_everything(env: Env) -> None:
    await env.start()
    uid = (await env.domain("cd-delete"))["metadata"]["uid"]
    name = cd.daemon_name(uid)
    await until(lambda: env.get(f"{DS}/{name}"))
    await env.api.patch(
        f"/api/v1/nodes/{NODES[2]}", {"metadata": {"labels": {cd.DOMAIN_LABEL: uid}}}
    )
    await env.join(uid, NODES[2], "Ready")
    await until(lambda: _indexed(env, uid, 1))
    await env.api.delete(cd.domains_path("default", "cd-delete"))

    async def gone() -> bool:
        paths = [cd.domains_path("default", "cd-delete"), f"{DS}/{name}",
                 RCT.format(ns=DRIVER_NS) + f"/{name}",
                 RCT.format(ns="default") + "/cd-delete-channel"]  # fmt: skip
        return all([await env.get(p) is None for p in paths])

    await until(gone)
    node = await env.get(f"/api/v1/nodes/{NODES[2]}")
    assert node is not None and cd.DOMAIN_LABEL not in node["metadata"].get("labels", {})
    keys = [k for k in await env.admin.kv_keys(BUCKET) if k.startswith(subjects.escape_token(uid))]
    assert keys == []


async def test_a_taken_template_name_is_reported_and_left_alone(env: Env) -> None:
    mine = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "users-own", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "x", "exactly": {"deviceClassName": cd.CHANNEL_CLASS}}]}}}}  # fmt: skip
    await env.api.create(RCT.format(ns="default"), mine)
    await env.start()
    uid = (await env.domain("cd-conflict", template="users-own"))["metadata"]["uid"]

    async def event() -> dict[str, Any] | None:
        listing = await env.api.list("/api/v1/namespaces/default/events", {})
        found = [json.loads(bytes(r)) for r in listing.items]
        return next((e for e in found if e["involvedObject"].get("uid") == uid), None)

    found = await until(event)
    assert found["reason"] == "ObjectConflict"
    assert "ResourceClaimTemplate default/users-own already exists" in found["message"]
    await env.api.delete(cd.domains_path("default", "cd-conflict"))
    await until(lambda: _absent(env, cd.domains_path("default", "cd-conflict")))
    still = await env.get(RCT.format(ns="default") + "/users-own")
    assert still is not None and cd.DOMAIN_LABEL not in still["metadata"].get("labels", {})


async def _absent(env: Env, path: str) -> bool:
    return await env.get(path) is None


async def test_the_sweep_removes_what_a_vanished_domain_left(env: Env) -> None:
    ghost = str(uuid.uuid4())
    labels = {cd.DOMAIN_LABEL: ghost, cd.TARGET_LABEL: "Daemon"}
    left = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": cd.daemon_name(ghost), "namespace": DRIVER_NS,
                         "labels": labels, "finalizers": [cd.FINALIZER]},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "daemon", "exactly": {"deviceClassName": cd.DAEMON_CLASS}}
            ]}}}}  # fmt: skip
    await env.api.create(RCT.format(ns=DRIVER_NS), left)
    await env.api.patch(
        f"/api/v1/nodes/{NODES[1]}", {"metadata": {"labels": {cd.DOMAIN_LABEL: ghost}}}
    )
    await env.join(ghost, NODES[1], "Ready")
    clique = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainClique",
              "metadata": {"name": f"{ghost}.{CLIQUE}", "namespace": DRIVER_NS,
                           "labels": {cd.DOMAIN_LABEL: ghost, cd.CLIQUE_LABEL: CLIQUE}},
              "daemons": []}  # fmt: skip
    await env.api.create(CLIQUES, clique)
    controller = await env.start(sweep_s=3600)
    await controller.informer.synced.wait()
    assert ghost in await controller.sweep()
    assert await env.get(RCT.format(ns=DRIVER_NS) + f"/{cd.daemon_name(ghost)}") is None
    assert await env.get(f"{CLIQUES}/{ghost}.{CLIQUE}") is None
    node = await env.get(f"/api/v1/nodes/{NODES[1]}")
    assert node is not None and cd.DOMAIN_LABEL not in node["metadata"].get("labels", {})
    assert not [k for k in await env.admin.kv_keys(BUCKET) if subjects.escape_token(ghost) in k]


async def test_the_sweep_keeps_a_domain_its_informer_has_not_seen_yet(env: Env) -> None:
    """A daemon may join before the controller's watch delivers its new domain."""
    uid = (await env.domain("cd-unseen", num_nodes=1))["metadata"]["uid"]
    await env.join(uid, NODES[0], "Ready")
    controller = Controller(env.api, env.ctl_bus, ControllerConfig(DaemonSettings(DRIVER_NS)))
    await controller.load_membership()  # its informer never ran: it knows no domain
    assert uid in controller.membership.domains()
    assert uid not in await controller.sweep()
    assert subjects.domain_member_key(uid, NODES[0]) in await env.admin.kv_keys(BUCKET)
    assert controller.membership.nodes(uid)


async def test_a_malformed_bucket_value_is_skipped_when_the_membership_is_loaded(
    env: Env,
) -> None:
    """The load reads the bucket in one pass; a value that does not decode (an admin's
    slip) is skipped and counted there, as the watch after it skips it."""
    uid = (await env.domain("cd-junk", num_nodes=1))["metadata"]["uid"]
    await env.join(uid, NODES[0], "Ready")
    kv = await env.admin.kv(BUCKET)
    await kv.put(subjects.domain_member_key(uid, NODES[1]), b"\xc1 not msgpack")
    controller = Controller(env.api, env.ctl_bus, ControllerConfig(DaemonSettings(DRIVER_NS)))
    await controller.load_membership()
    assert list(controller.membership.members[uid]) == [NODES[0]]


async def test_the_domain_is_ready_only_once_both_daemons_see_each_other(
    env: Env, nats_server: NatsServer, tmp_path: Path
) -> None:
    """Controller and two simulated daemons (real processes): readiness is earned end to end."""
    daemons = Daemons(nats_server, tmp_path, {NODES[0]: "127.0.0.2", NODES[1]: "127.0.0.3"})
    await env.start()
    uid = (await env.domain("cd-earned", num_nodes=2))["metadata"]["uid"]
    try:
        daemons.start(NODES[0], uid=uid, clique=CLIQUE)
        await until(lambda: _node_count(env, "cd-earned", 1))
        assert (await status_of(env, "cd-earned"))["status"] == "NotReady"  # 1 of 2 nodes
        daemons.start(NODES[1], uid=uid, clique=CLIQUE)
        await until(lambda: _status_is(env, "cd-earned", "Ready"))
        status = await status_of(env, "cd-earned")
        assert sorted((n["name"], n["ipAddress"], n["index"]) for n in status["nodes"]) == [
            (NODES[0], "127.0.0.2", 0), (NODES[1], "127.0.0.3", 1)]  # fmt: skip
        daemons.kill(NODES[1])  # dies: its peer can no longer reach it
        await until(lambda: _status_is(env, "cd-earned", "NotReady"))
        daemons.start(NODES[1], uid=uid, clique=CLIQUE)  # recovers, same index
        await until(lambda: _status_is(env, "cd-earned", "Ready"))
        after = await status_of(env, "cd-earned")
        assert sorted(n["index"] for n in after["nodes"]) == [0, 1]
    finally:
        daemons.kill_all()


async def _node_count(env: Env, name: str, count: int) -> bool:
    return len((await status_of(env, name)).get("nodes", [])) == count


async def _status_is(env: Env, name: str, want: str) -> bool:
    status = await status_of(env, name)
    return status.get("status") == want and len(status.get("nodes", [])) == 2


@pytest.mark.parametrize("written", ["while it runs", "before it starts"])
async def test_a_member_value_under_another_nodes_key_is_ignored(env: Env, written: str) -> None:
    """Whether the controller reads the forged values as changes or in its first load."""
    if written == "while it runs":
        await env.start()
    name = f"cd-hostile-{written.split()[0]}"
    uid = (await env.domain(name, num_nodes=1))["metadata"]["uid"]
    forged = DomainMember(domain_uid=uid, node="elsewhere", ip_address="6.6.6.6",
                          clique_id=CLIQUE, status="Ready")  # fmt: skip
    await env.admin.kv_put(BUCKET, subjects.domain_member_key(uid, NODES[0]), forged)
    other = DomainMember(domain_uid="another-domain", node=NODES[1], ip_address="6.6.6.7",
                         clique_id=CLIQUE, status="Ready")  # fmt: skip
    await env.admin.kv_put(BUCKET, subjects.domain_member_key(uid, NODES[1]), other)
    if written == "before it starts":
        await env.start()
    await env.join(uid, NODES[2], "Ready")  # the one honest member
    await until(lambda: _status_with(env, name, 1))
    status = await status_of(env, name)
    assert [n["name"] for n in status["nodes"]] == [NODES[2]]
    assert status["status"] == "Ready"


async def _status_with(env: Env, name: str, count: int) -> bool:
    status = await status_of(env, name)
    return status.get("status") == "Ready" and len(status.get("nodes", [])) == count


# ------------------------------------------------------------------ ComputeDomainCliques


def _daemon(node: str, clique: str, index: int, status: str) -> dict[str, Any]:
    ip = f"10.0.0.{NODES.index(node) + 1}"
    return {"nodeName": node, "ipAddress": ip, "cliqueID": clique, "index": index,
            "status": status}  # fmt: skip


async def _cliques_of(env: Env, uid: str) -> dict[str, dict[str, Any]]:
    listing = json.loads(await env.api.get(f"{CLIQUES}?labelSelector={cd.DOMAIN_LABEL}%3D{uid}"))
    return {item["metadata"]["name"]: item for item in listing["items"]}


async def test_clique_objects_mirror_each_cliques_daemons(env: Env) -> None:
    """ComputeDomainCliques (on by default): one ComputeDomainClique per domain and clique
    in the driver's namespace, as the reference names and labels it, listing the clique's
    daemons in index order; written by the controller alone as membership changes, the
    empty one and all of them at the domain's deletion removed."""
    await env.start()
    uid = (await env.domain("cd-cliques", num_nodes=4))["metadata"]["uid"]
    other = CLIQUE.replace(".1", ".2")
    await env.join(uid, NODES[0], "Ready")
    await env.join(uid, NODES[1], "NotReady")
    await env.join(uid, NODES[2], "Failed", clique_id=other, reason="no binary")
    await env.join(uid, "plain-node", "Ready", clique_id="")  # outside a fabric: no clique
    first, second = f"{uid}.{CLIQUE}", f"{uid}.{other}"
    want = {
        first: [_daemon(NODES[0], CLIQUE, 0, "Ready"), _daemon(NODES[1], CLIQUE, 1, "NotReady")],
        second: [_daemon(NODES[2], other, 0, "NotReady")],  # the CRD has no Failed
    }

    async def daemons_are(want: dict[str, list[dict[str, Any]]]) -> bool:
        found = await _cliques_of(env, uid)
        return {name: obj.get("daemons") for name, obj in found.items()} == want

    await until(lambda: daemons_are(want))
    found = await _cliques_of(env, uid)
    assert found[first]["metadata"]["labels"] == {cd.DOMAIN_LABEL: uid, cd.CLIQUE_LABEL: CLIQUE}
    assert found[second]["metadata"]["labels"][cd.CLIQUE_LABEL] == other
    assert found[first]["metadata"]["namespace"] == DRIVER_NS

    await env.join(uid, NODES[1], "Ready")
    want[first][1]["status"] = "Ready"
    await until(lambda: daemons_are(want))
    await env.admin.kv_delete(BUCKET, subjects.domain_member_key(uid, NODES[2]))  # it leaves
    del want[second]
    await until(lambda: daemons_are(want))

    await env.api.delete(cd.domains_path("default", "cd-cliques"))
    await until(lambda: daemons_are({}))
    await until(lambda: _gone(env, cd.domains_path("default", "cd-cliques")))


async def _gone(env: Env, path: str) -> bool:
    return await env.get(path) is None


async def test_without_cliques_the_controller_writes_no_clique_objects(env: Env) -> None:
    """ComputeDomainCliques=false: membership and status as ever, no clique objects."""
    await env.start(cliques=False)
    uid = (await env.domain("cd-no-cliques", num_nodes=1))["metadata"]["uid"]
    await env.join(uid, NODES[0], "Ready")
    await until(lambda: _ready_with(env, "cd-no-cliques", 1))
    assert await _cliques_of(env, uid) == {}


async def _ready_with(env: Env, name: str, count: int) -> bool:
    status = await status_of(env, name)
    return status.get("status") == "Ready" and len(status.get("nodes", [])) == count


async def test_a_missing_clique_crd_holds_back_neither_status_nor_deletion(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate on, but the API server serves no ComputeDomainClique (a cluster whose CRD
    was not installed): the status is written, the clique writes are retried, and the
    domain is deleted as ever."""
    from services.domains import cliques

    monkeypatch.setattr(cliques, "PLURAL", "computedomaincliquesnotinstalled")
    await env.start()
    await env.domain("cd-no-crd", num_nodes=1)
    uid = (await env.get(cd.domains_path("default", "cd-no-crd")) or {})["metadata"]["uid"]
    await env.join(uid, NODES[0], "Ready")
    await until(lambda: _ready_with(env, "cd-no-crd", 1))
    await env.api.delete(cd.domains_path("default", "cd-no-crd"))
    await until(lambda: _gone(env, cd.domains_path("default", "cd-no-crd")))


async def test_a_restarted_controller_removes_a_clique_emptied_meanwhile(env: Env) -> None:
    """The objects are found again by label: a clique whose last daemon left while no
    controller ran is deleted by the next one."""
    await env.start()
    uid = (await env.domain("cd-clique-restart", num_nodes=1))["metadata"]["uid"]
    other = CLIQUE.replace(".1", ".3")
    await env.join(uid, NODES[0], "Ready", clique_id=other)

    async def objects() -> set[str]:
        return set(await _cliques_of(env, uid))

    await until(lambda: _equal(objects(), {f"{uid}.{other}"}))
    await env.stop()
    await env.admin.kv_delete(BUCKET, subjects.domain_member_key(uid, NODES[0]))
    await env.start()
    await until(lambda: _equal(objects(), set()))


async def _equal(value: Awaitable[Any], want: Any) -> bool:
    return bool(await value == want)
