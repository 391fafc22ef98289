"""kill -9 of each process while 20 pods are created and deleted: the stack restarts it.

One stack as `gpudra up` builds it (services.local.stack with ``supervise=True``: the
two demo nodes with kubelet-dra, the webhook, every process supervised; the prepare
deadline of its full demo). 20 pods, each with a claim from a template (ten full
GPUs, ten MIG devices), are created in six batches; right after each batch one
process is killed with SIGKILL by the PID ``processes.json`` names, in turn:
nats-server, a preparer, a front (the kubelet plugin), the allocator, the publisher
and a discovery. Nobody restarts them by hand: the next batch waits until the stack
has. Then every pod must be Running and every allocated claim held exactly once:
prepared in its node's checkpoint with the allocated devices, one CDI spec, its
devices in KV ``prepared``; nothing else held (leaked) and no device or claim held
twice. Then the same while the 20 pods are deleted (the other node's preparer, front
and discovery this time): everything released, nothing left prepared anywhere.
Last, every process not killed yet (the control plane's, the kubelets, the webhook,
the ComputeDomain controller) is killed once, and pods still come and go.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.model.schemas import NodePreparedDevices
from services.local import demoview
from services.local.stack import DOMAIN_DEMO_PREPARE_TIMEOUT, Stack
from services.local.stackprocs import alive, recorded_pids
from services.preparer import checkpoint, checkpointfile
from tests.helpers.bus import connect
from tests.helpers.stackrun import started_stack
from tests.helpers.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

H100 = "gpu-node-h100"
A100 = "gpu-node-a100"
DRIVER = "gpu.nvidia.com"
NS = "faults"
PODS = [f"p{i:02d}" for i in range(20)]
BATCHES = [PODS[0:4], PODS[4:8], PODS[8:11], PODS[11:14], PODS[14:17], PODS[17:20]]
#: Killed in turn, one after each batch: while creating, then while deleting.
CREATE_VICTIMS = ["nats", f"preparer-{H100}", f"kubeletplugin-{A100}", "allocator",
                  "publisher", f"discovery-{H100}"]  # fmt: skip
DELETE_VICTIMS = ["nats", f"preparer-{A100}", f"kubeletplugin-{H100}", "allocator",
                  "publisher", f"discovery-{A100}"]  # fmt: skip
CDI_PREFIX = "k8s.gpu.nvidia.com-claim_"
IMAGE = "registry.k8s.io/pause:3.10"


@dataclass
class Up:
    """The stack and what its supervisor said."""

    stack: Stack
    said: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def up(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[Up]:
    said: list[str] = []
    # `gpudra up`'s prepare deadline with its full demo: a request lost with nats-server
    # fails after 12 s, not 45 s, before the kubelet's retry.
    stack = Stack(binary=controlplane_binary, webhook=True, supervise=True, say=said.append,
                  prepare_timeout=DOMAIN_DEMO_PREPARE_TIMEOUT)  # fmt: skip
    with started_stack(request, stack, "supervised stack"):
        # The reader's identity now: a new one reloads nats-server, never mid-test.
        stack.nats.credentials(Role.AUDITOR)
        stack.cp.apply([namespace(NS), template("gpu", "gpu.nvidia.com"),
                        template("mig", "mig.nvidia.com")])  # fmt: skip
        yield Up(stack, said)


# ---- the workload ---------------------------------------------------------------------


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def template(name: str, device_class: str) -> dict[str, Any]:
    request = {"name": "dev", "exactly": {"deviceClassName": device_class}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": NS, "name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def pod(name: str) -> dict[str, Any]:
    """Even pods take a full GPU (either node), odd ones a MIG device (the A100s')."""
    kind = "gpu" if int(name[1:]) % 2 == 0 else "mig"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": NS, "name": name},
        "spec": {
            "containers": [
                {"name": "ctr", "image": IMAGE, "resources": {"claims": [{"name": "dev"}]}}
            ],
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": kind}],
        },
    }


def pods(stack: Stack) -> dict[str, Any]:
    return {
        p["metadata"]["name"]: p for p in stack.api_get(f"/api/v1/namespaces/{NS}/pods")["items"]
    }


def running(stack: Stack) -> list[str]:
    """The pods Running with their CDI devices (kubelet-dra records them once prepared)."""
    return sorted(
        name
        for name, p in pods(stack).items()
        if p["status"].get("phase") == "Running"
        and (p["metadata"].get("annotations") or {}).get(demoview.CDI_DEVICES_ANNOTATION)
    )


# ---- killing ----------------------------------------------------------------------------


