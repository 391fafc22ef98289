"""Fleet files and the CLI's handling of fleet names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.cli import main
from services.discovery.fleet import FleetError, fleet_names, get_fleet, parse_fleet

ROOT = Path(__file__).resolve().parents[3]


def test_every_fleet_parses_and_the_required_ones_exist() -> None:
    assert set(fleet_names()) >= {"dgx-h100", "dgx-a100", "h200x8", "l4x4", "mixed"}
    h100 = get_fleet("dgx-h100")
    assert [g.model for g in h100.gpus] == ["H100-SXM5-80GB"] * 8
    a100 = get_fleet("dgx-a100")
    assert [g.model for g in a100.gpus] == ["A100-SXM4-40GB"] * 8
    assert [g.mig is not None for g in a100.gpus] == [False] * 4 + [True] * 4
    assert [g.model for g in get_fleet("h200x8").gpus] == ["H200-141GB"] * 8
    assert [g.model for g in get_fleet("l4x4").gpus] == ["L4"] * 4
    assert len({g.model for g in get_fleet("mixed").gpus}) == 4


def test_unknown_fleet_lists_the_valid_ones() -> None:
    with pytest.raises(FleetError, match="unknown fleet 'dgx-b200'; valid fleets: dgx-a100, "):
        get_fleet("dgx-b200")


def test_cli_unknown_fleet_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["discovery", "--node-name", "n", "--fleet", "dgx-b200"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown fleet 'dgx-b200'" in err
    assert all(name in err for name in fleet_names())


def test_cli_unknown_fleet_from_a_real_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "sim", "boot", "--node", "n", "--fleet", "x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "valid fleets: dgx-a100, dgx-h100, gb200-nvl72, h200x8, l4x4, mixed" in proc.stderr


def test_sim_fleets_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "fleets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == fleet_names()


HEAD = """
name: t
description: t
driver_version: 570.124.06
cuda_driver_version: "12.8"
gpus:
"""


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ("  - {model: H100-SXM5-80GB, pci_bus_id: 3b:00.0, iommu_group: 1}\n", "pci_bus_id"),
        ("  - {model: B300, pci_bus_id: '0000:3b:00.0', iommu_group: 1}\n", "unknown GPU model"),
        (
            "  - {model: L4, pci_bus_id: '0000:3b:00.0', iommu_group: 1, mig: []}\n",
            "L4 is not MIG capable",
        ),
        (
            "  - {model: A100-SXM4-40GB, pci_bus_id: '0000:3b:00.0', iommu_group: 1,"
            " mig: [3g.20gb@0, 2g.10gb@2]}\n",
            "2g.10gb@2 overlaps",
        ),
        (
            "  - {model: A100-SXM4-40GB, pci_bus_id: '0000:3b:00.0', iommu_group: 1,"
            " mig: [3g.20gb@1]}\n",
            "valid starts are \\[0, 4\\]",
        ),
        (
            "  - {model: A100-SXM4-40GB, pci_bus_id: '0000:3b:00.0', iommu_group: 1,"
            " mig: [3g.20gb]}\n",
            "expected profile@start",
        ),
        ("  - {model: L4, pci_bus_id: '0000:3b:00.0'}\n", "missing required field `iommu_group`"),
    ],
)
def test_bad_fleets_say_what_is_wrong(gpus: str, message: str) -> None:
    with pytest.raises(FleetError, match=message):
        parse_fleet("t.yaml", HEAD + gpus)
