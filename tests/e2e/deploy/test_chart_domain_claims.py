"""ComputeDomain devices only for their domain, at admission on a real kube-apiserver.

Every node publishes one ``channel-0`` and one ``daemon-0`` (compute-domain.nvidia.com);
a claim that holds them for a domain that is not the claimant's keeps that node from the
real domain. The chart is rendered by real helm with ``webhook.enabled``; its accounts,
roles, bindings and ValidatingAdmissionPolicies are applied to a real API server with the
ComputeDomain CRDs, and the real ``gpudra webhook`` process (as the chart runs it: its
own account's token, ``GPUDRA_COMPUTE_DOMAINS``) is called by the API server through a
ValidatingWebhookConfiguration (URL + caBundle, as ``gpudra up`` registers it).

The attacker is a tenant with a Role for claims and templates in its own namespace
(tokens of its own ServiceAccount). Skipped where the control plane or helm cannot be
built.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.core.model import computedomain as cd
from services.local import admission
from services.local.cluster import ControlPlane
from services.local.clusteradmin import install_crd
from services.local.ports import free_port
from tests.helpers import badconfigs
from tests.helpers.chartrbac import Account
from tests.helpers.helm import CHART, helm

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[3]
NS, TENANT, OTHER = "gpudra", "tenant", "other-team"
APPLIED = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
           "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # fmt: skip
POLICY = "ValidatingAdmissionPolicy 'gpudra-compute-domain-claims'"
WEBHOOK = f'admission webhook "{admission.WEBHOOK}" denied the request'
MADE_UP = "6b1c2f0e-dead-4bee-8f00-000000000001"


def _config(kind: str, domain: str, requests: list[str] | None = None) -> dict[str, Any]:
    params = {"apiVersion": badconfigs.API, "kind": kind, "domainID": domain}
    entry: dict[str, Any] = {"opaque": {"driver": cd.CD_DRIVER, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def claim(
    namespace: str, name: str, device_class: str, configs: list[dict[str, Any]],
    template: bool = False,
) -> dict[str, Any]:  # fmt: skip
    request = cd.CHANNEL_REQUEST if device_class == cd.CHANNEL_CLASS else cd.DAEMON_REQUEST
    spec = {"devices": {"requests": [{"name": request,
                                      "exactly": {"deviceClassName": device_class}}],
                        "config": configs}}  # fmt: skip
    meta = {"name": name, "namespace": namespace}
    if template:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": meta, "spec": {"spec": spec}}  # fmt: skip
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": spec}  # fmt: skip


def channel(namespace: str, name: str, domain: str, template: bool = False) -> dict[str, Any]:
    return claim(namespace, name, cd.CHANNEL_CLASS, [_config(cd.CHANNEL_CONFIG, domain)], template)


def daemon(namespace: str, name: str, domain: str, template: bool = False) -> dict[str, Any]:
    return claim(namespace, name, cd.DAEMON_CLASS, [_config(cd.DAEMON_CONFIG, domain)], template)


@dataclass
class Cluster:
    cp: ControlPlane
    kubeconfigs: dict[str, Path]
    domains: dict[str, str]  # namespace -> the UID of its ComputeDomain

    def create(self, who: str, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """``kubectl create`` of ``obj`` with ``who``'s token; what it made is deleted."""
        config = self.cp.kubeconfig if who == "admin" else self.kubeconfigs[who]
        proc = subprocess.run(
            [*self.cp.command("kubectl"), "--kubeconfig", str(config), "create", "-f", "-"],
            input=json.dumps(obj), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if proc.returncode == 0:
            kind, meta = obj["kind"].lower(), obj["metadata"]
            self.cp.kubectl("delete", kind, meta["name"], "-n", meta["namespace"], "--wait=false")
        return proc


def _until_refused(cluster: Cluster, who: str, obj: dict[str, Any]) -> None:
    """Policies and webhook configurations take effect a moment after they are created."""
    deadline = time.monotonic() + 60
    while cluster.create(who, obj).returncode == 0 and time.monotonic() < deadline:
        time.sleep(0.5)


@contextlib.contextmanager
def _webhook(
    cp: ControlPlane, tmp: Path, kubeconfig: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    """``gpudra webhook`` as the chart's Deployment runs it (its env), on 127.0.0.1."""
    certs = admission.issue(tmp / "certs")
    port = free_port()
    argv = [sys.executable, "-m", "services.cli", "webhook", "--cert-file", str(certs.cert),
            "--key-file", str(certs.key), "--port", str(port)]  # fmt: skip
    env = {**os.environ, **env, "GPUDRA_KUBECONFIG": str(kubeconfig)}
    with open(tmp / "webhook.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while b"serving admission reviews" not in (tmp / "webhook.log").read_bytes():
            assert proc.poll() is None, (tmp / "webhook.log").read_text()
            assert time.monotonic() < deadline, "webhook not serving in 60 s"
            time.sleep(0.1)
        url = f"https://127.0.0.1:{port}{admission.PATH}"
        cp.apply(admission.configuration(url, certs.ca.read_bytes()))
        yield proc
        assert proc.poll() is None, "the webhook died"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture(scope="module")
def cluster(
    controlplane_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    docs = helm(tmp_path_factory.mktemp("helm")).template({"webhook.enabled": True}, namespace=NS)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"
                     and d["metadata"]["name"] == "gpudra-webhook"]  # fmt: skip
    chart_env = {v["name"]: v["value"] for v in
                 deployment["spec"]["template"]["spec"]["containers"][0]["env"]
                 if v["name"] in ("GPUDRA_COMPUTE_DOMAINS", "GPUDRA_NAMESPACE",
                                  "GPUDRA_DOMAINS_ACCOUNT")}  # fmt: skip
    tmp = tmp_path_factory.mktemp("domain-claims")
    with ControlPlane(controlplane_binary, runtime_config={"resource.k8s.io/v1beta1": True}) as cp:
        for crd in sorted((CHART / "crds").glob("*.yaml")):
            install_crd(cp, crd.read_text())
        for ns in (NS, TENANT, OTHER):
            cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        cp.apply([d for d in docs if d["kind"] in APPLIED])
        rules = [{"apiGroups": ["resource.k8s.io"],
                  "resources": ["resourceclaims", "resourceclaimtemplates"],
                  "verbs": ["create", "get", "list", "delete"]}]  # fmt: skip
        cp.apply([
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "tenant", "namespace": TENANT}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "claims", "namespace": TENANT}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "claims", "namespace": TENANT},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": "claims"},
             "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": TENANT}]},
        ])  # fmt: skip
        tenant = Account(cp, "tenant", TENANT)
        tenant.can("create", "resourceclaims.resource.k8s.io", namespace=TENANT)
        kubeconfigs = {
            "tenant": tenant.kubeconfig(tmp / "tenant"),
            "domains": Account(cp, "gpudra-domains", NS).kubeconfig(tmp / "domains"),
        }
        domains = {}
        for ns in (TENANT, OTHER):
            spec = {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "cd-channel"}}}
            body = {"apiVersion": f"{cd.GROUP}/{cd.VERSION}", "kind": cd.KIND,
                    "metadata": {"name": "cd", "namespace": ns}, "spec": spec}  # fmt: skip
            cp.apply(body)
            domains[ns] = cp.get(cd.PLURAL, "cd", ns)["metadata"]["uid"]
        hook_config = Account(cp, "gpudra-webhook", NS).kubeconfig(tmp / "webhook")
        with _webhook(cp, tmp, hook_config, chart_env):
            found = Cluster(cp, kubeconfigs, domains)
            _until_refused(found, "tenant", badconfigs.claim(TENANT, "probe", badconfigs.BAD[0][1]))
            _until_refused(found, "tenant", claim(TENANT, "probe", cd.DAEMON_CLASS, []))
            yield found