async def kill_and_wait_for_restart(up: Up, name: str) -> None:
    """SIGKILL ``name`` by the PID the stack recorded; wait until the stack (never we)
    has started it again."""
    supervisor = up.stack.supervisor
    assert supervisor is not None
    before = supervisor.restarts.get(name, 0)
    pid = recorded_pids(up.stack.workdir)[name]
    os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        now = recorded_pids(up.stack.workdir).get(name)
        return supervisor.restarts.get(name, 0) > before and now not in (None, pid) and alive(now)

    await until(restarted, f"the stack to restart {name} (pid {pid})", timeout=60)


def reported(up: Up, name: str) -> list[str]:
    return [line for line in up.said if line.startswith(f"{name} ")]


# ---- what is held -------------------------------------------------------------------------


@dataclass
class Holdings:
    """Who holds which device, by every record there is."""

    allocated: dict[str, tuple[str, list[str]]]  # claim uid -> its node, devices
    checkpoint: dict[str, dict[str, list[str]]]  # node -> prepared claim uid -> devices
    cdi: dict[str, list[str]]  # node -> claim uids with a CDI spec
    bucket: dict[str, list[tuple[str, str]]]  # node -> (device, claim uid) in KV prepared

    def problems(self) -> list[str]:
        """Leaked, missing and twice-held claims and devices (empty: each allocated claim
        is held exactly once, by its node, with its devices, and nothing else is)."""
        found = []
        owners: dict[str, list[str]] = {}
        for node, claims in self.checkpoint.items():
            for uid in claims:
                owners.setdefault(uid, []).append(node)
            devices = [d for devs in claims.values() for d in devs]
            found += [
                f"{node}: {d} held twice" for d in sorted(set(devices)) if devices.count(d) > 1
            ]
            expected = {uid: devs for uid, (n, devs) in self.allocated.items() if n == node}
            found += [
                f"{node}: claim {u} held, not allocated (leaked)" for u in claims - expected.keys()
            ]
            found += [
                f"{node}: claim {u} allocated, not held" for u in expected.keys() - claims.keys()
            ]
            found += [
                f"{node}: claim {u} holds {claims[u]}, allocated {expected[u]}"
                for u in claims.keys() & expected.keys()
                if claims[u] != expected[u]
            ]
            if sorted(self.cdi[node]) != sorted(claims):
                found.append(f"{node}: CDI specs {sorted(self.cdi[node])} != held {sorted(claims)}")
            held = sorted((d, uid) for uid, devs in claims.items() for d in devs)
            if self.bucket[node] != held:
                found.append(f"{node}: KV prepared {self.bucket[node]} != held {held}")
        found += [f"claim {uid} held on {nodes}" for uid, nodes in owners.items() if len(nodes) > 1]
        return found

    @property
    def held(self) -> int:
        return sum(len(claims) for claims in self.checkpoint.values())


async def holdings(stack: Stack) -> Holdings:
    claims = stack.api_get("/apis/resource.k8s.io/v1/resourceclaims")["items"]
    allocated: dict[str, tuple[str, list[str]]] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            results = [r for r in allocation["devices"]["results"] if r["driver"] == DRIVER]
            (node,) = {r["pool"] for r in results}
            allocated[claim["metadata"]["uid"]] = (node, sorted(r["device"] for r in results))
    held: dict[str, dict[str, list[str]]] = {}
    cdi: dict[str, list[str]] = {}
    bucket: dict[str, list[tuple[str, str]]] = {}
    bus = await connect(stack.nats, Role.AUDITOR, name="e2e-supervision")
    try:
        for node, where in stack.nodes.items():
            path = where.paths.plugin_dir / checkpointfile.FILENAME
            entries = checkpointfile.decode(path.read_bytes()).claims if path.exists() else {}
            held[node] = {
                uid: sorted(d.name for d in entry.devices)
                for uid, entry in entries.items()
                if entry.state == checkpoint.PREPARE_COMPLETED
            }
            held[node].update(  # a claim half prepared or unprepared holds too
                {uid: ["(not completed)"] for uid, e in entries.items() if uid not in held[node]}
            )
            cdi[node] = [p.name.removeprefix(CDI_PREFIX).removesuffix(".yaml")
                         for p in where.paths.cdi_root.iterdir()]  # fmt: skip
            found = await bus.kv_get(
                subjects.PREPARED_BUCKET, subjects.prepared_key(node), NodePreparedDevices
            )
            devices = found[0].devices if found else []
            bucket[node] = sorted((d.device, d.claim_uid) for d in devices)
    finally:
        await bus.close()
    return Holdings(allocated, held, cdi, bucket)


async def settled(stack: Stack, claims: int) -> Holdings:
    """Once ``claims`` claims are allocated and every record agrees (KV ``prepared`` is
    written after the answer, in the background); the records then, or the last ones'
    problems on timeout."""
    last: list[Holdings] = []

    async def agreed() -> bool:
        last[:] = [await holdings(stack)]
        return len(last[0].allocated) == claims and not last[0].problems()

    try:
        await until(agreed, f"{claims} claims held exactly once", timeout=60, every=0.5)
        return last[0]
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last[0].problems() if last else '-'}") from None


