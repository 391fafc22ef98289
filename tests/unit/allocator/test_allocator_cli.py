"""``gpudra allocate`` / ``gpudra explain``: exit codes, bad input, explanations.

In-process through ``services.cli.main``; one test runs the real command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import gpudra
from tests.helpers.scenarios import MISSING_CLASS_CLAIMS

GPUDRA = [sys.executable, "-m", "services.cli"]
CLASS = """apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.nvidia.com}
spec:
  selectors:
  - cel:
      expression: >-
        device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"
"""
TYPO_CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: typo, namespace: team}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: device.attributes["gpu.nvidia.com"].productname == "NVIDIA H100 80GB HBM3"
"""


def process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUDRA, *args], capture_output=True, text=True, timeout=120)


def test_explain_suggests_product_name_on_rendered_slices(tmp_path: Path) -> None:
    slices = gpudra("slices", "--fleet", "dgx-h100", "--node", "node-1", "-o", "yaml")
    assert slices.returncode == 0, slices.stderr
    inputs = tmp_path / "in.yaml"
    inputs.write_text(slices.stdout + "\n---\n" + CLASS + "---\n" + TYPO_CLAIM)
    out = gpudra("explain", "-f", str(inputs))
    assert out.returncode == 0, out.stderr
    assert "team/typo: error" in out.stdout
    assert "no such key: productname" in out.stdout
    assert "did you mean 'productName'?" in out.stdout


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("kind: [unclosed", "not valid YAML or JSON"),
        (
            "apiVersion: resource.k8s.io/v1beta1\nkind: DeviceClass\nmetadata: {name: x}\n",
            "document 1: unsupported object apiVersion='resource.k8s.io/v1beta1'",
        ),
        (
            '{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "resource.k8s.io/v1",'
            ' "kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": {"driver": 5}}]}',
            "document 1, item 1: invalid ResourceSlice",
        ),
        (
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\nspec:\n"
            "  driver: d\n  nodeName: n\n  pool: {name: p, generation: 0, resourceSliceCount: 1}\n"
            "  devices: [{name: a, capacity: {memory: {value: 80GB}}}]\n",
            "spec.devices[0].capacity[memory].value",
        ),
    ],
)
def test_invalid_input_exits_2_naming_file_and_document(
    tmp_path: Path, content: str, fragment: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    out = gpudra("allocate", "-f", str(bad))
    assert out.returncode == 2
    assert str(bad) in out.stderr and fragment in out.stderr, out.stderr


def test_unknown_feature_gate_exits_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    out = process("allocate", "-f", str(empty), "--feature-gates", "DRANope=true")
    assert out.returncode == 2 and "unknown feature gate 'DRANope'" in out.stderr
    ok = process("allocate", "-f", str(empty), "-o", "yaml")
    assert ok.returncode == 0 and ok.stdout.strip() == "claims: []"


PRIORITIZED_CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: prioritized, namespace: ns}
spec:
  devices:
    requests:
    - name: gpu
      firstAvailable: [{name: x, deviceClassName: gpu.nvidia.com}]
"""
DISTINCT_CLAIM = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: distinct, namespace: ns}
spec:
  devices:
    requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 2}}]
    constraints: [{distinctAttribute: resource.kubernetes.io/pciBusID}]
"""


@pytest.mark.parametrize(
    ("claim", "gates", "fragment"),
    [
        (
            PRIORITIZED_CLAIM,
            "DRAPrioritizedList=false",
            "spec.devices.requests[0]: Required value: exactly one of `exactly` or "
            "`firstAvailable` is required",
        ),
        (
            DISTINCT_CLAIM,
            "DRAConsumableCapacity=false",
            "spec.devices.constraints[0].matchAttribute: Required value",
        ),
    ],
)
def test_objects_the_api_server_refuses_once_gated_fields_drop_exit_2(
    tmp_path: Path, claim: str, gates: str, fragment: str
) -> None:
    """As kube-apiserver 1.35 on create: the gated field goes, the rest fails validation."""
    inputs = tmp_path / "in.yaml"
    inputs.write_text(CLASS + "---\n" + claim)
    args = ("allocate", "-f", str(inputs), "--kube-version", "1.35", "--feature-gates")
    out = gpudra(*args, gates)
    assert out.returncode == 2, out.stdout
    assert f"{inputs}: document 2: invalid ResourceClaim" in out.stderr
    assert fragment in out.stderr, out.stderr
    assert gpudra(*args, gates.replace("false", "true")).returncode == 0


@pytest.mark.parametrize(
    ("version", "gates", "message"),
    [
        (
            "1.37",
            "DRAPrioritizedList=false",
            "cannot set feature gate DRAPrioritizedList to false, feature is locked to true",
        ),
        ("v1.36.3", "DRAAdminAccess=false", "feature is locked to true (Kubernetes 1.36)"),
        (
            "1.37",
            "DRAConsumableCapacity=false,DRAFractionalCapacityRange=true",
            "DRAFractionalCapacityRange is enabled, but depends on features that are "
            "disabled: [DRAConsumableCapacity]",
        ),
        ("1.35", "DRADeviceTaintRules=true", "depends on features that are disabled"),
        ("1.35", "DRAListTypeAttributes=true", "(it exists from Kubernetes 1.36)"),
        ("1.33", "", "Kubernetes 1.33 is not one gpudra follows"),
        ("one", "", "expected a Kubernetes version like 1.37"),
    ],
)
def test_gates_a_kubernetes_version_refuses_are_refused_as_it_refuses_them(
    tmp_path: Path, version: str, gates: str, message: str
) -> None:
    inputs = tmp_path / "in.yaml"
    inputs.write_text(CLASS)
    out = gpudra("allocate", "-f", str(inputs), "--kube-version", version, "--feature-gates", gates)
    assert out.returncode == 2, out.stdout
    assert message in out.stderr, out.stderr


def test_the_kube_version_comes_from_the_environment_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = tmp_path / "in.yaml"
    inputs.write_text(CLASS + "---\n" + PRIORITIZED_CLAIM)
    args = ("allocate", "-f", str(inputs), "--feature-gates", "DRAPrioritizedList=false")
    assert "locked to true" in gpudra(*args).stderr
    monkeypatch.setenv("GPUDRA_KUBE_VERSION", "1.35")
    out = gpudra(*args)
    assert "invalid ResourceClaim" in out.stderr, out.stderr


def test_a_missing_device_class_leaves_the_claim_unschedulable_not_in_error(
    tmp_path: Path,
) -> None:
    """As kube-scheduler's PreFilter: the class may still be created, so the pod waits."""
    inputs = tmp_path / "in.yaml"
    inputs.write_text(MISSING_CLASS_CLAIMS)
    out = gpudra("allocate", "-f", str(inputs), "-o", "json")
    assert out.returncode == 0, out.stderr
    claims = {c["name"]: c for c in json.loads(out.stdout)["claims"]}
    assert {n: c["status"] for n, c in claims.items()} == {
        "nocls": "unschedulable",
        "sub": "unschedulable",
    }
    messages = [cause["message"] for cause in claims["sub"]["explanation"]["claim"]]
    assert messages == ["request gpu/a: device class missing.example.com does not exist"]
