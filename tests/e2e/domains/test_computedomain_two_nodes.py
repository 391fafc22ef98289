"""A two-node ComputeDomain on a `gpudra up` stack: two GB200 trays of one rack.

The domain (numNodes 2) becomes Ready only once both nodes' simulated IMEX daemons
(local `gpudra imex-daemon run`, services/local/daemonpods.py) reach each other;
one workload pod per node, both from the domain's ResourceClaimTemplate, runs with
the IMEX channel in its CDI spec. A daemon killed outright makes the domain
NotReady; restarted as the runner restarts it, Ready again. Deleting the pods, then
the domain, removes everything, the controller's objects in the reference's order
(read back from the API server's history, not timed). Skipped where the control
plane cannot be built.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.core.model import computedomain as cd
from services.imexdaemon import dnsnames
from services.local.stack import DAEMON_ADDRESS_BASE, DRIVER_NAMESPACE, Stack
from services.local.stacknodes import NodeSpec
from services.preparer.computedomain.engine import spec_path
from tests.helpers.domainstack import (
    current_revision,
    deleted_at,
    domain_files,
    history,
    node_label,
)
from tests.helpers.stackrun import started_stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
NODES = ("gb-rack-1", "gb-rack-2")  # one seed: both trays in one NVLink clique
DOMAIN, TEMPLATE, NAMESPACE = "pair", "pair-channel", "default"
CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, controlplane_binary: Path) -> Iterator[Stack]:
    # A short prepare deadline: a channel claim waits for its daemon, and a daemon that
    # cannot start should fail the test in seconds, not in the plugin's 45.
    nodes = [NodeSpec(n, "gb200-nvl72") for n in NODES]
    s = Stack(nodes, binary=controlplane_binary, prepare_timeout=8.0)
    with started_stack(request, s):
        yield s


def worker(index: int) -> dict[str, Any]:
    """One pod of the job on node ``index``, its channel claim from the domain's template."""
    claim = {"name": "ch", "resourceClaimTemplateName": TEMPLATE}
    container = {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "ch"}]}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"worker-{index}", "namespace": NAMESPACE},
            "spec": {"containers": [container], "resourceClaims": [claim],
                     "nodeSelector": {"kubernetes.io/hostname": NODES[index]}}}  # fmt: skip


def domain_status(stack: Stack) -> dict[str, Any]:
    return dict((stack.api_get(cd.domains_path(NAMESPACE, DOMAIN)) or {}).get("status") or {})


def ready_with_both(status: dict[str, Any]) -> bool:
    members = status.get("nodes") or []
    return (
        status.get("status") == "Ready"
        and sorted(m["name"] for m in members) == sorted(NODES)
        and all(m["status"] == "Ready" for m in members)
    )


