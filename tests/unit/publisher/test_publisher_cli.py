"""``gpudra slices`` and ``gpudra publisher`` through the real command entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli import main
from services.core.model import deviceattrs, featuregates, nvidia
from services.offline import slicecheck
from tests.helpers.cli import gpudra

REPO = Path(__file__).resolve().parents[3]
FULL_GPU_ATTRIBUTES = {
    "type",
    "uuid",
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "resource.kubernetes.io/pciBusID",
    "resource.kubernetes.io/pcieRoot",
}


def _slices(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert main(["slices", *args, "-o", "json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["kind"] == "List"
    return list(listing["items"])


def _devices(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in items for d in s["spec"].get("devices", [])}


def test_dgx_h100_prints_eight_full_gpus_with_every_attribute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    items = _slices(capsys, "--fleet", "dgx-h100", "--node", "n1")
    (s,) = items
    assert (s["apiVersion"], s["kind"]) == ("resource.k8s.io/v1", "ResourceSlice")
    assert s["spec"]["driver"] == "gpu.nvidia.com" and s["spec"]["nodeName"] == "n1"
    assert s["spec"]["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    devices = _devices(items)
    assert list(devices) == [f"gpu-{i}" for i in range(8)]
    for device in devices.values():
        assert FULL_GPU_ATTRIBUTES <= set(device["attributes"])
        assert device["attributes"]["type"] == {"string": "gpu"}
        assert device["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
        assert device["attributes"]["driverVersion"]["version"].count(".") == 2
        assert device["attributes"]["uuid"]["string"].startswith("GPU-")
        assert device["capacity"] == {"memory": {"value": "81559Mi"}}
    assert not slicecheck.check_pool(items)


def test_dgx_a100_shows_mig_devices_instead_of_gpus_in_mig_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    devices = _devices(_slices(capsys, "--fleet", "dgx-a100", "--node", "n1"))
    assert {"gpu-0", "gpu-1", "gpu-2", "gpu-3"} <= set(devices)
    assert not {"gpu-4", "gpu-5", "gpu-6", "gpu-7"} & set(devices)
    migs = {n: d for n, d in devices.items() if "-mig-" in n}
    assert "gpu-4-mig-3g20gb-9-0" in migs and "gpu-7-mig-1g5gb-me-20-6" in migs
    for name, device in migs.items():
        attrs = device["attributes"]
        assert attrs["type"] == {"string": "mig"} and attrs["uuid"]["string"].startswith("MIG-")
        assert attrs["parentUUID"]["string"].startswith("GPU-")
        parsed = nvidia.parse_device_name(name)
        assert parsed.profile_token == nvidia.profile_token(attrs["profile"]["string"])
        assert {"multiprocessors", "copyEngines", "memory"} <= set(device["capacity"])
        assert any(k.startswith("memorySlice") for k in device["capacity"])


def test_numa_node_of_every_device_comes_from_the_fleet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """dgx-h100: GPUs 0-3 on socket 0, 4-7 on socket 1; MIG devices carry their parent's."""
    numa = deviceattrs.ATTR_NUMA_NODE
    h100 = _devices(_slices(capsys, "--fleet", "dgx-h100", "--node", "n1"))
    assert {n: d["attributes"][numa] for n, d in h100.items()} == {
        f"gpu-{i}": {"int": i // 4} for i in range(8)
    }
    args = ["--fleet", "dgx-a100", "--node", "n1", "--feature-gates", "PassthroughSupport=true"]
    a100 = _devices(_slices(capsys, *args))
    parents = {4: 7, 5: 7, 6: 5, 7: 5}
    migs = {n: d for n, d in a100.items() if "-mig-" in n}
    assert migs and all(
        d["attributes"][numa] == {"int": parents[nvidia.parse_device_name(n).minor or 0]}
        for n, d in migs.items()
    )
    assert a100["gpu-0"]["attributes"][numa] == {"int": 3}
    assert a100["gpu-vfio-0"]["attributes"][numa] == {"int": 3}


def test_list_type_attributes_print_numa_node_as_a_list(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``gpudra slices --feature-gates DRAListTypeAttributes=true``: every device's numaNode
    as the reference's one-element list, the pool checked at 1.37 (64 devices a slice), a
    note on what the API server needs; on 1.35, which has no lists, the int and a note."""
    numa = deviceattrs.ATTR_NUMA_NODE
    args = ["--fleet", "dgx-a100", "--node", "n1", "-o", "json", "--feature-gates"]
    assert main(["slices", *args, "PassthroughSupport=true,DRAListTypeAttributes=true"]) == 0
    out, err = capsys.readouterr()
    items = json.loads(out)["items"]
    devices = _devices(items)
    parents = {4: 7, 5: 7, 6: 5, 7: 5}
    for name, device in devices.items():
        (value,) = device["attributes"][numa]["ints"]
        ident = nvidia.parse_device_name(name)
        if ident.kind == "mig":
            assert value == parents[ident.minor or 0], name
        assert all(len(v) == 1 for v in device["attributes"].values())
    assert devices["gpu-0"]["attributes"][numa] == {"ints": [3]}
    assert devices["gpu-vfio-0"]["attributes"][numa] == {"ints": [3]}
    assert any(len(s["spec"]["devices"]) for s in items)
    assert all(len(s["spec"]["devices"]) <= 64 for s in items)
    assert not slicecheck.check_pool(items, kube_minor=37)
    assert "gpudra slices: note: numaNode is a list (DRAListTypeAttributes)" in err
    assert "Kubernetes' own gate DRAListTypeAttributes (alpha, off by default in 1.37)" in err

    old = ["--kube-version", "1.35", "--feature-gates", "DRAListTypeAttributes=true"]
    assert main(["slices", *args[:-1], *old]) == 0
    out, err = capsys.readouterr()
    assert {d["attributes"][numa]["int"] for d in _devices(json.loads(out)["items"]).values()}
    assert "DRAListTypeAttributes changes nothing on Kubernetes 1.35" in err


def test_dynamic_mig_adds_counter_sets(capsys: pytest.CaptureFixture[str]) -> None:
    items = _slices(
        capsys, "--fleet", "dgx-h100", "--node", "n1", "--feature-gates", "DynamicMIG=true"
    )
    counter_sets = [c["name"] for s in items for c in s["spec"].get("sharedCounters", [])]
    assert counter_sets == [f"gpu-{i}-counter-set" for i in range(8)]
    assert all(not ("devices" in s["spec"] and "sharedCounters" in s["spec"]) for s in items)
    combined = _slices(
        capsys,
        "--fleet", "dgx-h100", "--node", "n1",
        "--feature-gates", "DynamicMIG=true", "--kube-version", "1.34",
    )  # fmt: skip
    assert len(combined) == 8 and all("sharedCounters" in s["spec"] for s in combined)


def test_yaml_output_is_a_stream_of_slices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slices", "--fleet", "l4x4", "--node", "edge-1"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["metadata"]["name"] for d in docs] == ["edge-1-gpu.nvidia.com-0"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fleet", "dgx-z9", "--node", "n1"], "unknown fleet 'dgx-z9'; valid fleets: dgx-a100"),
        (
            ["--fleet", "dgx-h100", "--node", "n1", "--feature-gates", "Turbo=true"],
            f"unknown feature gate 'Turbo'; valid: {featuregates.valid_names()}",
        ),
        (
            [
                "--fleet",
                "dgx-h100",
                "--node",
                "n1",
                "--feature-gates",
                "DynamicMIG=true,PassthroughSupport=true",
            ],
            "DynamicMIG is currently mutually exclusive with PassthroughSupport",
        ),
        (["--fleet", "dgx-h100", "--node", "n1", "--kube-version", "one"], "like 1.35"),
    ],
)
def test_bad_arguments_exit_2_and_say_what_is_valid(args: list[str], message: str) -> None:
    proc = gpudra("slices", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stdout == ""


def test_publisher_flags_are_checked_before_anything_starts() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "publisher", "--additional-xids-to-ignore", "x"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "XIDs must be non-negative integers" in proc.stderr
