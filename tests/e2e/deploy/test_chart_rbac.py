"""The chart's API rights on a real kube-apiserver: what each account may not do.

The chart is rendered by real helm (defaults, namespace ``gpudra``); its ServiceAccounts,
ClusterRoles, Roles, bindings and ValidatingAdmissionPolicies are applied to a real API
server (RBAC authorizer, 1.37) with the ComputeDomain CRDs. Each account is then tried
as an attacker who holds its token would (a compromised controller, publisher or node):

- ``kubectl auth can-i`` tables (the authorizer the requests meet) for what RBAC says;
- real requests with the accounts' own tokens for what only a policy can say (RBAC
  names resources and verbs, never a field): the preparer's tokens are bound to a pod
  on its node, as the node DaemonSet's projected token is, so the API server puts the
  node in the token's user (``authentication.kubernetes.io/node-name``).

Skipped where the control plane or helm cannot be built.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.core.model import cliques, nvidia
from services.core.model import computedomain as cd
from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from tests.helpers.chartrbac import Account
from tests.helpers.helm import CHART, helm

pytestmark = [pytest.mark.e2e]

NS = "gpudra"
NODE, OTHER = "gb200-0", "gb200-1"  # the preparer's node (its token's) and another
OTHER_DRIVER = "nic.example.com"
APPLIED = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
           "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # fmt: skip
SLICE_POLICY = "ValidatingAdmissionPolicy 'gpudra-publisher-slices'"
NODE_POLICY = "ValidatingAdmissionPolicy 'gpudra-node-patches'"
CORDON = {"spec": {"unschedulable": True}}


def user(component: str) -> str:
    return f"system:serviceaccount:{NS}:gpudra-{component}"


@dataclass
class Cluster:
    cp: ControlPlane
    kubeconfigs: dict[str, Path]  # account (and node) -> a kubeconfig with its token

    def run(self, who: str, *args: str, body: Any = None) -> subprocess.CompletedProcess[str]:
        """kubectl with ``who``'s token (``admin``: the control plane's admin)."""
        config = self.cp.kubeconfig if who == "admin" else self.kubeconfigs[who]
        return subprocess.run(
            [*self.cp.command("kubectl"), "--kubeconfig", str(config), *args],
            input=None if body is None else json.dumps(body),
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def can_i(self, component: str, verb: str, resource: str, namespace: str) -> bool:
        where = ["--all-namespaces"] if namespace == "*" else ["-n", namespace] if namespace else []
        out = self.cp.kubectl("auth", "can-i", verb, resource, *where, f"--as={user(component)}",
                              check=False).strip()  # fmt: skip
        assert out in ("yes", "no"), out
        return out == "yes"

    def patch_node(self, who: str, node: str, body: dict[str, Any]) -> tuple[int, str]:
        """A merge patch of ``node`` with ``who``'s token, as the services send it (kubectl
        would GET the node first, which the controller may not); (HTTP status, message)."""
        token = json.loads(self.kubeconfigs[who].read_text())["users"][0]["user"]["token"]
        request = urllib.request.Request(
            f"{self.cp.server}/api/v1/nodes/{node}", data=json.dumps(body).encode(),
            method="PATCH", headers={"Authorization": f"Bearer {token}",
                                     "Content-Type": "application/merge-patch+json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.cp.ssl_context()) as r:
                return r.status, ""
        except urllib.error.HTTPError as exc:
            return exc.code, str(json.loads(exc.read()).get("message", ""))

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.cp.kubectl_json("get", "node", node)["metadata"].get("labels") or {})


def _slice(name: str, driver: str, node: str | None, pool: str, **spec: Any) -> dict[str, Any]:
    where: dict[str, Any] = {"nodeName": node} if node else {}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
        "spec": {"driver": driver, "pool": {"name": pool, "generation": 0,
                                            "resourceSliceCount": 1},
                 **where, **spec, "devices": [{"name": "dev-0"}]},
    }  # fmt: skip


def _privileged_daemonset(namespace: str) -> dict[str, Any]:
    """What an attacker holding the controller's token makes: root on every node."""
    labels = {"app": "own-every-node"}
    container = {"name": "c", "image": "busybox", "securityContext": {"privileged": True},
                 "volumeMounts": [{"name": "host", "mountPath": "/host"}]}  # fmt: skip
    spec = {"hostPID": True, "hostNetwork": True, "containers": [container],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}  # fmt: skip
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "own-every-node", "namespace": namespace},
        "spec": {"selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": spec}},
    }  # fmt: skip