# --- The tenant's attacks ---------------------------------------------------------------


@pytest.mark.parametrize("template", [False, True], ids=["claim", "template"])
def test_a_tenant_cannot_claim_a_channel_for_a_domain_that_does_not_exist(
    cluster: Cluster, template: bool
) -> None:
    proc = cluster.create("tenant", channel(TENANT, "made-up", MADE_UP, template))
    assert proc.returncode != 0 and WEBHOOK in proc.stderr, proc.stdout
    assert f"no ComputeDomain with UID {MADE_UP} in namespace {TENANT}" in proc.stderr


def test_a_tenant_cannot_claim_a_channel_of_another_namespaces_domain(cluster: Cluster) -> None:
    theirs = cluster.domains[OTHER]
    proc = cluster.create("tenant", channel(TENANT, "theirs", theirs))
    assert proc.returncode != 0 and WEBHOOK in proc.stderr, proc.stdout
    assert f"ComputeDomain {theirs} is in namespace {OTHER}, not {TENANT}" in proc.stderr


@pytest.mark.parametrize("device_class", [cd.CHANNEL_CLASS, cd.DAEMON_CLASS])
def test_a_tenant_cannot_hold_a_nodes_device_without_naming_a_domain(
    cluster: Cluster, device_class: str
) -> None:
    proc = cluster.create("tenant", claim(TENANT, "bare", device_class, []))
    assert proc.returncode != 0 and POLICY in proc.stderr, proc.stdout
    assert "needs a" in proc.stderr, proc.stderr


