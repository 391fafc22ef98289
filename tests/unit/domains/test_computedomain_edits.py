"""What a prepared ComputeDomain claim injects: channel devices, daemon identity and mount."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.preparer.computedomain import edits, nodefacts

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia
234 nvidia-caps-imex-channels
236 nvidia-caps
508 nvidia-uvm

Block devices:
  7 loop
235 nvidia-caps-imex-channels
"""


def test_majors_come_from_the_character_section_only() -> None:
    assert edits.char_major(PROC_DEVICES, "nvidia-caps-imex-channels") == 234
    assert edits.char_major(PROC_DEVICES, "nvidia-caps") == 236
    block_only = "Character devices:\n  1 mem\n\nBlock devices:\n235 nvidia-caps-imex-channels\n"
    with pytest.raises(edits.EditsError, match="no character device 'nvidia-caps-imex-channels'"):
        edits.char_major(block_only, "nvidia-caps-imex-channels")
    for hostile in ("", "Character devices:\nx nvidia-caps\n", "nvidia-caps 236\n"):
        with pytest.raises(edits.EditsError, match="is the driver loaded"):
            edits.char_major(hostile, "nvidia-caps")


def test_single_injects_channel_0_and_all_injects_2048() -> None:
    single = edits.channel_edits("Single", "uuid.1", 234)
    assert single == {"deviceNodes": [{"path": "/dev/nvidia-caps-imex-channels/channel0",
                                        "type": "c", "major": 234, "minor": 0,
                                        "fileMode": 0o666}]}  # fmt: skip
    every = edits.channel_edits("All", "uuid.1", 234)["deviceNodes"]
    assert len(every) == 2048 and every[-1]["minor"] == 2047
    assert every[-1]["path"] == "/dev/nvidia-caps-imex-channels/channel2047"
    assert "env" not in single  # no environment, as the reference


def test_outside_a_fabric_a_channel_injects_nothing() -> None:
    assert edits.channel_edits("Single", "", 234) == {}


def test_a_bad_allocation_mode_is_refused() -> None:
    with pytest.raises(edits.EditsError, match="allocationMode 'Some': want one of Single, All"):
        edits.channel_edits("Some", "uuid.1", 234)


def test_a_daemon_gets_its_domain_the_imexd_mount_and_the_capability() -> None:
    domain = edits.DomainRef(uid="u-1", name="cd", namespace="team")
    cap = edits.parse_cap_file("DeviceFileMinor: 7\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    got = edits.daemon_edits(domain, "uuid.1", "/var/lib/kubelet/plugins/x/domains/u-1", cap, 236)
    assert got["env"] == ["CLIQUE_ID=uuid.1", "COMPUTE_DOMAIN_UUID=u-1",
                          "COMPUTE_DOMAIN_NAME=cd", "COMPUTE_DOMAIN_NAMESPACE=team"]  # fmt: skip
    assert got["mounts"][0]["containerPath"] == "/imexd"
    assert {"nosuid", "nodev", "rw"} <= set(got["mounts"][0]["options"])
    assert got["deviceNodes"] == [{"path": "/dev/nvidia-caps/nvidia-cap7", "type": "c",
                                   "major": 236, "minor": 7, "fileMode": 256}]  # fmt: skip
    plain = edits.daemon_edits(domain, "", "/d", None, 236)
    assert "deviceNodes" not in plain and plain["env"][0] == "CLIQUE_ID="
    with pytest.raises(edits.EditsError, match="needs the fabric-imex-mgmt capability"):
        edits.daemon_edits(domain, "uuid.1", "/d", None, 236)


def test_capability_files_without_a_minor_are_refused() -> None:
    with pytest.raises(edits.EditsError, match="names no DeviceFileMinor"):
        edits.parse_cap_file("DeviceFileMode: 256\n")


def test_cdi_ids_are_the_references() -> None:
    assert edits.cdi_device_id("uid-9", "channel-0") == (
        "k8s.compute-domain.nvidia.com/claim=uid-9-channel-0"
    )
    with pytest.raises(ValueError, match="not a compute-domain"):
        edits.cdi_device_id("uid-9", "gpu-0")


def test_node_facts_read_the_hosts_proc_and_a_simulated_node_answers_stand_ins(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    cap = proc / nodefacts.FABRIC_IMEX_MGMT
    cap.parent.mkdir(parents=True)
    (proc / "devices").write_text(PROC_DEVICES)
    cap.write_text("DeviceFileMinor: 7\nDeviceFileMode: 256\n")
    real = nodefacts.NodeFacts(proc)
    assert (real.imex_major(), real.caps_major()) == (234, 236)
    assert real.fabric_cap() == edits.CapFile(minor=7, mode=256)
    cap.unlink()
    with pytest.raises(edits.EditsError, match=r"cannot read .*fabric-imex-mgmt"):
        real.fabric_cap()  # a claim error naming the file, not a crash
    simulated = nodefacts.NodeFacts(None)
    assert simulated.imex_major() == nodefacts.SIMULATED_IMEX_MAJOR
    assert simulated.fabric_cap() == nodefacts.SIMULATED_CAP
