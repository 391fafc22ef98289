"""The chart's fallback ValidatingAdmissionPolicy on the real 1.35 API server.

With the webhook off the chart renders a ValidatingAdmissionPolicy; applied to a
real kube-apiserver it must compile (CEL reads opaque.parameters as dynamic
JSON) and refuse, with a message naming the field, every one of the ten bad
configs the webhook refuses (tests/helpers/badconfigs.py) and bad
compute-domain configs, and admit good ones.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.local.cluster import ControlPlane
from tests.helpers import badconfigs
from tests.helpers.helm import helm

pytestmark = [pytest.mark.e2e]

API = badconfigs.API
CHANNEL = "ComputeDomainChannelConfig"

#: The field each bad config's refusal names (the policy's messages carry no index).
FIELDS = {
    "strategy": "sharing.strategy",
    "interval": "timeSlicingConfig.interval",
    "threads": "defaultActiveThreadPercentage",
    "threadtype": "defaultActiveThreadPercentage",
    "pinned": "defaultPinnedDeviceMemoryLimit",
    "mixed": "mpsConfig is not allowed with strategy TimeSlicing",
    "unknownfield": "opaque.parameters: unknown field",
    "kind": "opaque.parameters.kind",
    "apiversion": "opaque.parameters.apiVersion",
    "iommu": "iommu.backendPolicy",
}


@pytest.fixture(scope="module")
def cluster(
    controlplane_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    gates = dict(item.split("=") for item in badconfigs.GATES.split(","))
    docs = helm(tmp_path_factory.mktemp("helm")).template(
        {"featureGates": {k: v == "true" for k, v in gates.items()}}, namespace="gpu"
    )
    policy = [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")
              and d["metadata"]["name"] == "gpudra-opaque-configs"]  # fmt: skip
    assert len(policy) == 2
    with ControlPlane(controlplane_binary, runtime_config={"resource.k8s.io/v1beta1": True}) as cp:
        cp.apply(badconfigs.claim("default", "from-before", badconfigs.BAD[0][1]))
        cp.apply(policy)
        yield cp
    cp.cleanup()


def apply(cp: ControlPlane, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cp.command("kubectl"), "--kubeconfig", str(cp.kubeconfig), "create", "-f", "-"],
        input=json.dumps(obj), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def refused_until_ready(cp: ControlPlane, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """The policy takes effect a moment after it is created: wait for the first refusal."""
    deadline = time.monotonic() + 60
    while True:
        proc = apply(cp, obj)
        if proc.returncode != 0 or time.monotonic() > deadline:
            return proc
        cp.kubectl("delete", "-f", "-", input=json.dumps(obj))
        time.sleep(0.5)


@pytest.mark.parametrize(
    ("name", "params", "words"), badconfigs.BAD, ids=[c[0] for c in badconfigs.BAD]
)
def test_each_bad_config_is_refused_naming_its_field(
    cluster: ControlPlane, name: str, params: dict[str, Any], words: str
) -> None:
    version = "v1beta1" if name == "threads" else "v1"
    proc = refused_until_ready(cluster, badconfigs.claim("default", f"bad-{name}", params, version))
    assert proc.returncode != 0, proc.stdout
    assert "ValidatingAdmissionPolicy 'gpudra-opaque-configs'" in proc.stderr, proc.stderr
    assert FIELDS[name] in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"apiVersion": API, "kind": CHANNEL}, "domainID: must not be empty"),
        (
            {"apiVersion": API, "kind": CHANNEL, "domainID": "d", "allocationMode": "Some"},
            "allocationMode: unknown allocation mode",
        ),
        ({"apiVersion": API, "kind": "GpuConfig"}, "compute-domain.nvidia.com takes"),
    ],
)
def test_bad_compute_domain_configs_are_refused(
    cluster: ControlPlane, params: dict[str, Any], words: str
) -> None:
    obj = badconfigs.claim("default", "bad-cd", params)
    obj["spec"]["devices"]["config"][0]["opaque"]["driver"] = "compute-domain.nvidia.com"
    proc = refused_until_ready(cluster, obj)
    assert proc.returncode != 0 and words in proc.stderr, proc.stderr


def test_good_configs_and_templates_are_admitted(cluster: ControlPlane) -> None:
    mps = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}
    good = {
        "apiVersion": API,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": mps},
    }
    assert apply(cluster, badconfigs.claim("default", "good", good)).returncode == 0
    # Read as the reference's decoder reads them (resource.Quantity, Go's null string).
    as_go = [
        {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultPinnedDeviceMemoryLimit": 1.5e9}}},
        {"apiVersion": API, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultPinnedDeviceMemoryLimit": " 2Gi "}}},
        {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": None}},
    ]  # fmt: skip
    for i, params in enumerate(as_go):
        proc = apply(cluster, badconfigs.claim("default", f"as-go-{i}", params))
        assert proc.returncode == 0, (params, proc.stderr)
    channel = {"apiVersion": API, "kind": CHANNEL, "domainID": "5f0c", "allocationMode": "All"}
    cd = badconfigs.claim("default", "good-cd", channel)
    cd["spec"]["devices"]["config"][0]["opaque"]["driver"] = "compute-domain.nvidia.com"
    assert apply(cluster, cd).returncode == 0
    unset = badconfigs.claim("default", "good-cd-unset", {**channel, "allocationMode": ""})
    unset["spec"]["devices"]["config"][0]["opaque"]["driver"] = "compute-domain.nvidia.com"
    assert apply(cluster, unset).returncode == 0
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": "default", "name": "bad-template"},
        "spec": {"spec": badconfigs.claim("default", "x", badconfigs.BAD[0][1])["spec"]},
    }
    proc = apply(cluster, template)
    assert proc.returncode != 0 and "sharing.strategy" in proc.stderr, proc.stderr


def test_a_claim_from_before_the_policy_can_still_be_updated(cluster: ControlPlane) -> None:
    """Finalizers and labels of a claim admitted before the policy are not judged."""
    refused_until_ready(cluster, badconfigs.claim("default", "probe", badconfigs.BAD[0][1]))
    cluster.kubectl("label", "resourceclaim", "from-before", "touched=yes")
    assert cluster.kubectl_json("get", "resourceclaim", "from-before")["metadata"]["labels"] == {
        "touched": "yes"
    }
