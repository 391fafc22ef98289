"""The chart's API rights on a real kube-apiserver: what each account may not do.

The chart is rendered by real helm (defaults, namespace ``gpudra``); its ServiceAccounts,
ClusterRoles, Roles, bindings and ValidatingAdmissionPolicies are applied to a real API
server (RBAC authorizer, 1.37) with the ComputeDomain CRDs. Each account is then tried
as an attacker who holds its token would (a compromised controller, publisher or node):
``kubectl auth can-i`` tables (the authorizer the requests meet) for what RBAC says, and
real requests with the accounts' own tokens. The preparer's tokens are bound to a pod on
its node, as the node DaemonSet's projected token is.

Skipped where the control plane or helm cannot be built.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from tests.helpers.chartrbac import Account
from tests.helpers.helm import CHART, helm

pytestmark = [pytest.mark.e2e]

NS = "gpudra"
NODE, OTHER = "gb200-0", "gb200-1"  # the preparer's node (its token's) and another
APPLIED = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
           "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # fmt: skip


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
        yield Cluster(cp, kubeconfigs)


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
    # RBAC cannot say which driver's slice or which node (docs/security.md)
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
