"""The parts of a real node that need no cluster: its configuration files, the
stand-in CNI plugin, the local images, the stand-in nvidia-smi, and what the node
runner and ``gpudra up --real-nodes`` say when they cannot run."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from services.local import cli, driverlayout, driverroot, images, nodeconfig, nodetools, nvidiasmi
from services.local import node as nodes

# ---- containerd, kubelet, CNI ---------------------------------------------------------


def settings(tmp_path: Path) -> nodeconfig.ContainerdSettings:
    return nodeconfig.ContainerdSettings(
        root=tmp_path / "root",
        state="/run/containerd",
        socket=tmp_path / "containerd.sock",
        cdi_dir=tmp_path / "cdi",
        cni_bin=tmp_path / "cni" / "bin",
        cni_conf=tmp_path / "cni" / "net.d",
        runc=Path("/usr/sbin/runc"),
        sandbox_image=images.PAUSE_IMAGE,
        opt=tmp_path / "opt",
    )


def test_containerd_config_has_the_settings_a_test_node_needs(tmp_path: Path) -> None:
    config = tomllib.loads(nodeconfig.containerd_toml(settings(tmp_path)))
    assert config["version"] == 3
    assert config["root"] == str(tmp_path / "root") and config["state"] == "/run/containerd"
    assert config["grpc"]["address"] == str(tmp_path / "containerd.sock")
    plugins = config["plugins"]
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["enable_cdi"] is True
    assert runtime["cdi_spec_dirs"] == [str(tmp_path / "cdi")]  # ours only, not /etc/cdi
    assert runtime["restrict_oom_score_adj"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {"BinaryName": "/usr/sbin/runc", "SystemdCgroup": False}
    assert runtime["cni"]["bin_dirs"] == [str(tmp_path / "cni" / "bin")]
    assert runtime["cni"]["use_internal_loopback"] is True
    assert plugins["io.containerd.nri.v1.nri"]["disable"] is True
    assert plugins["io.containerd.internal.v1.opt"]["path"] == str(tmp_path / "opt")
    images_plugin = plugins["io.containerd.cri.v1.images"]
    assert images_plugin["snapshotter"] == "overlayfs"
    assert images_plugin["pinned_images"]["sandbox"] == images.PAUSE_IMAGE
    assert plugins["io.containerd.grpc.v1.cri"]["stream_server_address"] == "127.0.0.1"


def test_kubelet_config_keeps_to_loopback_and_off_the_host(tmp_path: Path) -> None:
    config = nodeconfig.kubelet_config(
        nodeconfig.KubeletSettings(
            runtime_socket=tmp_path / "c.sock",
            cgroup_root="/gpudra-n1-abc",
            port=1234,
            healthz_port=1235,
            volume_plugin_dir=tmp_path / "vp",
            feature_gates={"DRADeviceTaints": True},
        )
    )
    assert config["kind"] == "KubeletConfiguration"
    assert config["address"] == config["healthzBindAddress"] == "127.0.0.1"
    assert config["readOnlyPort"] == 0
    assert config["failCgroupV1"] is False
    assert config["makeIPTablesUtilChains"] is False
    assert config["cgroupDriver"] == "cgroupfs" and config["cgroupRoot"] == "/gpudra-n1-abc"
    assert config["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'c.sock'}"
    assert config["volumePluginDir"] == str(tmp_path / "vp")
    assert config["imageGCHighThresholdPercent"] == 100  # the images cannot be pulled again
    assert config["featureGates"] == {"DRADeviceTaints": True}


def cni(tmp_path: Path, command: str, stdin: str = "{}") -> subprocess.CompletedProcess[str]:
    nodeconfig.write_cni(tmp_path / "bin", tmp_path / "net.d")
    env = {
        "PATH": os.environ["PATH"],
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "abc123",
        "CNI_NETNS": "/run/netns/x",
        "CNI_IFNAME": "eth0",
    }
    return subprocess.run(
        [str(tmp_path / "bin" / nodeconfig.CNI_PLUGIN)],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_the_standin_cni_reports_an_interface_and_an_address(tmp_path: Path) -> None:
    added = cni(tmp_path, "ADD")
    assert added.returncode == 0, added.stderr
    result = json.loads(added.stdout)
    assert result["interfaces"] == [{"name": "eth0", "sandbox": "/run/netns/x"}]
    (ip,) = result["ips"]
    assert ip["interface"] == 0 and ip["address"].startswith("10.244.")
    assert json.loads(cni(tmp_path, "ADD").stdout) == result  # the same for the same container
    assert cni(tmp_path, "DEL").returncode == 0
    assert "1.0.0" in json.loads(cni(tmp_path, "VERSION").stdout)["supportedVersions"]
    bad = cni(tmp_path, "BOGUS")
    assert bad.returncode == 1 and "BOGUS" in json.loads(bad.stdout)["msg"]
    conflist = json.loads((tmp_path / "net.d" / "10-gpudra.conflist").read_text())
    assert conflist["plugins"] == [{"type": nodeconfig.CNI_PLUGIN}]


# ---- images ------------------------------------------------------------------------


def test_localize_replaces_every_image_and_never_pulls() -> None:
    pod: dict[str, Any] = {
        "kind": "Pod",
        "spec": {
            "initContainers": [{"name": "i", "image": "nvcr.io/a:1"}],
            "containers": [{"name": "c", "image": "nvcr.io/b:2", "imagePullPolicy": "Always"}],
        },
    }
    claim = {"kind": "ResourceClaim", "spec": {"devices": {}}}
    out = images.localize([pod, claim])
    for c in [*out[0]["spec"]["initContainers"], *out[0]["spec"]["containers"]]:
        assert (c["image"], c["imagePullPolicy"]) == (images.BUSYBOX_IMAGE, "Never")
    assert out[1] == claim
    assert pod["spec"]["containers"][0]["image"] == "nvcr.io/b:2"  # the input is left alone


def test_a_dynamic_executable_is_not_static() -> None:
    assert images._is_static(Path(os.path.realpath("/bin/sh"))) is False


def blobs(archive: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    with tarfile.open(archive) as tar:
        files = {
            m.name: f.read()
            for m in tar.getmembers()
            if m.isfile() and (f := tar.extractfile(m)) is not None
        }
    return json.loads(files["index.json"]), files


def blob(files: dict[str, bytes], ref: dict[str, Any]) -> bytes:
    """The blob a descriptor names, checked against its size and digest."""
    data = files[f"blobs/sha256/{ref['digest'].removeprefix('sha256:')}"]
    assert len(data) == ref["size"]
    assert "sha256:" + hashlib.sha256(data).hexdigest() == ref["digest"]
    return data


@pytest.mark.skipif(images.unavailable() is not None, reason=str(images.unavailable()))
def test_the_images_are_oci_layouts_ctr_can_import(tmp_path: Path) -> None:
    pause, box = images.build(tmp_path)
    for archive, name in ((pause, images.PAUSE_IMAGE), (box, images.BUSYBOX_IMAGE)):
        assert archive.name == name
        index, files = blobs(archive.path)
        (manifest_ref,) = index["manifests"]
        assert manifest_ref["annotations"]["io.containerd.image.name"] == name

        manifest = json.loads(blob(files, manifest_ref))
        config = json.loads(blob(files, manifest["config"]))
        (layer_ref,) = manifest["layers"]
        layer = blob(files, layer_ref)
        assert config["rootfs"]["diff_ids"] == [layer_ref["digest"]]  # uncompressed
        assert (config["os"], config["architecture"]) == ("linux", "amd64")
        with tarfile.open(fileobj=io.BytesIO(layer)) as rootfs:
            members = {m.name: m for m in rootfs.getmembers()}
        if name == images.PAUSE_IMAGE:
            assert config["config"]["Entrypoint"] == ["/pause"]
            assert set(members) == {"pause"}
        else:
            assert members["bin/sh"].issym() and members["bin/sh"].linkname == "busybox"
            assert members["bin/bash"].isfile()  # the stand-in for the examples' bash -c
            assert {"usr/lib/x86_64-linux-gnu", "etc", "dev", "proc"} <= set(members)
    assert images._is_static(tmp_path / "pause")


# ---- the stand-in nvidia-smi ----------------------------------------------------------

GPUS = (
    driverlayout.FakeGpu(0, "GPU-aaaa", 0, "0000:07:00.0", "A100-SXM4-40GB", 10, "vfio0"),
    driverlayout.FakeGpu(
        1, "GPU-bbbb", 1, "0000:0f:00.0", "A100-SXM4-40GB", 11, "vfio1",
        migs=(
            driverlayout.FakeMig("MIG-1111", "GPU-bbbb", 1, "1g.5gb", 19, 0, 1, 9, 0, 147, 148),
            driverlayout.FakeMig("MIG-2222", "GPU-bbbb", 1, "1g.5gb", 19, 1, 1, 10, 0, 156, 157),
        ),
    ),
    driverlayout.FakeGpu(2, "GPU-cccc", 2, "0000:47:00.0", "A100-SXM4-40GB", 12, "vfio2"),
)  # fmt: skip


def fake_root() -> driverroot.DriverRoot:
    here = Path("/nonexistent")
    return driverroot.DriverRoot(
        base=here, driver_root=here, dev_root=here, proc=here, sysfs=here, facts_file=here,
        version="580.95.05", cuda_version=13000, fleet="dgx-a100", iommufd=False, gpus=GPUS,
    )  # fmt: skip


def smi(tmp_path: Path, nodes_: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the script in a mount namespace whose /dev holds only ``nodes_``."""
    script = tmp_path / "nvidia-smi"
    script.write_text(nvidiasmi.script(fake_root()))
    make = "; ".join(f"mkdir -p $(dirname {n}) && mknod {n} c {m}" for n, m in
                     (x.split("=") for x in nodes_))  # fmt: skip
    quoted = " ".join(f"'{a}'" for a in args)
    shell = f"mount -t tmpfs tmpfs /dev && {make or 'true'} && /bin/sh {script} {quoted}"
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        check=False,
    )


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)


