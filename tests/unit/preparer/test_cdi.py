"""Claim CDI specs: names, device nodes, MIG caps, MPS, VFIO, versions, runtime checks, files."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.preparer import cdi, cdicheck
from services.preparer.cdigen.generator import Generator
from services.preparer.checkpoint import (
    GroupState,
    MpsState,
)
from services.preparer.devices import simroot
from tests.helpers.cdistate import UID, VERSION, generator, gpu, mig, vfio
from tests.helpers.preparer import validate_cdi_file


def nodes(spec: dict[str, Any], index: int | None = None) -> list[str]:
    edits = spec["containerEdits"] if index is None else spec["devices"][index]["containerEdits"]
    return [n["path"] for n in edits.get("deviceNodes", [])]


@pytest.mark.parametrize(
    ("gpu_minor", "gi", "ci", "expected"),
    [
        # Lines of /proc/driver/nvidia-caps/mig-minors on a real driver.
        (0, 0, 0, (3, 4)),
        (0, 0, 7, (3, 11)),
        (0, 1, 0, (12, 13)),
        (3, 3, 3, (435, 439)),
        (6, 11, 7, (912, 920)),
    ],
)
def test_mig_capability_minors_follow_the_driver_table(
    gpu_minor: int, gi: int, ci: int, expected: tuple[int, int]
) -> None:
    assert cdi.mig_cap_minors(gpu_minor, gi, ci) == expected


@pytest.fixture
def gen(tmp_path: Path) -> Generator:
    return generator(tmp_path / "driver")


def hook_args(spec: dict[str, Any]) -> list[list[str]]:
    return [h["args"] for h in spec["containerEdits"].get("hooks", [])]


def test_a_full_gpu_gets_its_node_the_control_nodes_and_the_driver(gen: Generator) -> None:
    spec = cdi.render(UID, [gpu()], [GroupState(kind="GpuConfig", origin="default")], gen, VERSION)
    root = gen.options.driver_root
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert spec["devices"][0]["name"] == f"{UID}-gpu-2"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia2", "major": 195, "minor": 2, "fileMode": 0o666,
         "permissions": "rwm", "type": "c"}
    ]  # fmt: skip
    assert nodes(spec) == [
        "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl",
    ]  # fmt: skip
    common = spec["containerEdits"]
    assert common["env"] == [
        "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu",
        "NVIDIA_VISIBLE_DEVICES=void",
    ]
    mounts = {m["containerPath"]: m for m in common["mounts"]}
    libcuda = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    assert mounts[libcuda]["hostPath"] == root + libcuda
    assert mounts[libcuda]["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    for path in ("/usr/bin/nvidia-smi", f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"):
        assert path in mounts
    assert mounts["/run/nvidia-persistenced/socket"]["options"][-1] == "noexec"
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" not in mounts  # links come from the hook
    args = hook_args(spec)
    assert [a[1] for a in args] == [
        "create-symlinks", "enable-cuda-compat", "update-ldcache",
        "disable-device-node-modification",
    ]  # fmt: skip
    assert "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so" in args[0]
    assert f"libcuda.so.{VERSION}::/usr/lib/x86_64-linux-gnu/libcuda.so.1" in args[0]
    assert args[1][2:] == [f"--host-driver-version={VERSION}"]
    assert args[2][2:] == ["--folder", "/usr/lib/x86_64-linux-gnu"]
    assert {h["path"] for h in common["hooks"]} == {root + "/usr/bin/nvidia-cdi-hook"}
    assert spec["cdiVersion"] == "0.5.0"  # this UID starts with a digit: a 0.5.0 name
    assert cdicheck.problems(spec) == []


def test_host_paths_are_rewritten_to_the_host_driver_root(tmp_path: Path) -> None:
    gen = generator(tmp_path / "driver-root", host_root="/")
    spec = cdi.render(UID, [gpu()], [GroupState(kind="GpuConfig", origin="d")], gen, VERSION)
    common = spec["containerEdits"]
    host_paths = [m["hostPath"] for m in common["mounts"]]
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}" in host_paths
    assert not [p for p in host_paths if str(tmp_path) in p]
    assert {h["path"] for h in common["hooks"]} == {"/usr/bin/nvidia-cdi-hook"}
    # As the reference's transform: every device node names its host path.
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == "/dev/nvidia2"
    assert cdicheck.problems(spec) == []


def test_common_edits_are_found_once_per_installation(tmp_path: Path) -> None:
    gen = generator(tmp_path / "driver")
    groups = [GroupState(kind="GpuConfig", origin="d")]
    first = cdi.render(UID, [gpu()], groups, gen, VERSION)
    for _ in range(3):
        assert cdi.render(UID, [gpu()], groups, gen, VERSION) == first
    assert gen.discoveries == 1
    simroot.build(tmp_path / "driver", "580.95.05")  # the driver is upgraded in place
    upgraded = cdi.render(UID, [gpu()], groups, gen, "580.95.05")
    assert gen.discoveries == 2
    assert "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu" in upgraded["containerEdits"]["env"]
    paths = [m["containerPath"] for m in upgraded["containerEdits"]["mounts"]]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05" in paths
    assert not [p for p in paths if VERSION in p]


def test_a_mig_device_gets_its_parent_and_its_gi_and_ci_capability_nodes(gen: Generator) -> None:
    spec = cdi.render(
        UID,
        [mig(minor=1, gi=9, ci=0)],
        [GroupState(kind="MigDeviceConfig", origin="default")],
        gen,
        VERSION,
    )
    gi_minor, ci_minor = cdi.mig_cap_minors(1, 9, 0)
    edits = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert edits[0]["path"] == "/dev/nvidia1"
    assert edits[1:] == [
        {"path": f"/dev/nvidia-caps/nvidia-cap{m}", "type": "c", "major": 508, "minor": m}
        for m in (gi_minor, ci_minor)
    ]
    assert cdicheck.problems(spec) == []


def test_mps_adds_the_pipe_directory_and_its_mounts(gen: Generator) -> None:
    daemon = MpsState(
        daemon_id=f"{UID}-abcde", root_dir="/p/mps/x", pipe_dir="/p/mps/x/pipe",
        shm_dir="/p/mps/x/shm", log_dir="/p/mps/x/log", device_uuids=["GPU-1"],
    )  # fmt: skip
    groups = [GroupState(kind="GpuConfig", origin="c", mps=daemon)]
    spec = cdi.render(UID, [gpu()], groups, gen, VERSION)
    edits = spec["devices"][0]["containerEdits"]
    assert edits["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        ("/p/mps/x/shm", "/dev/shm"),
        ("/p/mps/x/pipe", "/tmp/nvidia-mps"),
    ]
    assert cdicheck.problems(spec) == []


@pytest.mark.parametrize(
    ("api_device", "iommufd", "common"),
    [(False, False, []), (True, False, ["/dev/vfio/vfio"]), (True, True, ["/dev/iommu"])],
)
def test_vfio_gets_its_group_node_and_the_api_device_only_when_asked(
    api_device: bool, iommufd: bool, common: list[str], tmp_path: Path
) -> None:
    gen = generator(tmp_path / "driver", iommufd=iommufd)
    group = GroupState(
        kind="VfioDeviceConfig", origin="c", vfio_api_device=api_device, vfio_iommufd=iommufd
    )
    spec = cdi.render(UID, [vfio(42)], [group], gen, VERSION)
    assert nodes(spec, 0) == (["/dev/vfio/devices/vfio3"] if iommufd else ["/dev/vfio/42"])
    assert nodes(spec) == common  # no nvidiactl/uvm for a GPU the nvidia driver gave up
    assert "mounts" not in spec["containerEdits"]
    assert cdicheck.problems(spec) == []


def test_iommufd_preferred_on_a_host_without_it_uses_the_legacy_nodes(tmp_path: Path) -> None:
    gen = generator(tmp_path / "driver", iommufd=False)
    group = GroupState(kind="VfioDeviceConfig", origin="c", vfio_api_device=True, vfio_iommufd=True)
    spec = cdi.render(UID, [vfio(42)], [group], gen, VERSION)
    assert nodes(spec, 0) == ["/dev/vfio/42"]
    assert nodes(spec) == ["/dev/vfio/vfio"]


def test_metadata_files_are_mounted_read_only_at_the_kep_5304_path(gen: Generator) -> None:
    mount = cdi.MetadataMount(
        host_path="/k/plugins/gpu.nvidia.com/metadata/u/v/gpu.nvidia.com-metadata.json",
        container_path=cdi.metadata_container_path("vm-gpu", "v/sub", "gpu.nvidia.com", ""),
        device="gpu-vfio-0",
    )
    assert mount.container_path == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu/v/"
        "gpu.nvidia.com-metadata.json"
    )
    assert cdi.metadata_container_path("c", "v", "gpu.nvidia.com", "pod-claim").startswith(
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/pod-claim/v/"
    )
    spec = cdi.render(
        UID, [vfio()], [GroupState(kind="VfioDeviceConfig", origin="c")], gen, VERSION, [mount]
    )
    assert (
        spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"] == mount.container_path
    )


def test_cdi_version_is_the_lowest_that_the_features_need(gen: Generator) -> None:
    base: dict[str, Any] = {
        "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [{"name": "a-gpu-0", "containerEdits": {}}],
    }
    assert cdi.minimum_version(base) == "0.3.0"
    assert (
        cdi.minimum_version({**base, "devices": [{"name": "0a-gpu-0", "containerEdits": {}}]})
        == "0.5.0"
    )
    with_host = {
        **base,
        "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/h/dev/x"}]},
    }
    assert cdi.minimum_version(with_host) == "0.5.0"
    typed_mount = {
        **base,
        "containerEdits": {"mounts": [{"hostPath": "a", "containerPath": "b", "type": "bind"}]},
    }
    assert cdi.minimum_version(typed_mount) == "0.4.0"
    assert cdi.minimum_version({**base, "annotations": {"a": "b"}}) == "0.6.0"
    groups = [GroupState(kind="GpuConfig", origin="d")]
    assert cdi.render("9" + UID[1:], [gpu()], groups, gen, VERSION)["cdiVersion"] == "0.5.0"
    assert cdi.render("a" + UID[1:], [gpu()], groups, gen, VERSION)["cdiVersion"] == "0.3.0"


def test_specs_are_written_0644_in_a_0755_directory_and_found_again(
    tmp_path: Path, gen: Generator
) -> None:
    root = tmp_path / "run" / "cdi"
    old = os.umask(0o077)  # a strict umask must not hide specs from the runtime
    try:
        spec = cdi.render(UID, [gpu()], [GroupState(kind="GpuConfig", origin="d")], gen, VERSION)
        path = cdi.write(root, UID, spec)
    finally:
        os.umask(old)
    assert path == root / f"k8s.gpu.nvidia.com-claim_{UID}.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    assert yaml.safe_load(path.read_text()) == spec
    validate_cdi_file(path)
    (root / "other-vendor.yaml").write_text("cdiVersion: 0.3.0\n")
    assert cdi.claim_uids_on_disk(root) == [UID]
    assert cdi.delete(root, UID) is True
    assert cdi.delete(root, UID) is False
    assert cdi.claim_uids_on_disk(root) == []


def test_device_names_are_valid_cdi_names() -> None:
    assert cdi.valid_device_name(cdi.device_name(UID, "gpu-0-mig-1g10gb-19-0"))
    assert not cdi.valid_device_name("a/b")
    assert not cdi.valid_device_name("-a")