def test_a_tenant_cannot_claim_a_daemon_even_of_its_own_domain(cluster: Cluster) -> None:
    mine = cluster.domains[TENANT]
    for template in (False, True):
        proc = cluster.create("tenant", daemon(TENANT, "daemon", mine, template))
        assert proc.returncode != 0 and POLICY in proc.stderr, proc.stdout
        assert f"only in the driver's namespace {NS}" in proc.stderr, proc.stderr


def test_a_channel_request_with_a_daemon_config_is_refused(cluster: Cluster) -> None:
    mine = cluster.domains[TENANT]
    obj = claim(TENANT, "mixed", cd.CHANNEL_CLASS, [_config(cd.DAEMON_CONFIG, mine)])
    proc = cluster.create("tenant", obj)
    assert proc.returncode != 0 and POLICY in proc.stderr, proc.stdout


def test_daemon_templates_only_from_the_controller(cluster: Cluster) -> None:
    mine = cluster.domains[TENANT]
    name = cd.daemon_name(mine)
    proc = cluster.create("admin", daemon(NS, name, mine, template=True))
    assert proc.returncode != 0 and POLICY in proc.stderr, proc.stdout
    assert "only the ComputeDomain controller" in proc.stderr, proc.stderr
    proc = cluster.create("domains", daemon(NS, name, MADE_UP, template=True))
    assert proc.returncode != 0 and WEBHOOK in proc.stderr, proc.stdout
    assert f"no ComputeDomain with UID {MADE_UP}" in proc.stderr, proc.stderr


def test_every_served_version_and_subrequest_is_judged(cluster: Cluster) -> None:
    """The policy judges v1 (matchPolicy Equivalent: a v1beta1 write is converted)."""
    old_api = claim(TENANT, "old-api", cd.DAEMON_CLASS, [])
    old_api["apiVersion"] = "resource.k8s.io/v1beta1"
    old_api["spec"]["devices"]["requests"] = [{"name": "daemon",
                                               "deviceClassName": cd.DAEMON_CLASS}]  # fmt: skip
    proc = cluster.create("tenant", old_api)
    assert proc.returncode != 0 and POLICY in proc.stderr and "needs a" in proc.stderr, proc.stdout
    alternatives = [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"},
                    {"name": "ch", "deviceClassName": cd.CHANNEL_CLASS}]  # fmt: skip
    sub = claim(TENANT, "sub", cd.CHANNEL_CLASS, [])
    sub["spec"]["devices"]["requests"] = [{"name": "r", "firstAvailable": alternatives}]
    proc = cluster.create("tenant", sub)
    assert proc.returncode != 0 and POLICY in proc.stderr and "needs a" in proc.stderr, proc.stdout
    sub["spec"]["devices"]["config"] = [_config(cd.CHANNEL_CONFIG, MADE_UP, ["r/ch"])]
    proc = cluster.create("tenant", sub)
    assert proc.returncode != 0 and WEBHOOK in proc.stderr, proc.stdout
    assert "(request r/ch)" in proc.stderr, proc.stderr
    sub["spec"]["devices"]["config"] = [_config(cd.CHANNEL_CONFIG, cluster.domains[TENANT],
                                                ["r/ch"])]  # fmt: skip
    proc = cluster.create("tenant", sub)
    assert proc.returncode == 0, proc.stderr


# --- What the driver itself makes is admitted -------------------------------------------


def test_the_controllers_templates_and_the_claims_made_from_them_are_admitted(
    cluster: Cluster,
) -> None:
    mine = cluster.domains[TENANT]
    # the controller: the daemon template in the driver's namespace, the workload template
    # in the domain's
    proc = cluster.create("domains", daemon(NS, cd.daemon_name(mine), mine, template=True))
    assert proc.returncode == 0, proc.stderr
    proc = cluster.create("domains", channel(TENANT, "cd-channel", mine, template=True))
    assert proc.returncode == 0, proc.stderr
    # the claims the resource claim controller makes from them (here the admin)
    proc = cluster.create("admin", daemon(NS, "daemon-pod-claim", mine))
    assert proc.returncode == 0, proc.stderr
    # a tenant's own channel claim of its own domain
    proc = cluster.create("tenant", channel(TENANT, "mine", mine))
    assert proc.returncode == 0, proc.stderr
