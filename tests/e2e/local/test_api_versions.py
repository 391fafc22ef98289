"""resource.k8s.io versions: the publisher, the claim watcher and the preparer against a
real kube-apiserver (1.35) started to serve only v1beta2, or only v1beta1.

``--runtime-config resource.k8s.io/v1=false,resource.k8s.io/<version>=true``: the
1.35 server starts so and serves that version alone (GET /apis/resource.k8s.io).
Its own scheduler and kubelet speak v1 only, so here the allocation is written
to the claim's status by the test, through the old version, as a 1.32 (v1beta1)
or 1.33 (v1beta2) scheduler would; everything gpudra does is real: discovery
(simulated GPUs), the publisher writing slices, the watcher putting the
allocated claim on the bus, and the preparer checking the claim and its pod
against the API server and preparing it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.bus import subjects
from services.core.bus.access import Role
from services.core.bus.client import Bus
from services.core.kube.resource import ResourceClaim
from services.core.model.schemas import ClaimRef
from services.local.cluster import ControlPlane
from services.local.natsserver import NatsServer
from tests.helpers.preparer import Node

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

NODE = "old-api-node"
GROUP = "/apis/resource.k8s.io"


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gv-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def raw(cp: ControlPlane, path: str) -> Any:
    return json.loads(cp.kubectl("get", "--raw", path))


def claim_body(version: str) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "gpu"}
    exact = {"deviceClassName": "gpu.nvidia.com"}
    if version == "v1beta1":
        request.update(exact)  # v1beta1: the request itself
    else:
        request["exactly"] = exact
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": "old-claim", "namespace": "default"},
        "spec": {"devices": {"requests": [request]}},
    }


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "old-pod", "namespace": "default"},
    "spec": {
        "nodeName": NODE,
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "old-claim"}],
        "containers": [
            {"name": "ctr", "image": "registry.k8s.io/pause:3.10",
             "resources": {"claims": [{"name": "gpu"}]}}
        ],
    },
}  # fmt: skip


async def wait(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
async def test_components_speak_an_older_resource_api(
    version: str, controlplane_binary: Path, root: Path, nats_server: NatsServer, bus: Bus
) -> None:
    cp = ControlPlane(
        controlplane_binary,
        workdir=root / "cp",
        nodes=[NODE],
        runtime_config={"resource.k8s.io/v1": False, f"resource.k8s.io/{version}": True},
    )
    node = Node(root / "node", nats_server, bus, name=NODE, fleet="dgx-h100")
    (root / "node").mkdir()
    try:
        cp.start()
        assert [v["version"] for v in raw(cp, GROUP)["versions"]] == [version]
        kubeconfig = ["--kubeconfig", str(cp.kubeconfig)]
        await node.start_discovery()
        node._spawn("publisher", ["publisher", *nats_server.client_argv(Role.PUBLISHER),
                                  *kubeconfig, "--force-registered"])  # fmt: skip
        node._spawn("allocator", ["allocator", *nats_server.client_argv(Role.ALLOCATOR),
                                  *kubeconfig, "--pending-threshold", "1s"])  # fmt: skip
        await node.start_preparer(claims="none", extra=kubeconfig)

        # The publisher writes the slices in the served version (v1beta1: devices in `basic`).
        slices_path = f"{GROUP}/{version}/resourceslices"
        slices = await wait("the node's slices", lambda: raw(cp, slices_path)["items"])
        devices = [d for s in slices for d in s["spec"]["devices"]]
        assert len(devices) == 8
        if version == "v1beta1":
            assert all(set(d) == {"name", "basic"} for d in devices)
            assert devices[0]["basic"]["attributes"]["type"] == {"string": "gpu"}
        else:
            assert devices[0]["attributes"]["type"] == {"string": "gpu"}

        # A claim in the old version, allocated and reserved as an old scheduler would.
        claims_path = f"{GROUP}/{version}/namespaces/default/resourceclaims"
        cp.kubectl("create", "--raw", claims_path, "-f", "-", input=json.dumps(claim_body(version)))
        pod = json.loads(cp.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(POD)))
        claim = raw(cp, f"{claims_path}/old-claim")
        claim["status"] = {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
                                         "pool": NODE, "device": "gpu-0"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": "old-pod",
                             "uid": pod["metadata"]["uid"]}],
        }  # fmt: skip
        cp.kubectl("replace", "--raw", f"{claims_path}/old-claim/status", "-f", "-",
                   input=json.dumps(claim))  # fmt: skip
        uid = claim["metadata"]["uid"]

        # The watcher read it through the old version and put the v1 model on the bus.
        async def in_bucket() -> ResourceClaim | None:
            found = await bus.kv_get(
                subjects.CLAIMS_BUCKET, subjects.claim_key(NODE, uid), ResourceClaim
            )
            return found[0] if found else None

        stored = await wait("the allocated claim in the claims bucket", in_bucket)
        [request] = stored.spec.devices.requests if stored.spec.devices else []
        assert request.exactly is not None
        assert request.exactly.device_class_name == "gpu.nvidia.com"

        # The preparer checks claim and pod through the old version and prepares it.
        ref = ClaimRef(uid=uid, namespace="default", name="old-claim")
        reply = await node.request("prepare", [ref])
        result = reply.claims[uid]
        assert result.error == ""
        assert [d.cdi_device_ids for d in result.devices] == [
            [f"k8s.gpu.nvidia.com/claim={uid}-gpu-0"]
        ]
        assert (await node.request("unprepare", [ref])).claims[uid].error == ""
        assert node.cdi_files() == []
    finally:
        await node.close()
        cp.stop()
