"""Consumable shares end to end: DRAConsumableCapacity on in the real control plane.

The API server, scheduler, controller manager and kubelet-dra run with
``DRAConsumableCapacity``; gpudra's publisher and preparer with
``ConsumableShares`` and ``--consumable-shares memory``. examples/shares/ puts
three pods on one H100 by memory (20Gi, 20Gi, 39Gi); a fourth (8Gi) stays
pending with gpudra's explanation; deleting pods releases their shares, and
the GPU's one MPS daemon stops with the last of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.local import demo, demoexamples, demoview
from services.local.stack import DEMO_GATES, Stack
from services.local.stacknodes import NodeSpec
from services.preparer import cdi
from services.preparer.devices.simclient import SimCudaError, SimMpsClient
from tests.helpers.stackrun import started_stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

H100 = "gpu-node-h100"
SHARES = demoexamples.EXAMPLES_DIR / "shares"
NS = "shares"
GIB = 1024**3


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[Stack]:
    s = Stack(
        [NodeSpec(H100, "dgx-h100")],
        binary=controlplane_binary,
        gates=f"{DEMO_GATES},ConsumableShares=true",
        kube_feature_gates={"DRAConsumableCapacity": True},
        pending_threshold=1.0,
    )
    s.service_env["GPUDRA_CONSUMABLE_SHARES"] = "memory"  # publisher and preparer
    s.service_env["GPUDRA_KUBE_FEATURE_GATES"] = "DRAConsumableCapacity=true"  # the allocator
    with started_stack(request, s):
        yield s


def sim_host(stack: Stack) -> dict[str, Any]:
    path = stack.nodes[H100].paths.plugin_dir / "simulated-host.json"
    return json.loads(path.read_text()) if path.exists() else {}


def claim_of_pod(stack: Stack, pod: str) -> dict[str, Any]:
    body = stack.api_get(f"/api/v1/namespaces/{NS}/pods/{pod}")
    [ref] = demoview.pod_claim_names(body)
    return stack.api_get(f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{ref}")  # type: ignore[no-any-return]


def test_three_pods_share_one_h100_a_fourth_waits_and_shares_are_released(stack: Stack) -> None:
    [three] = demoexamples.load_examples(SHARES)[:1]
    four = demoexamples.load_example(SHARES / "02-one-too-many.yaml")
    slices = stack.slices(H100)
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    gpus_published = [d for d in devices if d["attributes"]["type"]["string"] == "gpu"]
    assert len(gpus_published) == 8
    assert all(d.get("allowMultipleAllocations") for d in gpus_published)
    # VFIO twins are whole devices: never shared
    assert not any(d.get("allowMultipleAllocations") for d in devices if d not in gpus_published)
    policy = gpus_published[0]["capacity"]["memory"]["requestPolicy"]
    assert policy["validRange"] == {"min": "1Mi", "max": "81559Mi", "step": "1Mi"}

    demo.apply_examples(stack, [three])
    result = demo.wait_for_examples(stack, [three], timeout=90)
    assert result.ok, [(v.pod.name, v.phase, v.problems) for v in result.pods]

    # One GPU, three shares, each with its own limits in its container's CDI env.
    gpus, limits = set(), {}
    spec_by_uid: dict[str, Any] = {}
    for view in result.pods:
        claim = claim_of_pod(stack, view.pod.name)
        [r] = claim["status"]["allocation"]["devices"]["results"]
        assert r["shareID"] and r["consumedCapacity"]["memory"]
        gpus.add(r["device"])
        uid = claim["metadata"]["uid"]
        cdi_id = cdi.device_id(uid, r["device"], r["shareID"])
        assert view.cdi_devices == {"ctr": [cdi_id]}
        path = cdi.spec_path(stack.nodes[H100].paths.cdi_root, uid)
        spec_by_uid[uid] = json.loads(path.read_text())
        client = SimMpsClient.from_cdi(
            stack.nodes[H100].paths.plugin_dir, spec_by_uid[uid], cdi_id.partition("=")[2]
        )
        limits[view.pod.name] = client.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].split("=")[1]
        [uuid] = client.daemon.device_uuids
        with pytest.raises(SimCudaError, match="OUT_OF_MEMORY"):
            client.allocate(uuid, int(r["consumedCapacity"]["memory"].removesuffix("Gi")) * GIB + 1)
    assert gpus == {"gpu-0"}
    assert limits == {"share-a": "20480M", "share-b": "20480M", "share-c": "39936M"}
    assert [k for k in sim_host(stack)["mps"] if k.startswith("shared-")] == [f"shared-{uuid}"]

    # The fourth does not fit; gpudra says why on the claim.
    demo.apply_examples(stack, [four])
    pending = demo.wait_for_examples(stack, [four], timeout=90)
    views = [(v.pod.name, v.phase, [c.explanation for c in v.claims]) for v in pending.pods]
    assert pending.ok, views
    explanation = pending.pods[0].claims[0].explanation
    print("explanation:", explanation)
    assert "1 device(s): not enough capacity left" in explanation

    # Deleting a pod releases its share: the fourth fits in what it left.
    stack.cp.kubectl("delete", "pod", "-n", NS, "share-a", "--wait=false")
    stack.wait_for(
        lambda: (
            (stack.api_get(f"/api/v1/namespaces/{NS}/pods/share-d") or {})
            .get("status", {})
            .get("phase")
            == "Running"
        ),
        "share-d running once share-a is gone",
        timeout=90,
    )
    assert list(sim_host(stack)["mps"]) == [f"shared-{uuid}"]

    # The last share stops the daemon and restores the compute mode.
    stack.cp.kubectl("delete", "namespace", NS, "--wait=false")
    stack.wait_for(
        lambda: not stack.api_get(f"/api/v1/namespaces/{NS}/pods")["items"],
        "the shares' pods gone",
        timeout=90,
    )
    stack.wait_for(
        lambda: sim_host(stack).get("mps") == {}, "the shared MPS daemon stopped", timeout=60
    )
    assert sim_host(stack).get("compute_mode") == {}
    assert not list(stack.nodes[H100].paths.cdi_root.glob("*.yaml"))
