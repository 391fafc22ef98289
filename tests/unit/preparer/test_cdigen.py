"""The CDI generator's parts: SONAMEs, the ld.so.cache, library lookup, versions, bad roots.

Libraries here are real ELF files: the simulated backend's minimal ones, and
where root and a C compiler are at hand, the fake installation's compiled
ones with the ld.so.cache that the real ``ldconfig -r`` wrote.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.local import driverfiles, driverroot
from services.preparer.cdigen import driver, elf, ldcache
from services.preparer.cdigen.model import CdiGenError
from services.preparer.devices import simroot

needs_root = pytest.mark.skipif(
    driverroot.unavailable() is not None, reason=str(driverroot.unavailable())
)


def test_the_soname_of_a_minimal_shared_object(tmp_path: Path) -> None:
    lib = tmp_path / "libfoo.so.1.2.3"
    lib.write_bytes(simroot.shared_object("libfoo.so.1"))
    assert elf.soname(str(lib)) == "libfoo.so.1"


@pytest.mark.parametrize(
    "blob",
    [b"", b"not an elf at all" * 8, b"\x7fELF" + bytes(3), simroot.shared_object("x.so")[:70]],
)
def test_a_file_that_is_not_a_readable_elf_is_an_elf_error(tmp_path: Path, blob: bytes) -> None:
    lib = tmp_path / "libbad.so.1"
    lib.write_bytes(blob)
    with pytest.raises(elf.ElfError):
        elf.soname(str(lib))


def test_a_dynamic_section_pointing_past_the_sections_is_named(tmp_path: Path) -> None:
    blob = bytearray(simroot.shared_object("libfoo.so.1"))
    sh_at = int.from_bytes(blob[0x28:0x30], "little")
    link_at = sh_at + 2 * 64 + 40  # .dynamic's sh_link
    blob[link_at : link_at + 4] = (99).to_bytes(4, "little")
    lib = tmp_path / "libfoo.so.1"
    lib.write_bytes(bytes(blob))
    with pytest.raises(elf.ElfError, match="links to section 99"):
        elf.soname(str(lib))


@pytest.mark.parametrize("blob", [b"", b"glibc-ld.so.cache1.1", b"ld.so-1.7.0" + bytes(40)])
def test_a_malformed_ldcache_is_empty(tmp_path: Path, blob: bytes) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ld.so.cache").write_bytes(blob)
    assert ldcache.libraries64(str(tmp_path)) == []
    assert ldcache.libraries64(str(tmp_path / "missing")) == []


def test_no_libraries_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    with pytest.raises(CdiGenError, match="no NVIDIA driver libraries"):
        driver.find(str(tmp_path))
    with pytest.raises(CdiGenError, match=r"libcuda\.so\.570\.1\.2"):
        driver.find(str(tmp_path), "570.1.2")


def test_the_version_comes_from_the_library_names_without_nvml(tmp_path: Path) -> None:
    simroot.build(tmp_path, "570.124.06")
    inst = driver.find(str(tmp_path))
    assert (inst.version, inst.lib_dir) == ("570.124.06", "/usr/lib/x86_64-linux-gnu")


@needs_root
def test_the_compiled_libraries_carry_the_drivers_sonames(tmp_path: Path) -> None:
    root = driverroot.build(tmp_path / "node")
    for lib in driverfiles.DRIVER_LIBRARIES:
        path = root.lib_dir / lib.subdir / f"{lib.name}.{root.version}"
        assert elf.soname(str(path)) == (lib.soname or path.name)


@needs_root
def test_ldconfigs_cache_is_read_and_finds_libraries_outside_the_search_folders(
    tmp_path: Path,
) -> None:
    root = driverroot.build(tmp_path / "node")
    cached = ldcache.libraries64(str(root.driver_root))
    assert str(root.lib_dir / "libcuda.so.1") in cached
    moved = root.driver_root / "opt/nvidia/lib"
    moved.parent.mkdir(parents=True)
    shutil.move(root.lib_dir, moved)
    (root.driver_root / "etc/ld.so.conf").write_text("/opt/nvidia/lib\n")
    ldconfig = shutil.which("ldconfig") or "/usr/sbin/ldconfig"
    subprocess.run([ldconfig, "-r", str(root.driver_root)], check=True)
    inst = driver.find(str(root.driver_root), root.version)
    assert (inst.version, inst.lib_dir) == (root.version, "/opt/nvidia/lib")
    found = driver.libraries(inst)
    assert f"/opt/nvidia/lib/libcuda.so.{root.version}" in {m.path for m in found.mounts}
    assert "NVIDIA_CTK_LIBCUDA_DIR=/opt/nvidia/lib" in found.env


@needs_root
def test_nvmls_version_picks_the_running_driver_over_a_stale_one(tmp_path: Path) -> None:
    root = driverroot.build(tmp_path / "node", stale_version="550.54.15")
    assert driver.find(str(root.driver_root), root.version).version == root.version
    paths = {
        m.path for m in driver.libraries(driver.find(str(root.driver_root), root.version)).mounts
    }
    assert not [p for p in paths if "550.54.15" in p]
    os.remove(root.lib_dir / f"libcuda.so.{root.version}")
    os.remove(root.lib_dir / f"libnvidia-ml.so.{root.version}")
    with pytest.raises(CdiGenError, match=r"found libcuda\.so\.550\.54\.15"):
        driver.find(str(root.driver_root), root.version)


def test_the_host_root_rewrite_is_the_toolkits() -> None:
    from services.preparer.cdigen import transform

    edits: dict[str, Any] = {
        "deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/x", "hostPath": "/d/dev/x"}],
        "mounts": [{"hostPath": "/d/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/a"}],
        "hooks": [
            {"hookName": "createContainer", "path": "/d/usr/bin/nvidia-cdi-hook",
             "args": ["nvidia-cdi-hook", "create-symlinks", "--link", "/d/a::/d/b"]},
        ],
    }  # fmt: skip
    transform.host_root(edits, "/d", "/run/nvidia/driver")
    # Every node names its host path; paths outside the root stay.
    assert [n["hostPath"] for n in edits["deviceNodes"]] == [
        "/dev/nvidia0", "/run/nvidia/driver/dev/x",
    ]  # fmt: skip
    assert edits["mounts"][0]["hostPath"] == "/run/nvidia/driver/usr/lib/libcuda.so.1"
    # The hook runs on the host; its arguments are container paths (createContainer).
    assert edits["hooks"][0]["path"] == "/run/nvidia/driver/usr/bin/nvidia-cdi-hook"
    assert edits["hooks"][0]["args"][-1] == "/d/a::/d/b"
    same = {"deviceNodes": [{"path": "/dev/nvidia0"}]}
    transform.host_root(same, "/", "/")
    assert same == {"deviceNodes": [{"path": "/dev/nvidia0"}]}  # no rewrite, no hostPath
