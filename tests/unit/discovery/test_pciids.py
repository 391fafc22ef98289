"""VFIO product names from the PCI ID database, looked up as go-nvlib's pciids does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.core.model import deviceattrs
from services.discovery import pciids
from services.discovery.models import get_model, model_names
from services.discovery.sim import NVIDIA_VENDOR_ID

SAMPLE = """\
#
#\tList of PCI ID's
#
#\tVersion: 2099.01.02
#
10de  NVIDIA Corporation
\t2330  GH100 [H100 SXM5 80GB]
\t\t10de 16c1  H100 SXM5 80GB
\t27b8  AD104GL [L4]\x20\x20
8086  Intel Corporation
\t2330  ZyWALL Turbo Card
ffff  Illegitimate vendor ID
C 03  Display controller
\t00  VGA compatible controller
\t\t00  VGA controller
"""


def test_the_parser_follows_go_nvlib() -> None:
    db = pciids.parse(SAMPLE, "sample")
    assert db.version == "2099.01.02"
    assert db.device_name(0x10DE, 0x2330) == "GH100 [H100 SXM5 80GB]"  # not the subsystem
    assert db.device_name(0x10DE, 0x27B8) == "AD104GL [L4]"  # trailing blanks trimmed
    assert db.device_name(0x8086, 0x2330) == "ZyWALL Turbo Card"  # ids are per vendor
    assert db.vendors[0xFFFF] == "Illegitimate vendor ID"
    assert db.device_name(0x10DE, 0x0003) == pciids.UNKNOWN_DEVICE == "UNKNOWN_DEVICE"
    assert (0xFFFF, 0x0000) not in db.devices  # the class section names no devices


# What the reference publishes as a VFIO device's productName for each simulated
# model: the entries of pci.ids 2025.07.11 as go-nvlib v0.12.0 embeds it
# (vendor/github.com/NVIDIA/go-nvlib/pkg/pciids/default_pci.ids in the reference).
REFERENCE_NAMES = {
    "A100-SXM4-40GB": "GA100 [A100 SXM4 40GB]",
    "A100-SXM4-80GB": "GA100 [A100 SXM4 80GB]",
    "GB200": "GB100 [HGX GB200]",
    "H100-SXM5-80GB": "GH100 [H100 SXM5 80GB]",
    "H200-141GB": "GH100 [H200 SXM 141GB]",
    "L4": "AD104GL [L4]",
}


def test_the_built_in_subset_names_every_simulated_gpu_model_as_the_reference() -> None:
    db = pciids.builtin()
    assert db.source == pciids.BUILTIN and db.version == "2025.07.11"
    names = {n: db.device_name(NVIDIA_VENDOR_ID, get_model(n).pci_device_id) for n in model_names()}
    assert names == REFERENCE_NAMES
    assert len(db.devices) == len(REFERENCE_NAMES)  # the subset is the fleets' GPUs, no more


def _system() -> pciids.PciIds:
    found = [p for p in pciids.SYSTEM_PATHS if p.is_file()]
    if not found:
        pytest.skip(
            "no system pci.ids to compare the subset with (apt-get install pci.ids, or hwdata)"
        )
    return pciids.from_file(found[0])


def test_the_subset_agrees_with_the_system_database() -> None:
    """Entries the system file has match it; older files may lack or misspell newer ones.

    Debian bookworm's pci.ids is version 2023.04.10: it spells the H100 as
    ``GH100[H100 SXM5 80GB]`` and has no H200; the database fixed both before
    the subset's version. So names must agree exactly when the system file is
    at least as new as the subset, and up to blanks otherwise, and only a
    file older than the subset may lack an entry.
    """
    system, subset = _system(), pciids.builtin()
    assert system.version, f"{system.source} has no Version header"
    newer = system.version >= subset.version
    for vendor, name in subset.vendors.items():
        assert system.vendors.get(vendor) == name, (system.source, hex(vendor))
    for key, name in subset.devices.items():
        theirs = system.devices.get(key)
        where = (system.source, system.version, f"{key[0]:04x}:{key[1]:04x}")
        if theirs is None:
            assert not newer, f"{where}: missing from a database newer than the subset"
        elif newer:
            assert theirs == name, where
        else:
            assert theirs.replace(" ", "") == name.replace(" ", ""), (where, theirs, name)


def test_load_takes_the_named_file_then_the_first_system_file_then_the_subset(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine.ids"
    mine.write_text(SAMPLE)
    assert pciids.load(mine).source == str(mine)
    missing, second = tmp_path / "missing.ids", tmp_path / "second.ids"
    second.write_text(SAMPLE.replace("2099.01.02", "2099.01.03"))
    assert pciids.load(None, [missing, second]).version == "2099.01.03"
    assert pciids.load(None, [missing]) is pciids.builtin()
    with pytest.raises(pciids.PciIdsError, match=r"pci.ids database .*missing.ids: No such file"):
        pciids.load(missing)


def test_gpudra_slices_shows_the_pci_database_name_for_vfio_devices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from services.cli import main

    args = ["slices", "--fleet", "dgx-h100", "--node", "n1", "-o", "json"]
    assert main([*args, "--feature-gates", "PassthroughSupport=true"]) == 0
    slices = json.loads(capsys.readouterr().out)["items"]
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    names = {n: d["attributes"]["productName"]["string"] for n, d in devices.items()}
    vfio = {n: v for n, v in names.items() if n.startswith("gpu-vfio-")}
    assert len(vfio) == 8 and set(vfio.values()) == {"GH100 [H100 SXM5 80GB]"}
    gpus = {n: v for n, v in names.items() if not n.startswith("gpu-vfio-")}
    assert len(gpus) == 8 and set(gpus.values()) == {"NVIDIA H100 80GB HBM3"}  # NVML's name
    twin = devices["gpu-vfio-0"]["attributes"]
    assert (
        twin[deviceattrs.ATTR_VENDOR_ID]["string"],
        twin[deviceattrs.ATTR_DEVICE_ID]["string"],
    ) == (
        "0x10de",
        "0x2330",
    )


def test_a_gb200_twin_is_named_as_the_reference_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from services.cli import main

    args = ["slices", "--fleet", "gb200-nvl72", "--node", "n1", "-o", "json"]
    assert main([*args, "--feature-gates", "PassthroughSupport=true"]) == 0
    slices = json.loads(capsys.readouterr().out)["items"]
    twins = [d for s in slices for d in s["spec"].get("devices") or []
             if d["name"].startswith("gpu-vfio-")]  # fmt: skip
    assert twins and {t["attributes"]["productName"]["string"] for t in twins} == {
        "GB100 [HGX GB200]"
    }
    assert {t["attributes"][deviceattrs.ATTR_DEVICE_ID]["string"] for t in twins} == {"0x2941"}
