"""The fake driver installation CDI tests build: is it what a GPU node has?"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from services.local import driverfiles
from services.local import driverroot as dr

pytestmark = pytest.mark.skipif(dr.unavailable() is not None, reason=str(dr.unavailable()))


def _soname(path: Path) -> str:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True)
    line = next(x for x in out.stdout.splitlines() if "(SONAME)" in x)
    return line.split("[", 1)[1].rstrip("]")


def _ldcache(root: dr.DriverRoot) -> dict[str, str]:
    """soname -> path, as the real ldconfig reads the root's cache."""
    cache = root.driver_root / "etc" / "ld.so.cache"
    out = subprocess.run(
        ["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=True
    )
    entries = [x.strip() for x in out.stdout.splitlines() if "=> " in x]
    return {e.split(" ", 1)[0]: e.rsplit("=> ", 1)[1] for e in entries}


def test_libraries_are_real_elf_with_the_drivers_sonames(tmp_path: Path) -> None:
    root = dr.build(tmp_path, fleet="dgx-h100", mig=False)
    libs = root.libraries()
    assert len(libs) == len(driverfiles.DRIVER_LIBRARIES)
    assert all(p.name.endswith(".so." + dr.DEFAULT_VERSION) for p in libs)
    cuda = root.lib_dir / f"libcuda.so.{root.version}"
    assert cuda.read_bytes()[:4] == b"\x7fELF"
    assert _soname(cuda) == "libcuda.so.1"
    assert _soname(root.lib_dir / f"libnvidia-glcore.so.{root.version}") == (
        f"libnvidia-glcore.so.{root.version}"
    )
    cache = _ldcache(root)
    assert cache["libcuda.so.1"] == f"/{driverfiles.LIB_DIR}/libcuda.so.1"
    assert cache["libnvidia-nvvm.so.4"] == f"/{driverfiles.LIB_DIR}/libnvidia-nvvm.so.4"
    assert "libnvidia-egl-wayland.so.1" in cache  # there, but not the driver version's
    assert os.readlink(root.lib_dir / "libcuda.so.1") == f"libcuda.so.{root.version}"
    assert os.readlink(root.lib_dir / "libcuda.so") == "libcuda.so.1"
    assert not os.path.lexists(root.lib_dir / "libnvidia-ptxjitcompiler.so")  # no dev link


def test_device_nodes_are_real_char_devices(tmp_path: Path) -> None:
    root = dr.build(tmp_path, fleet="dgx-a100", iommufd=True)
    dev = root.dev_root / "dev"
    st = os.stat(dev / "nvidia4")
    assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 195 and os.minor(st.st_rdev) == 4
    assert stat.S_IMODE(st.st_mode) == 0o666
    mig = root.gpu(4).migs[0]
    cap = os.stat(dev / "nvidia-caps" / f"nvidia-cap{mig.ci_cap_minor}")
    assert stat.S_ISCHR(cap.st_mode) and os.minor(cap.st_rdev) == mig.ci_cap_minor
    access = root.proc / "driver/nvidia/capabilities" / f"gpu4/mig/gi{mig.gi_id}/access"
    assert f"DeviceFileMinor: {mig.gi_cap_minor}\n" in access.read_text()
    group = os.stat(dev / "vfio" / str(root.gpu(0).iommu_group))
    assert stat.S_ISCHR(group.st_mode) and stat.S_IMODE(group.st_mode) == 0o600
    assert stat.S_ISCHR(os.stat(dev / "iommu").st_mode)
    assert stat.S_ISCHR(os.stat(dev / "vfio/devices" / root.gpu(0).vfio_dev).st_mode)
    assert stat.S_ISSOCK(os.stat(root.driver_root / "run/nvidia-persistenced/socket").st_mode)
    pci = root.sysfs / "bus/pci/devices" / root.gpu(0).pci_bus_id
    assert os.path.basename(os.readlink(pci / "iommu_group")) == str(root.gpu(0).iommu_group)


def test_facts_describe_the_same_gpus(tmp_path: Path) -> None:
    root = dr.build(tmp_path, fleet="dgx-a100")
    facts = json.loads(root.facts_file.read_text())
    assert facts["driverVersion"] == root.version
    assert [g["uuid"] for g in facts["gpus"]] == [g.uuid for g in root.gpus]
    mig_gpu = facts["gpus"][4]
    assert mig_gpu["migEnabled"] and len(mig_gpu["migDevices"]) == len(root.gpu(4).migs)
    whole = dr.build(tmp_path / "whole", fleet="dgx-a100", mig=False)
    assert not whole.migs() and not (whole.dev_root / "dev/iommu").exists()


def test_missing_pieces_are_missing(tmp_path: Path) -> None:
    gone = {"libraries", "nvidia-cdi-hook", "firmware", "nvidia-modeset", "persistenced-socket"}
    root = dr.build(tmp_path, fleet="l4x4", missing=gone)
    assert root.libraries() == []
    assert not any(p.name.startswith("libcuda") for p in root.lib_dir.iterdir())
    assert not Path(root.hook_path).exists()
    assert (root.driver_root / "usr/bin/nvidia-smi").exists()
    assert not (root.driver_root / "lib/firmware").exists()
    assert not (root.dev_root / "dev/nvidia-modeset").exists()
    assert not (root.driver_root / "run/nvidia-persistenced").exists()


def test_unknown_piece_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown pieces \['libcudaa'\]"):
        dr.build(tmp_path, missing={"libcudaa"})
    assert not tmp_path.joinpath("driver").exists()


def test_a_process_that_built_a_root_leaves_no_compiled_objects_behind(tmp_path: Path) -> None:
    """Test workers build roots and never call cleanup(): they had left a directory of
    compiled objects in /tmp each (141 in a day of test runs)."""
    script = (
        "import sys; from pathlib import Path; from services.local import driverroot as dr; "
        "dr.build(Path(sys.argv[1])); from services.local import driverfiles; "
        "print(driverfiles._compiled_dir())"
    )
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "root")],
        cwd=repo, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    compiled = Path(done.stdout.strip())
    assert compiled.name.startswith("gpudra-fake-elf-")
    assert (tmp_path / "root").is_dir() and not compiled.exists()
