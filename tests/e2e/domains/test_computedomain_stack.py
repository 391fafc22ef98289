"""A ComputeDomain's workload pod on a `gpudra up` stack: the whole node path.

One simulated GB200 node (in an NVLink fabric): the controller makes the daemon
DaemonSet, the workload's channel claim labels the node, the DaemonSet's pod runs
(as a local `gpudra imex-daemon run`, services/local/daemonpods.py) and joins, and
only then does the workload's prepare finish, with the IMEX channel in its CDI spec.
Deleting the domain while the pod runs, then the pod, leaves nothing on the node.
Skipped where the control plane cannot be built.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.model import computedomain as cd
from services.local.stack import DRIVER_NAMESPACE, Stack
from services.local.stacknodes import NodeSpec
from services.local.stackprocs import StackError
from services.preparer.computedomain.engine import spec_path
from tests.helpers import domainstack
from tests.helpers.bus import connect
from tests.helpers.events import stored_claim_events
from tests.helpers.stackrun import started_stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
NODE = "gb-node-1"


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[Stack]:
    # A short prepare deadline: a channel claim waits for its daemon, and a daemon that
    # cannot start should fail the test in seconds, not in the plugin's 45.
    s = Stack([NodeSpec(NODE, "gb200-nvl72")], binary=controlplane_binary, prepare_timeout=8.0)
    with started_stack(request, s):
        yield s


def trail(stack: Stack, claim_uid: str) -> list[str]:
    """The claim's events as the CLAIMS stream keeps them, oldest first."""

    async def read() -> list[str]:
        bus = await connect(stack.nats, name="e2e-domains")
        try:
            return [e.event for e in await stored_claim_events(bus) if e.claim.uid == claim_uid]
        finally:
            await bus.close()

    return asyncio.run(read())


def node_label(stack: Stack) -> Any:
    return domainstack.node_label(stack, NODE)


def test_a_workload_pod_runs_once_its_daemon_joined_and_leaves_nothing(stack: Stack) -> None:
    spec = {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}}
    claim = {"name": "ch", "resourceClaimTemplateName": "job-channel"}
    container = {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "ch"}]}}
    worker = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "worker", "namespace": "default"},
              "spec": {"containers": [container], "resourceClaims": [claim]}}  # fmt: skip
    stack.cp.apply({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                    "metadata": {"name": "job", "namespace": "default"}, "spec": spec})  # fmt: skip
    uid = stack.api_get(cd.domains_path("default", "job"))["metadata"]["uid"]
    # The workload template exists before the pod, as a user's job would find it.
    stack.wait_for(
        lambda: stack.api_get(
            "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates/job-channel"
        ),
        "the workload template",
    )
    stack.cp.apply(worker)

    def running() -> dict[str, Any] | None:
        pod = stack.api_get("/api/v1/namespaces/default/pods/worker")
        return pod if pod and pod["status"].get("phase") == "Running" else None

    pod = stack.wait_for(running, "the workload pod Running", timeout=120)
    ids = json.loads(pod["metadata"]["annotations"]["gpudra.dev/cdi-devices"])["c"]
    assert len(ids) == 1 and ids[0].endswith("-channel-0"), ids
    claim_uid = ids[0].partition("=")[2].removesuffix("-channel-0")
    spec_file = spec_path(stack.nodes[NODE].paths.cdi_root, claim_uid)
    nodes = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in nodes] == ["/dev/nvidia-caps-imex-channels/channel0"]
    assert node_label(stack) == uid

    def ready() -> dict[str, Any] | None:  # the controller writes the status in batches
        status = stack.api_get(cd.domains_path("default", "job")).get("status", {})
        return status if status.get("status") == "Ready" else None

    status = stack.wait_for(ready, "the ComputeDomain's status Ready", timeout=30)
    [member] = status["nodes"]
    assert (member["name"], member["status"], member["ipAddress"]) == (NODE, "Ready", "127.0.0.10")
    assert member["cliqueID"]  # a GB200 tray: in a fabric

    # The domain deleted while its workload runs (issue 14's bad input): the daemon and
    # the label go; the running pod keeps its channel until it ends.
    stack.cp.kubectl("delete", "computedomain", "job", "-n", "default", "--timeout=60s")
    stack.wait_for(lambda: node_label(stack) is None, "the node label removed by the controller")
    assert running() is not None
    stack.cp.kubectl("delete", "pod", "worker", "-n", "default", "--timeout=60s")

    def clean() -> bool:
        pods = stack.api_get(f"/api/v1/namespaces/{DRIVER_NAMESPACE}/pods")["items"]
        left = domainstack.domain_files(stack.nodes[NODE])
        return not pods and node_label(stack) is None and not left

    stack.wait_for(clean, "no daemon pod, node label or node driver state left", timeout=60)
    assert stack.daemon_pods is not None
    runner = stack.daemon_pods
    stack.wait_for(lambda: not runner.running, "the local daemon stopped (by its PID)")

    # The channel claim's trail is complete, as a GPU claim's: allocated ... deleted.
    # The kubelet may unprepare after the claim is gone: "unprepared" and "deleted"
    # come in either order.
    try:
        events = stack.wait_for(
            lambda: (
                (found := trail(stack, claim_uid))
                and {"deleted", "unprepared"} <= set(found)
                and found
            ),
            "the channel claim's unprepared and deleted events",
        )
    except StackError as exc:
        raise AssertionError(f"{exc}; its trail: {trail(stack, claim_uid)}") from None
    assert events[0] == "allocated", events
    assert {"prepare.requested", "prepared", "unprepared"} <= set(events), events