def test_a_two_node_domain_runs_its_job_survives_a_daemon_crash_and_leaves_nothing(
    stack: Stack,
) -> None:
    runner = stack.daemon_pods
    assert runner is not None
    created_from = current_revision(stack)
    spec = {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": TEMPLATE}}}
    meta = {"name": DOMAIN, "namespace": NAMESPACE}
    stack.cp.apply({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                    "metadata": meta, "spec": spec})  # fmt: skip
    uid = stack.api_get(cd.domains_path(NAMESPACE, DOMAIN))["metadata"]["uid"]
    stack.wait_for(
        lambda: stack.api_get(
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates/{TEMPLATE}"
        ),
        "the workload template",
    )
    for index in range(len(NODES)):
        stack.cp.apply(worker(index))

    def running(name: str) -> dict[str, Any] | None:
        pod = stack.api_get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        return pod if pod and pod["status"].get("phase") == "Running" else None

    # Both pods run, each on its node with the channel device in its claim's CDI spec.
    claim_uids = {}
    for index, node in enumerate(NODES):
        pod = stack.wait_for(
            functools.partial(running, f"worker-{index}"), f"worker-{index} Running", timeout=180
        )
        assert pod["spec"]["nodeName"] == node
        ids = json.loads(pod["metadata"]["annotations"]["gpudra.dev/cdi-devices"])["c"]
        assert len(ids) == 1 and ids[0].endswith("-channel-0"), ids
        claim_uids[node] = ids[0].partition("=")[2].removesuffix("-channel-0")
        spec_file = spec_path(stack.nodes[node].paths.cdi_root, claim_uids[node])
        devices = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["deviceNodes"]
        assert [d["path"] for d in devices] == [CHANNEL]
        assert node_label(stack, node) == uid
    assert len(set(claim_uids.values())) == 2  # one claim per pod, from the one template

    status = stack.wait_for(lambda: ready_with_both(s := domain_status(stack)) and s,
                            "the domain Ready with both nodes", timeout=60)  # fmt: skip
    addresses = {f"127.0.0.{DAEMON_ADDRESS_BASE + i}" for i in range(len(NODES))}
    assert {m["ipAddress"] for m in status["nodes"]} == addresses
    assert len({m["cliqueID"] for m in status["nodes"]}) == 1  # one rack, one clique
    assert sorted(m["index"] for m in status["nodes"]) == [0, 1]
    # Each node's daemon lists every name (nodes.cfg in its /imexd folder) and gives both
    # peers theirs in its pod's hosts file (IMEXDaemonsWithDNSNames, the default).
    for node in NODES:
        folders = stack.nodes[node].paths.kubelet_root / "plugins" / cd.CD_DRIVER / "domains"
        listed = (folders / uid / "nodes.cfg").read_text().split()
        assert listed == [dnsnames.name(i) for i in range(cd.MAX_NODES_PER_IMEX_DOMAIN)]
    hosts = sorted(stack.logs_dir.glob("imex-daemon-*.hosts"))
    assert len(hosts) == len(NODES), hosts
    for path in hosts:
        named = dnsnames.read_hosts(path)
        assert {named[dnsnames.name(i)] for i in range(len(NODES))} == addresses, path
    # ComputeDomainCliques (the default): the clique's object lists both daemons Ready.
    [clique] = {m["cliqueID"] for m in status["nodes"]}
    cliques = (
        f"/apis/resource.nvidia.com/v1beta1/namespaces/{DRIVER_NAMESPACE}/computedomaincliques"
    )
    written = stack.wait_for(
        lambda: (c := stack.api_get(f"{cliques}/{uid}.{clique}"))
        and all(d["status"] == "Ready" for d in c.get("daemons", []))
        and len(c.get("daemons", [])) == len(NODES) and c,
        "the clique object with both daemons Ready", timeout=30,
    )  # fmt: skip
    assert {d["ipAddress"] for d in written["daemons"]} == addresses
    assert [d["index"] for d in written["daemons"]] == [0, 1]

    # Ready only after both daemons saw each other: every status the controller ever
    # wrote that says Ready names both nodes Ready, and NotReady came first.
    writes = [e["object"].get("status") or {} for e in
              history(stack, cd.domains_path(NAMESPACE), created_from)
              if e["object"]["metadata"]["name"] == DOMAIN]  # fmt: skip
    said = [w.get("status") for w in writes if w.get("status")]
    assert said[0] == "NotReady" and "Ready" in said, said
    assert all(ready_with_both(w) for w in writes if w.get("status") == "Ready"), writes

    # A daemon killed outright (its key stays; its peer loses it): NotReady. Restarted
    # as the runner restarts a dead daemon: Ready again, same indices.
    indices = {m["name"]: m["index"] for m in status["nodes"]}
    runner.crash(NODES[1])
    stack.wait_for(lambda: domain_status(stack).get("status") == "NotReady",
                   "the domain NotReady after its daemon died", timeout=60)  # fmt: skip
    runner.recover(NODES[1])
    status = stack.wait_for(lambda: ready_with_both(s := domain_status(stack)) and s,
                            "the domain Ready again after the restart", timeout=60)  # fmt: skip
    assert {m["name"]: m["index"] for m in status["nodes"]} == indices
    assert all(running(f"worker-{i}") for i in range(len(NODES)))

    # The pods go first: their channel claims are unprepared (label, CDI spec,
    # checkpoint entry), so the nodes leave the DaemonSet and the daemons stop.
    stack.cp.kubectl("delete", "pod", "worker-0", "worker-1", "-n", NAMESPACE, "--timeout=90s")
    for node in NODES:
        unlabelled = functools.partial(lambda n: node_label(stack, n) is None, node)
        stack.wait_for(unlabelled, f"{node}'s label gone")

    def daemons_gone() -> bool:
        pods = stack.api_get(f"/api/v1/namespaces/{DRIVER_NAMESPACE}/pods")["items"]
        return not pods and not runner.running

    stack.wait_for(daemons_gone, "the daemon pods and processes gone", timeout=90)

    # Then the domain: the controller deletes the workload template, the DaemonSet,
    # the daemon template, lifts its finalizers, and only then the domain goes.
    deleted_from = current_revision(stack)
    stack.cp.kubectl("delete", "computedomain", DOMAIN, "-n", NAMESPACE, "--timeout=60s")

    def clean() -> list[str]:
        left = [f"{n}: {f}" for n in NODES for f in domain_files(stack.nodes[n])]
        left += [f"{n}: label" for n in NODES if node_label(stack, n) is not None]
        daemon = cd.daemon_name(uid)
        for path in (f"/apis/apps/v1/namespaces/{DRIVER_NAMESPACE}/daemonsets/{daemon}",
                     f"/apis/resource.k8s.io/v1/namespaces/{DRIVER_NAMESPACE}/"
                     f"resourceclaimtemplates/{daemon}",
                     f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/"
                     f"resourceclaimtemplates/{TEMPLATE}"):  # fmt: skip
            if stack.api_get(path) is not None:
                left.append(path)
        return left

    stack.wait_for(lambda: not clean(), "nothing of the domain left", timeout=60)
    assert not clean()
    templates = history(stack, "/apis/resource.k8s.io/v1/resourceclaimtemplates", deleted_from)
    daemonsets = history(stack, "/apis/apps/v1/daemonsets", deleted_from)
    domains = history(stack, cd.domains_path(NAMESPACE), deleted_from)
    order = [
        deleted_at(templates, TEMPLATE),
        deleted_at(daemonsets, cd.daemon_name(uid)),
        deleted_at(templates, cd.daemon_name(uid)),
        deleted_at(templates, cd.daemon_name(uid), gone=True),
        deleted_at(domains, DOMAIN, gone=True),
    ]
    known = [r for r in order if r is not None]
    assert len(known) == len(order) and known == sorted(known), order
