"""A simulated node's driver root: real files laid out as the NVIDIA driver installs them.

The simulated backend goes through the same CDI generator as a real node, so
it needs a driver installation to discover: versioned libraries (minimal ELF
shared objects carrying their SONAME) with their ``.so.1`` and ``.so`` links,
the tools, GSP firmware, the persistenced socket (a plain file stands in for
it) and the ``nvidia-cdi-hook``. Built once per driver version under the
plugin directory; only device nodes stay simulated (see :class:`SimDevFs`).
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

from services.preparer.cdigen.devfs import NodeStat
from services.preparer.fsutil import atomic_write

LIB_DIR = "usr/lib/x86_64-linux-gnu"
LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-cfg.so",
    "libnvidia-opencl.so",
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-cdi-hook",
)
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
MARKER = ".gpudra-simulated-driver"
STUB = "#!/bin/sh\necho 'simulated NVIDIA driver tool' >&2\nexit 0\n"


def build(root: Path, version: str) -> Path:
    """Lay out the driver ``version`` at ``root`` (replacing another version's files)."""
    marker = root / MARKER
    if marker.exists() and marker.read_text() == version:
        return root
    if root.exists():
        shutil.rmtree(root)
    libs = root / LIB_DIR
    libs.mkdir(parents=True)
    for name in LIBRARIES:
        soname = f"{name}.1"
        (libs / f"{name}.{version}").write_bytes(shared_object(soname))
        os.symlink(f"{name}.{version}", libs / soname)
        os.symlink(soname, libs / name)
    bin_dir = root / "usr/bin"
    bin_dir.mkdir(parents=True)
    for name in BINARIES:
        (bin_dir / name).write_text(STUB)
        os.chmod(bin_dir / name, 0o755)
    firmware = root / "lib/firmware/nvidia" / version
    firmware.mkdir(parents=True)
    for name in FIRMWARE:
        (firmware / name).write_bytes(b"simulated GSP firmware\n")
    socket = root / "run/nvidia-persistenced/socket"
    socket.parent.mkdir(parents=True)
    socket.write_bytes(b"")
    atomic_write(marker, version.encode(), mode=0o644)
    return root


def shared_object(soname: str) -> bytes:
    """The smallest ELF64 shared object whose dynamic section names ``soname``."""
    dynstr = b"\0" + soname.encode() + b"\0"
    dynamic = struct.pack("<qQqQ", 14, 1, 0, 0)  # DT_SONAME -> dynstr[1], DT_NULL
    shstrtab = b"\0.dynstr\0.dynamic\0.shstrtab\0"
    body_at = 64
    dynstr_at = body_at
    dynamic_at = dynstr_at + len(dynstr) + (-(dynstr_at + len(dynstr)) & 7)
    shstr_at = dynamic_at + len(dynamic)
    sh_at = shstr_at + len(shstrtab) + (-(shstr_at + len(shstrtab)) & 7)
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sh_at, 0, 64, 56, 0, 64, 4, 3)

    def section(name: int, kind: int, at: int, size: int, link: int, entsize: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, at, size, link, 0, 1, entsize)

    sections = bytes(64)  # the null section
    sections += section(1, 3, dynstr_at, len(dynstr), 0, 0)  # .dynstr (SHT_STRTAB)
    sections += section(9, 6, dynamic_at, len(dynamic), 1, 16)  # .dynamic -> .dynstr
    sections += section(18, 3, shstr_at, len(shstrtab), 0, 0)  # .shstrtab
    out = bytearray(header)
    for at, blob in (
        (dynstr_at, dynstr),
        (dynamic_at, dynamic),
        (shstr_at, shstrtab),
        (sh_at, sections),
    ):
        out += bytes(at - len(out)) + blob
    return bytes(out)


NVIDIA_MAJOR = 195  # the nvidia driver's registered major (nvidiaN; nvidiactl 255, modeset 254)
UVM_MAJOR = 510  # a plausible dynamic char major for nvidia-uvm
VFIO_MAJOR = 509  # likewise for vfio groups
MISC_MAJOR = 10  # /dev/vfio/vfio is misc 196; /dev/iommu a dynamic misc minor
CAPS_MAJOR = 511  # likewise for nvidia-caps
MODE = 0o666


class SimDevFs:
    """The device nodes a node with the NVIDIA driver (and vfio) would have."""

    def __init__(self, facts: Callable[[], tuple[set[int], bool]]) -> None:
        self.facts = facts  # () -> (GPU minors, whether the host has IOMMUFD), from the inventory

    @property
    def root(self) -> str:
        return "/"

    def _numbers(self, path: str) -> tuple[int, int] | None:
        fixed = {
            "/dev/nvidiactl": (NVIDIA_MAJOR, 255),
            "/dev/nvidia-modeset": (NVIDIA_MAJOR, 254),
            "/dev/nvidia-uvm": (UVM_MAJOR, 0),
            "/dev/nvidia-uvm-tools": (UVM_MAJOR, 1),
            "/dev/vfio/vfio": (MISC_MAJOR, 196),
        }
        if path in fixed:
            return fixed[path]
        minors, iommufd = self.facts()
        if path == "/dev/iommu" and iommufd:
            return MISC_MAJOR, 123
        number = path.removeprefix("/dev/nvidia")
        if number != path and number.isdigit() and int(number) in minors:
            return NVIDIA_MAJOR, int(number)
        group = path.removeprefix("/dev/vfio/")
        if group != path and group.isdigit():
            return VFIO_MAJOR, int(group)
        return None

    def find(self, path: str) -> list[str]:
        return [path] if self._numbers(path) else []

    def stat(self, host_path: str) -> NodeStat | None:
        numbers = self._numbers(host_path)
        return NodeStat(numbers[0], numbers[1], MODE) if numbers else None

    def drm_nodes(self, pci_bus_id: str) -> list[str]:
        return []

    def readlink(self, path: str) -> str | None:
        return None
