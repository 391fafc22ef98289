"""A simulated node's runner runs each Running IMEX daemon pod as a local process.

Against a real kube-apiserver and nats-server: a daemon pod as the DaemonSet makes it
and kubelet-dra leaves it (bound here, Running, its claim's CDI ids annotated), the
claim's CDI spec as the node driver writes it; the runner's ``gpudra imex-daemon run``
joins the domain under the node's own bus identity, and leaves it when the pod goes.
Skipped where the control plane cannot be built.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.model import computedomain as cd
from services.core.model.schemas import DomainMember
from services.local.cluster import ControlPlane
from services.local.daemonpods import CDI_ANNOTATION, DaemonNode, DaemonPods
from services.local.natsserver import NatsServer
from services.preparer.computedomain import edits
from services.preparer.computedomain.engine import CDI_VERSION, KIND, spec_path

pytestmark = [pytest.mark.integration, pytest.mark.e2e]
NODE, NAMESPACE = "imex-node", "gpudra"


@pytest.fixture(scope="module")
def apiserver(controlplane_binary: Path) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_binary, nodes=[NODE]) as cp:
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        yield cp


def running_daemon_pod(cp: ControlPlane, domain: str, claim_uid: str) -> dict[str, object]:
    """What the DaemonSet creates and kubelet-dra reports: bound, Running, CDI ids noted."""
    name = f"daemon-{uuid.uuid4().hex[:6]}"
    device = f"{edits.VENDOR}/claim={claim_uid}-{cd.DAEMON_DEVICE}"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NAMESPACE,
                        "labels": {cd.DOMAIN_LABEL: domain},
                        "annotations": {CDI_ANNOTATION: json.dumps(
                            {cd.DAEMON_CONTAINER: [device]})}},
           "spec": {"nodeName": NODE, "containers": [
               {"name": cd.DAEMON_CONTAINER, "image": "gpudra",
                "command": ["gpudra", "imex-daemon", "run"],
                "env": [{"name": "MAX_NODES_PER_IMEX_DOMAIN", "value": "18"}]}]}}  # fmt: skip
    cp.apply(pod)
    created = cp.get("pod", name, NAMESPACE)
    created["status"] = {"phase": "Running"}
    cp.kubectl("replace", "--subresource=status", "-f", "-", input=json.dumps(created))
    return dict(created["metadata"])


def write_spec(cdi_root: Path, claim_uid: str, domain: str, imexd: Path) -> None:
    ref = edits.DomainRef(domain, "job", "team-a")
    container = edits.daemon_edits(ref, "", str(imexd), None, 0)  # outside a fabric
    spec = {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": [
        {"name": f"{claim_uid}-{cd.DAEMON_DEVICE}", "containerEdits": container}]}  # fmt: skip
    cdi_root.mkdir(parents=True, exist_ok=True)
    spec_path(cdi_root, claim_uid).write_bytes(msgspec.json.encode(spec))


def prepared_daemon(
    apiserver: ControlPlane, nats_server: NatsServer, root: Path, address: str
) -> tuple[str, str, Path, DaemonPods]:
    """A daemon claim as the node driver prepares it (its folder and CDI spec), and the
    node's runner: (domain UID, claim UID, the claim's folder, the runner)."""
    domain, claim_uid = str(uuid.uuid4()), str(uuid.uuid4())
    imexd = root / "domains" / domain
    imexd.mkdir(parents=True)
    write_spec(root / "cdi", claim_uid, domain, imexd)
    runner = DaemonPods(
        apiserver.api_get,
        [DaemonNode(NODE, root / "cdi", address)],
        lambda node: nats_server.client_argv(Role.IMEX, node),
        root / "logs",
    )
    return domain, claim_uid, imexd, runner


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + 60
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_a_running_daemon_pod_joins_its_domain_and_leaves_with_its_pod(
    apiserver: ControlPlane, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    domain, claim_uid, _, runner = prepared_daemon(apiserver, nats_server, tmp_path, "127.0.0.2")
    key = subjects.domain_member_key(domain, NODE)

    async def member() -> DomainMember | None:
        got = await bus.kv_get(subjects.DOMAINS_BUCKET, key, DomainMember)
        return got[0] if got else None

    async def joined() -> bool:
        found = await member()
        return found is not None and found.status == "Ready"

    async def left() -> bool:
        return await member() is None and not runner.running

    runner.start()
    try:
        pod = running_daemon_pod(apiserver, domain, claim_uid)
        await until(joined, "the daemon's member key, Ready")
        found = await member()
        assert found is not None
        assert (found.node, found.ip_address, found.clique_id) == (NODE, "127.0.0.2", "")
        assert found.pod == f"{NAMESPACE}/{pod['name']}"
        apiserver.kubectl("delete", "pod", "-n", NAMESPACE, str(pod["name"]), "--wait=false")
        await until(left, "the daemon stopped and its key gone")
    finally:
        runner.stop()


async def test_a_daemon_whose_claim_folder_went_is_stopped_and_not_started_again(
    apiserver: ControlPlane, nats_server: NatsServer, bus: Bus, tmp_path: Path
) -> None:
    """The claim unprepared while the pod still says Running (the kubelet stops the
    container first; kubelet-dra does not): no daemon runs on without its mount."""
    domain, claim_uid, imexd, runner = prepared_daemon(
        apiserver, nats_server, tmp_path, "127.0.0.3"
    )
    runner.start()
    try:
        running_daemon_pod(apiserver, domain, claim_uid)

        async def started() -> bool:
            return bool(runner.running)

        await until(started, "the daemon started")
        imexd.rmdir()

        async def stopped() -> bool:
            return not runner.running

        await until(stopped, "the daemon stopped")
        runner.sync()  # another pass: nothing starts again
        assert not runner.running and not imexd.exists()
    finally:
        runner.stop()
