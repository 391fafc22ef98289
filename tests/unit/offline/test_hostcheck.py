"""``gpudra host-check``, and the simulated GPU models against what real GPUs answered.

tests/unit/realgpu/ holds what ``gpudra host-check --report`` read from a real
H100 80GB HBM3 and a real H200 (driver 580.159.04) through pynvml: every fact the
inventory takes from NVML, the MIG profile table with placements, and the CDI
files found in that installation. The simulated backend must answer the same.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.discovery.fleet import get_fleet
from services.discovery.sim import SimNvml
from services.local import driverroot
from services.offline import hostcheck

READINGS = sorted((Path(__file__).parents[1] / "realgpu").glob("*.json"))


def _reading(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(__file__).parents[1] / "realgpu" / name).read_text())
    return data


@pytest.mark.parametrize("path", READINGS, ids=[p.stem for p in READINGS])
def test_the_simulated_model_answers_as_the_real_gpu_did(path: Path) -> None:
    real = json.loads(path.read_text())["facts"]
    model = hostcheck.model_for(real["pci_device_id"])
    assert model is not None, f"no simulated model for {real['product_name']}"
    sim = hostcheck.simulated(model, real)
    assert hostcheck.compare(real, sim) == []
    assert len(real["gpu_instance_profiles"]) == 7  # a reading that holds MIG profiles


def test_readings_of_both_hopper_gpus_are_kept() -> None:
    names = {json.loads(p.read_text())["facts"]["product_name"] for p in READINGS}
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= names


def test_a_profile_that_differs_from_nvml_is_named_by_profile_and_field() -> None:
    real = copy.deepcopy(_reading("h200-580.159.04.json")["facts"])
    model = hostcheck.model_for(real["pci_device_id"])
    assert model is not None
    sim = hostcheck.simulated(model, real)
    profile = next(p for p in real["gpu_instance_profiles"] if p["name"] == "3g.71gb")
    profile["memory_mib"] = 66816
    real["addressing_mode"] = "ATS"
    real["gpu_instance_profiles"].append({**profile, "name": "5g.99gb"})
    assert hostcheck.compare(real, sim) == [
        "addressing_mode: NVML 'ATS', simulated 'None'",
        "MIG profile 3g.71gb.memory_mib: NVML 66816, simulated 71424",
        f"MIG profile 5g.99gb: only NVML has it ({real['gpu_instance_profiles'][-1]})",
    ]


def test_a_gpu_without_a_simulated_model_is_a_difference() -> None:
    assert hostcheck.model_for(0x9999) is None


def test_without_nvml_the_command_says_so_and_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "host-check"], capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    assert "gpudra host-check: NVML:" in result.stderr


@pytest.mark.skipif(bool(driverroot.unavailable()), reason=str(driverroot.unavailable()))
def test_a_simulated_host_checks_clean_and_its_cdi_files_exist(tmp_path: Path) -> None:
    fleet = get_fleet("dgx-h100")
    root = driverroot.build(tmp_path / "node", fleet=fleet.name, version=fleet.driver_version)
    sim = SimNvml.boot("node-1", fleet, 0)
    try:
        report = hostcheck.check(
            sim, str(root.driver_root), 3, root.hook_path, dev_root=str(root.dev_root)
        )
    finally:
        sim.shutdown()
    assert report["differences"] == [] and report["problems"] == []
    mounts = {m["hostPath"] for m in report["cdi"]["common"]["mounts"]}
    assert {str(p) for p in root.libraries()} <= mounts
    assert len(report["cdi"]["gpus"]) == 8
    assert report["scan"]["scans"] == 3
    # A driver file gone after discovery is named (a spec would mount nothing there).
    gone = root.libraries()[0]
    os.unlink(gone)
    problems = list(hostcheck._missing(report["cdi"]["common"]))
    assert problems == [f"mount source {gone} does not exist"]
