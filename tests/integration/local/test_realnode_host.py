"""A real node's fake host on its own (services/local/nodehost.py): the namespace,
its mounts and the simulated driver installation, visible only inside it.

No control plane runs: only the runner's host half (``start_host``) and its stop.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from services.discovery.fleet import get_fleet
from services.local import node as nodes
from services.local import nodetools
from services.local.cluster import ControlPlane

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ldconfig") is None,
    reason="the fake host needs root, unshare and ldconfig",
)


def runner(tmp_path: Path, fleet: str) -> nodes.RealNode:
    cp = ControlPlane(workdir=tmp_path / "cp")  # not started: logs and paths only
    cp.logs_dir.mkdir(parents=True)
    tools = nodetools.NodeTools(
        kubelet=Path("/nonexistent/kubelet"),
        containerd_dir=Path("/nonexistent"),
        runc=Path("/nonexistent/runc"),
        nvidia_cdi_hook=Path("/bin/true"),  # copied into the driver root as is
        nvidia_ctk=Path("/bin/true"),
    )
    return nodes.RealNode(cp, "n1", fleet, tmp_path / "n1", tools, startup_timeout=60)


def test_the_driver_and_device_nodes_exist_only_inside(tmp_path: Path) -> None:
    node = runner(tmp_path, "dgx-a100")
    try:
        node.start_host()
        facts = node.host_facts
        assert facts["driverRoot"] == facts["devRoot"] == "/run/nvidia/driver"
        assert facts["driverVersion"] == get_fleet("dgx-a100").driver_version
        for gpu in facts["gpus"]:
            st = os.stat(node.inside(f"/run/nvidia/driver/dev/nvidia{gpu['minor']}"))
            assert stat.S_ISCHR(st.st_mode)
            assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, gpu["minor"])
            for mig in gpu["migs"]:
                cap = node.inside(f"/run/nvidia/driver/dev/nvidia-caps/nvidia-cap{mig['ciCap']}")
                assert os.minor(os.stat(cap).st_rdev) == mig["ciCap"]
        assert any(g["migs"] for g in facts["gpus"])  # dgx-a100's static MIG layout
        smi = node.inside("/run/nvidia/driver/usr/bin/nvidia-smi").read_text()
        assert smi.startswith("#!/bin/sh") and facts["gpus"][0]["uuid"] in smi
        assert not Path("/run/nvidia/driver").exists()  # not on the host
        # /var/lib is the node's folder inside, the host's outside.
        (tmp_path / "n1" / "var-lib" / "marker").write_text("node")
        assert node.inside("/var/lib/marker").read_text() == "node"
        assert not Path("/var/lib/marker").exists()
        # The kubelet's sysctls are files inside: a write there leaves the kernel alone.
        before = Path("/proc/sys/kernel/panic").read_text()
        node.inside("/proc/sys/kernel/panic").write_text("10\n")
        assert Path("/proc/sys/kernel/panic").read_text() == before
        assert (tmp_path / "n1" / "sysctl" / "kernel.panic").read_text() == "10\n"
        assert node.holder is not None and node.namespace_pids() == [node.holder.pid]
    finally:
        node.stop()
    assert node.leftovers() == []
    assert Path("/proc/sys/kernel/panic").read_text() == before


def test_an_unknown_fleet_is_a_clear_error(tmp_path: Path) -> None:
    node = runner(tmp_path, "no-such-fleet")
    try:
        with pytest.raises(nodetools.NodeError) as info:
            node.start_host()
    finally:
        node.stop()
    message = str(info.value)
    assert "node n1: the fake host did not start" in message
    assert "unknown fleet 'no-such-fleet'" in message
    assert node.leftovers() == []