def _until_refused(cluster: Cluster, who: str, *args: str, body: Any = None) -> None:
    """A policy takes effect a moment after it is created: wait for its first refusal of a
    server-side dry run (nothing is written). Gives up after 60 s (no such policy)."""
    deadline = time.monotonic() + 60
    while cluster.run(who, *args, "--dry-run=server", body=body).returncode == 0:
        if time.monotonic() > deadline:
            return
        time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster(
    controlplane_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    docs = helm(tmp_path_factory.mktemp("helm")).template({}, namespace=NS)
    rbac = [d for d in docs if d["kind"] in APPLIED]
    tmp = tmp_path_factory.mktemp("tokens")
    with ControlPlane(controlplane_binary, nodes=[NODE, OTHER]) as cp:
        for crd in sorted((CHART / "crds").glob("*.yaml")):
            install_crd(cp, crd.read_text())
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        cp.apply(rbac)
        preparer = Account(cp, "gpudra-preparer", NS)
        for node in (NODE, OTHER):  # each node's gpudra pod, which its token is bound to
            spec = {"nodeName": node, "serviceAccountName": preparer.name,
                    "containers": [{"name": "preparer", "image": "gpudra"}]}  # fmt: skip
            meta = {"name": f"gpudra-node-{node}", "namespace": NS}
            cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
        preparer.can("patch", "nodes")
        kubeconfigs = {
            "preparer": preparer.kubeconfig(tmp / "preparer", pod=f"gpudra-node-{NODE}"),
            "preparer-unbound": preparer.kubeconfig(tmp / "preparer-unbound"),
            **{c: Account(cp, f"gpudra-{c}", NS).kubeconfig(tmp / c)
               for c in ("publisher", "domains")},
        }  # fmt: skip
        found = Cluster(cp, kubeconfigs)
        _until_refused(found, "publisher", "create", "-f", "-",
                       body=_slice("probe", OTHER_DRIVER, NODE, NODE))  # fmt: skip
        _until_refused(found, "preparer", "label", "node", OTHER, "probe=1")
        yield found


# --- What RBAC says (kubectl auth can-i) ---------------------------------------------------

# (account, verb, resource, namespace ("" cluster-scoped, "*" every namespace), allowed)
CAN_I = [
    # the controller makes its IMEX DaemonSets and cliques only in the driver's namespace
    ("domains", "create", "daemonsets.apps", "kube-system", False),
    ("domains", "patch", "daemonsets.apps", "kube-system", False),
    ("domains", "delete", "daemonsets.apps", "default", False),
    ("domains", "list", "daemonsets.apps", "*", False),
    ("domains", "create", "computedomaincliques.resource.nvidia.com", "default", False),
    ("domains", "create", "daemonsets.apps", NS, True),
    ("domains", "delete", "daemonsets.apps", NS, True),
    ("domains", "create", "computedomaincliques.resource.nvidia.com", NS, True),
    # RBAC cannot say which driver's slice or which node: the policies below can
    ("publisher", "delete", "resourceslices.resource.k8s.io", "", True),
    ("preparer", "patch", "nodes", "", True),
    ("domains", "patch", "nodes", "", True),
    # nobody but the allocator lists claims; nobody deletes nodes or writes their status
    ("preparer", "list", "resourceclaims.resource.k8s.io", "*", False),
    ("preparer", "update", "nodes/status", "", False),
    ("preparer", "delete", "nodes", "", False),
    ("publisher", "patch", "nodes", "", False),
    ("domains", "delete", "nodes", "", False),
    # open (docs/security.md): RBAC has no field selector, the pods of one node cannot be
    # granted; reads never reach admission
    ("preparer", "list", "pods", "*", True),
]


@pytest.mark.parametrize(
    ("component", "verb", "resource", "namespace", "allowed"),
    CAN_I,
    ids=[f"{c}-{v}-{r.split('.')[0]}-{n or 'cluster'}" for c, v, r, n, _ in CAN_I],
)
def test_auth_can_i_table(
    cluster: Cluster, component: str, verb: str, resource: str, namespace: str, allowed: bool
) -> None:
    assert cluster.can_i(component, verb, resource, namespace) is allowed


def test_the_controllers_token_makes_no_daemonset_outside_the_drivers_namespace(
    cluster: Cluster,
) -> None:
    for namespace in ("kube-system", "default"):
        body = _privileged_daemonset(namespace)
        proc = cluster.run("domains", "create", "-f", "-", "--dry-run=server", body=body)
        assert proc.returncode != 0 and "Forbidden" in proc.stderr, (namespace, proc.stdout)
    proc = cluster.run("domains", "create", "-f", "-", "--dry-run=server",
                       body=_privileged_daemonset(NS))  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # its own namespace: what it is for


# --- What only a policy can say: real requests with the accounts' tokens --------------------


def test_the_publisher_cannot_delete_or_rewrite_another_drivers_slice(cluster: Cluster) -> None:
    theirs = _slice("other-driver", OTHER_DRIVER, OTHER, OTHER)
    assert cluster.run("admin", "create", "-f", "-", body=theirs).returncode == 0
    try:
        proc = cluster.run("publisher", "delete", "resourceslice", "other-driver")
        assert proc.returncode != 0 and SLICE_POLICY in proc.stderr, proc.stdout
        replaced = json.loads(cluster.run("admin", "get", "resourceslice", "other-driver",
                                          "-o", "json").stdout)  # fmt: skip
        replaced["spec"]["devices"] = [{"name": "dev-0"}, {"name": "dev-1"}]
        proc = cluster.run("publisher", "replace", "-f", "-", body=replaced)
        assert proc.returncode != 0 and SLICE_POLICY in proc.stderr, proc.stdout
        assert cluster.cp.get("resourceslice", "other-driver")["spec"]["devices"] == [
            {"name": "dev-0"}
        ]
    finally:
        cluster.run("admin", "delete", "resourceslice", "other-driver", "--ignore-not-found")


@pytest.mark.parametrize(
    ("name", "body", "words"),
    [
        ("another-driver", _slice("x", OTHER_DRIVER, NODE, NODE), "gpudra's drivers"),
        ("all-nodes", _slice("x", nvidia.DRIVER_NAME, None, NODE, allNodes=True), "nodeName"),
        ("node-selector", _slice("x", nvidia.DRIVER_NAME, None, NODE, nodeSelector={
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}), "nodeName"),
        ("foreign-pool", _slice("x", nvidia.DRIVER_NAME, NODE, "shared-pool"), "pool"),
    ],
)  # fmt: skip
def test_the_publisher_creates_only_its_drivers_node_pools(
    cluster: Cluster, name: str, body: dict[str, Any], words: str
) -> None:
    proc = cluster.run("publisher", "create", "-f", "-", body=body)
    cluster.run("admin", "delete", "resourceslice", "x", "--ignore-not-found")
    assert proc.returncode != 0, proc.stdout
    assert SLICE_POLICY in proc.stderr and words in proc.stderr, proc.stderr


def test_the_publisher_writes_and_deletes_its_drivers_node_slices(cluster: Cluster) -> None:
    for driver in (nvidia.DRIVER_NAME, cd.CD_DRIVER):
        name = f"{NODE}-{driver}-0"
        proc = cluster.run("publisher", "create", "-f", "-", body=_slice(name, driver, NODE, NODE))
        assert proc.returncode == 0, proc.stderr
        got = cluster.cp.get("resourceslice", name)
        got["spec"]["devices"] = [{"name": "dev-0"}, {"name": "dev-1"}]
        proc = cluster.run("publisher", "replace", "-f", "-", body=got)
        assert proc.returncode == 0, proc.stderr
        proc = cluster.run("publisher", "delete", "resourceslice", name)
        assert proc.returncode == 0, proc.stderr


def test_a_nodes_preparer_cannot_label_or_cordon_another_node(cluster: Cluster) -> None:
    before = cluster.labels(OTHER)
    for args in (
        ("label", "node", OTHER, f"{cd.DOMAIN_LABEL}=someone-elses"),
        ("label", "node", OTHER, "attacker=1"),
        ("patch", "node", OTHER, "-p", json.dumps(CORDON)),  # what `kubectl cordon` sends
        ("taint", "node", OTHER, "evict=1:NoExecute"),
    ):
        proc = cluster.run("preparer", *args)
        assert proc.returncode != 0 and NODE_POLICY in proc.stderr, (args, proc.stdout)
        assert "bound to (gb200-0), not gb200-1" in proc.stderr, proc.stderr
    assert cluster.labels(OTHER) == before
    assert not cluster.cp.get("node", OTHER)["spec"].get("unschedulable")


def test_a_nodes_preparer_changes_only_the_compute_domain_label_of_its_own_node(
    cluster: Cluster,
) -> None:
    for args in (
        ("label", "node", NODE, "attacker=1"),
        ("label", "node", NODE, "kubernetes.io/hostname=elsewhere", "--overwrite"),
        ("annotate", "node", NODE, "attacker=1"),
        ("patch", "node", NODE, "-p", json.dumps(CORDON)),
        ("taint", "node", NODE, "evict=1:NoExecute"),
    ):
        proc = cluster.run("preparer", *args)
        assert proc.returncode != 0 and NODE_POLICY in proc.stderr, (args, proc.stdout)
    assert "attacker" not in cluster.labels(NODE)
    assert not cluster.cp.get("node", NODE)["spec"].get("unschedulable")
    # what the preparer is for: its own node's domain label, set and taken off
    proc = cluster.run("preparer", "label", "node", NODE, f"{cd.DOMAIN_LABEL}=uid-1")
    assert proc.returncode == 0, proc.stderr
    assert cluster.labels(NODE)[cd.DOMAIN_LABEL] == "uid-1"
    proc = cluster.run("preparer", "label", "node", NODE, f"{cd.DOMAIN_LABEL}-")
    assert proc.returncode == 0, proc.stderr
    assert cd.DOMAIN_LABEL not in cluster.labels(NODE)


def test_a_preparer_token_bound_to_no_node_changes_no_node(cluster: Cluster) -> None:
    proc = cluster.run("preparer-unbound", "label", "node", NODE, f"{cd.DOMAIN_LABEL}=uid-1")
    assert proc.returncode != 0 and NODE_POLICY in proc.stderr, proc.stdout
    assert cd.DOMAIN_LABEL not in cluster.labels(NODE)


def test_the_controller_changes_only_the_compute_domain_label_of_any_node(
    cluster: Cluster,
) -> None:
    for body in (
        {"metadata": {"labels": {"attacker": "1"}}},
        {"metadata": {"labels": {cliques.GPU_CLIQUE_LABEL: "fake"}}},
        {"metadata": {"annotations": {"attacker": "1"}}},
        CORDON,
    ):
        status, message = cluster.patch_node("domains", OTHER, body)
        assert status == 403 and NODE_POLICY in message, (body, status, message)
    for node in (NODE, OTHER):
        got = cluster.patch_node("domains", node, {"metadata": {"labels": {cd.DOMAIN_LABEL: "u"}}})
        assert got == (200, "") and cluster.labels(node)[cd.DOMAIN_LABEL] == "u"
        got = cluster.patch_node("domains", node, {"metadata": {"labels": {cd.DOMAIN_LABEL: None}}})
        assert got == (200, "") and cd.DOMAIN_LABEL not in cluster.labels(node)
    assert "attacker" not in cluster.labels(OTHER)
    assert not cluster.cp.get("node", OTHER)["spec"].get("unschedulable")