@needs_root
def test_nvidia_smi_lists_the_gpus_and_mig_devices_it_can_reach(tmp_path: Path) -> None:
    seen = smi(
        tmp_path,
        ["/dev/nvidia1=195 1", "/dev/nvidia2=195 2", "/dev/nvidia-caps/nvidia-cap157=511 157"],
        "-L",
    )
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.splitlines() == [
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-bbbb)",
        "  MIG 1g.5gb Device 0: (UUID: MIG-2222)",
        "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-cccc)",
    ]


@needs_root
def test_nvidia_smi_queries_and_refusals(tmp_path: Path) -> None:
    query = smi(tmp_path, ["/dev/nvidia0=195 0"], "--query-gpu=name,memory.total", "--format=csv")
    assert query.stdout.splitlines() == [
        "name, memory.total [MiB]",
        "NVIDIA A100-SXM4-40GB, 40960 MiB",
    ], query.stderr
    nothing = smi(tmp_path, [], "-L")
    assert (nothing.returncode, nothing.stdout.strip()) == (6, "No devices were found")
    bad = smi(tmp_path, ["/dev/nvidia0=195 0"], "-q")
    assert bad.returncode == 2 and "unsupported argument: -q" in bad.stderr
    field = smi(tmp_path, ["/dev/nvidia0=195 0"], "--query-gpu=power.draw", "--format=csv")
    assert field.returncode == 2 and '"power.draw"' in field.stderr


# ---- when real nodes cannot run -------------------------------------------------------


def test_without_root_real_nodes_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert nodes.unavailable() == "real nodes need root (mount namespaces, mknod, cgroups)"


def test_gpudra_up_falls_back_to_kubelet_dra_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(nodes, "unavailable", lambda: "no runc (make node-packages)")
    assert cli._real_node_tools() is None
    said = capsys.readouterr().out
    assert "--real-nodes: no runc (make node-packages); running kubelet-dra instead" in said


def test_the_up_command_takes_real_nodes() -> None:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["up", "--real-nodes"])
    assert args.real_nodes is True


def test_missing_node_binaries_are_named(tmp_path: Path) -> None:
    if nodetools.find_runc() is None:
        pytest.skip("no runc: NodeTools.find stops there first")
    with pytest.raises(nodetools.NodeError, match=str(tmp_path / "kubelet")):
        nodetools.NodeTools.find(tmp_path / "controlplane", containerd_dir=tmp_path)
