"""A channel claim's pod binds to a node only once its IMEX domain is Ready there (1.37).

A `gpudra up` stack of two GB200 trays on Kubernetes 1.37, where the scheduler has
binding conditions (DRADeviceBindingConditions, on by default since 1.36): the
publisher puts them on every channel device, the scheduler allocates the claim and
then waits in PreBind, and the ComputeDomain controller labels the node, watches its
IMEX daemon join and sets the claim's condition. Read back from the API server's
history (revisions, nothing timed):

* the pod's ``nodeName`` stays empty, with the scheduler's ``BindingConditionsPending``
  Event, while the claim says why it waits; the bind comes after the claim's
  IMEXDomainReady turned True, and the pod runs with its channel;
* on a node that serves another ComputeDomain the controller sets IMEXDomainFailed:
  the scheduler gives the node up (deallocates the claim) and tries again, the pod
  still unbound; once that node is free, the pod binds there and runs.

Skipped where the control plane cannot be built.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.model import computedomain as cd
from services.local.stack import Stack
from services.local.stacknodes import NodeSpec
from tests.helpers.domainstack import current_revision, history, node_label
from tests.helpers.stackrun import started_stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
NODES = ("gb-bind-1", "gb-bind-2")
NS = "default"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
PODS = f"/api/v1/namespaces/{NS}/pods"


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[Stack]:
    # The kubelet plugin's own prepare deadline (45 s): the channel prepare no longer
    # waits for the daemon, which is Ready before the pod is on the node.
    s = Stack([NodeSpec(n, "gb200-nvl72") for n in NODES], binary=controlplane_binary)
    with started_stack(request, s):
        yield s


def domain(stack: Stack, name: str) -> str:
    spec = {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"}}}
    stack.cp.apply({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                    "metadata": {"name": name, "namespace": NS}, "spec": spec})  # fmt: skip
    template = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates/{name}-channel"
    stack.wait_for(lambda: stack.api_get(template), f"{name}'s workload template")
    return str(stack.api_get(cd.domains_path(NS, name))["metadata"]["uid"])


def worker(stack: Stack, name: str, domain_name: str, node: str) -> None:
    claim = {"name": "ch", "resourceClaimTemplateName": f"{domain_name}-channel"}
    container = {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "ch"}]}}
    stack.cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                    "spec": {"containers": [container], "resourceClaims": [claim],
                             "nodeSelector": {"kubernetes.io/hostname": node}}})  # fmt: skip


def claim_of(stack: Stack, pod: str) -> str | None:
    got = stack.api_get(f"{PODS}/{pod}") or {}
    statuses = (got.get("status") or {}).get("resourceClaimStatuses") or []
    return statuses[0].get("resourceClaimName") if statuses else None


def running(stack: Stack, pod: str) -> dict[str, Any] | None:
    got = stack.api_get(f"{PODS}/{pod}")
    return got if got and got["status"].get("phase") == "Running" else None


def conditions(claim: dict[str, Any]) -> dict[str, dict[str, str]]:
    for entry in (claim.get("status") or {}).get("devices") or []:
        if entry["driver"] == cd.CD_DRIVER:
            return {c["type"]: c for c in entry.get("conditions") or []}
    return {}


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


def bound_at(pods: list[dict[str, Any]], name: str) -> int:
    """The revision at which pod ``name`` got its node (the scheduler's bind)."""
    for event in pods:
        obj = event["object"]
        if obj["metadata"]["name"] == name and obj["spec"].get("nodeName"):
            return rv(obj)
    raise AssertionError(f"{name} never bound")


def unbound_until(pods: list[dict[str, Any]], name: str, revision: int) -> None:
    seen = [e["object"] for e in pods if e["object"]["metadata"]["name"] == name]
    assert seen and all(not o["spec"].get("nodeName") for o in seen if rv(o) < revision)


def pod_events(stack: Stack, pod: str, reason: str) -> list[dict[str, Any]]:
    listing = stack.api_get(f"/api/v1/namespaces/{NS}/events",
                            fieldSelector=f"involvedObject.name={pod},reason={reason}")  # fmt: skip
    return list(listing["items"])


def test_a_pod_binds_only_after_its_domain_is_ready_on_the_node(stack: Stack) -> None:
    since = current_revision(stack)
    uid = domain(stack, "ready-job")
    worker(stack, "ready-0", "ready-job", NODES[0])
    pod = stack.wait_for(lambda: running(stack, "ready-0"), "ready-0 Running", timeout=180)
    assert pod["spec"]["nodeName"] == NODES[0]
    ids = json.loads(pod["metadata"]["annotations"]["gpudra.dev/cdi-devices"])["c"]
    assert len(ids) == 1 and ids[0].endswith("-channel-0"), ids
    assert node_label(stack, NODES[0]) == uid

    claim = claim_of(stack, "ready-0")
    claims = [e["object"] for e in history(stack, CLAIMS, since)
              if e["object"]["metadata"]["name"] == claim]  # fmt: skip
    pods = history(stack, PODS, since)
    allocation = claims[-1]["status"]["allocation"]["devices"]["results"][0]
    assert allocation["bindingConditions"] == [cd.IMEX_DOMAIN_READY]
    ready = [rv(c) for c in claims
             if conditions(c).get(cd.IMEX_DOMAIN_READY, {}).get("status") == "True"]  # fmt: skip
    waited = [c for c in claims
              if conditions(c).get(cd.IMEX_DOMAIN_READY, {}).get("status") == "False"]  # fmt: skip
    bind = bound_at(pods, "ready-0")
    assert ready and ready[0] < bind, (ready, bind)
    # It waited unbound, and the claim said why (the daemon had not joined, or was not
    # Ready yet), before the condition turned True.
    unbound_until(pods, "ready-0", bind)
    assert waited and rv(waited[0]) < ready[0]
    assert conditions(waited[0])[cd.IMEX_DOMAIN_READY]["reason"] in (
        "IMEXDaemonNotJoined", "IMEXDaemonNotReady")  # fmt: skip
    pending = pod_events(stack, "ready-0", "BindingConditionsPending")
    assert pending and NODES[0] in pending[0]["message"], pending
    assert rv(pending[0]) < bind
    stack.cp.kubectl("delete", "pod", "ready-0", "-n", NS, "--timeout=90s")


def test_a_node_of_another_domain_fails_the_binding_and_the_scheduler_retries(
    stack: Stack,
) -> None:
    blocker = domain(stack, "blocker")
    uid = domain(stack, "second-job")
    stack.cp.kubectl("label", "node", NODES[1], f"{cd.DOMAIN_LABEL}={blocker}")
    since = current_revision(stack)
    worker(stack, "second-0", "second-job", NODES[1])

    def failed_twice() -> list[dict[str, Any]] | None:
        """Two allocations of the claim that failed: the scheduler gave the node up once
        and tried again."""
        claim = claim_of(stack, "second-0")
        if claim is None:
            return None
        seen = [e["object"] for e in history(stack, CLAIMS, since)
                if e["object"]["metadata"]["name"] == claim]  # fmt: skip
        stamps = {
            c["status"]["allocation"].get("allocationTimestamp")
            for c in seen
            if (c.get("status") or {}).get("allocation")
            and conditions(c).get(cd.IMEX_DOMAIN_FAILED, {}).get("status") == "True"
        }
        return seen if len(stamps) >= 2 else None

    seen = stack.wait_for(failed_twice, "the binding failed and retried", timeout=180)
    failure = next(conditions(c)[cd.IMEX_DOMAIN_FAILED] for c in seen
                   if cd.IMEX_DOMAIN_FAILED in conditions(c))  # fmt: skip
    assert failure["reason"] == "NodeServesAnotherComputeDomain"
    # Between the two: the scheduler's deallocation (status cleared, devices with it).
    first = next(i for i, c in enumerate(seen) if cd.IMEX_DOMAIN_FAILED in conditions(c))
    assert any(not (c.get("status") or {}).get("allocation") for c in seen[first:])
    pod = stack.api_get(f"{PODS}/second-0")
    assert not pod["spec"].get("nodeName")
    assert node_label(stack, NODES[1]) == blocker  # the other domain keeps its node
    said = [e["message"] for e in pod_events(stack, "second-0", "FailedScheduling")]
    assert any("NodeServesAnotherComputeDomain" in m for m in said), said

    # The node is free again: the next try binds there, after the domain is Ready.
    stack.cp.kubectl("label", "node", NODES[1], f"{cd.DOMAIN_LABEL}-")
    pod = stack.wait_for(lambda: running(stack, "second-0"), "second-0 Running", timeout=180)
    assert pod["spec"]["nodeName"] == NODES[1]
    assert node_label(stack, NODES[1]) == uid
    claim = stack.api_get(f"{CLAIMS}/{claim_of(stack, 'second-0')}")
    assert conditions(claim)[cd.IMEX_DOMAIN_READY]["status"] == "True"
    assert cd.IMEX_DOMAIN_FAILED not in conditions(claim)
    stack.cp.kubectl("delete", "pod", "second-0", "-n", NS, "--timeout=90s")