# ---- the tests ----------------------------------------------------------------------------


async def test_kill_9_of_each_process_while_20_pods_are_created(up: Up) -> None:
    stack = up.stack
    for batch, victim in zip(BATCHES, CREATE_VICTIMS, strict=True):
        stack.cp.apply([pod(name) for name in batch])
        await kill_and_wait_for_restart(up, victim)  # while the batch is allocated, prepared

    await until(lambda: running(stack) == PODS, "20 pods Running", timeout=180, every=0.5)
    found = await settled(stack, claims=20)
    assert found.held == 20
    assert {len(found.checkpoint[H100]), len(found.checkpoint[A100])} != {0}  # both nodes serve
    assert stack.dead() == []
    assert stack.supervisor is not None
    for victim in CREATE_VICTIMS:
        assert stack.supervisor.restarts.get(victim) == 1, stack.supervisor.summary()
        death, restart = reported(up, victim)[:2]
        assert " killed by SIGKILL; restarting it in 1s; log " in death, death
        assert restart.startswith(f"{victim} restarted (pid "), restart
    assert stack.supervisor.restarts == dict.fromkeys(CREATE_VICTIMS, 1), up.said


async def test_kill_9_of_each_process_while_the_20_pods_are_deleted(up: Up) -> None:
    stack = up.stack
    stack.cp.apply([pod(name) for name in PODS])  # as the test before left them
    await until(lambda: running(stack) == PODS, "20 pods Running", timeout=180, every=0.5)
    await settled(stack, claims=20)
    assert stack.supervisor is not None
    before = dict(stack.supervisor.restarts)

    for batch, victim in zip(BATCHES, DELETE_VICTIMS, strict=True):
        stack.cp.kubectl("delete", "pod", *batch, "-n", NS, "--wait=false")
        await kill_and_wait_for_restart(up, victim)  # while the batch is unprepared, released

    await until(lambda: not pods(stack), "the 20 pods gone", timeout=180, every=0.5)
    found = await settled(stack, claims=0)  # their claims deleted, nothing held anywhere
    assert found.held == 0 and found.bucket == {H100: [], A100: []}
    assert found.cdi == {H100: [], A100: []}
    assert stack.dead() == []
    after = stack.supervisor.restarts
    assert {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)} == (
        dict.fromkeys(DELETE_VICTIMS, 1)
    ), up.said


async def test_every_other_process_killed_is_restarted_and_the_stack_serves_on(up: Up) -> None:
    """The control plane, the kubelets, the webhook and the ComputeDomain controller too:
    each restarted by the stack (etcd on its data, the API server on its port and
    certificates), and a pod then runs and goes as before."""
    stack = up.stack
    assert stack.supervisor is not None
    # After the tests above: etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
    # both kubelet-dra, the webhook and the ComputeDomain controller.
    others = [n for n in recorded_pids(stack.workdir) if n not in stack.supervisor.restarts]
    for victim in others:
        await kill_and_wait_for_restart(up, victim)
    assert set(recorded_pids(stack.workdir)) == set(stack.supervisor.restarts)  # every one

    def serving() -> bool:
        try:
            return stack.api_get(f"/api/v1/namespaces/{NS}") is not None
        except OSError:  # the restarted API server not serving yet
            return False

    await until(serving, "the API server back", timeout=60)
    stack.cp.apply([pod("p00"), pod("p01")])  # a GPU and a MIG device, through the webhook
    await until(lambda: running(stack) == ["p00", "p01"], "2 pods Running", timeout=120)
    await settled(stack, claims=2)
    stack.cp.kubectl("delete", "pod", "p00", "p01", "-n", NS, "--wait=false")
    await until(lambda: not pods(stack), "the pods gone", timeout=120, every=0.5)
    await settled(stack, claims=0)
    assert stack.dead() == []


def test_the_stack_says_what_it_restarted(up: Up) -> None:
    """supervision.json counts each restart (what `gpudra up` points to)."""
    status = json.loads((up.stack.workdir / "supervision.json").read_text())
    assert up.stack.supervisor is not None
    assert status["restarts"] == sum(up.stack.supervisor.restarts.values())
    pids = recorded_pids(up.stack.workdir)
    assert set(status["processes"]) == set(pids)
    for name in pids:
        entry = status["processes"][name]
        assert entry["state"] == "running" and entry["pid"] == pids[name], entry
        assert entry["last_exit"] == ("killed by SIGKILL" if entry["restarts"] else ""), entry
