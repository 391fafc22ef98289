"""A fake NVIDIA driver installation on disk, real enough for NVIDIA's own CDI generator.

CDI tests and the real nodes (:mod:`services.local.node`) need what a GPU node
has, not what our generator expects: the driver's whole library set as real ELF
shared objects with versioned sonames
(compiled here with ``cc``), the symlinks an install has and lacks, an
``etc/ld.so.cache`` written by the real ``ldconfig -r``, the driver's binaries,
GSP firmware, IPC sockets, a ``/proc`` stand-in, a sysfs for the PCI devices
and real character device nodes made with ``mknod``. The GPUs are the
simulated fleet's (``services.discovery``), so the NVML facts written to
``facts.json`` (for the reference generator's mock NVML) and the files on disk
describe the same node.

Layout under ``base``::

    driver/   the driver root: usr/lib/<multiarch>, usr/bin, lib/firmware, etc/ld.so.cache, run/
    host/     the dev root (host/dev/..., or driver/dev/...) and host/sys (PCI devices)
    proc/     devices, driver/nvidia/{version,gpus,capabilities}, driver/nvidia-caps/mig-minors
    facts.json

Building needs root (mknod, ``ldconfig -r`` chroots): :func:`unavailable`
says why not, for a clear ``pytest.skip``. Leave pieces out with ``missing``
(see :data:`PIECES`) to build the broken installations bad-input tests need.

What an installation is made of (paths, version, GPUs, ``missing``):
:mod:`services.local.driverlayout`; the GPUs and their NVML facts:
:mod:`services.local.drivergpus`; the files: :mod:`services.local.driverfiles`;
device nodes, sysfs and /proc: :mod:`services.local.driverkernel`. Those builders
take the layout, never this module.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from services.discovery.fleet import get_fleet
from services.local import driverfiles, drivergpus, driverkernel
from services.local.driverlayout import DriverLayout, FakeGpu

DEFAULT_VERSION = "580.95.05"
DEFAULT_CUDA = 13000  # NVML's integer CUDA driver version for 580 (13.0)
HOOK = "/usr/bin/nvidia-cdi-hook"  # where nvidia-cdi-hook lives, relative to the driver root

# What ``missing`` may name.
PIECES = frozenset(
    {
        "libraries",  # no NVIDIA library at all
        "ldcache",  # no etc/ld.so.cache
        "soname-links",  # ldconfig -X: no libcuda.so.1 -> libcuda.so.<version>
        "firmware",
        "binaries",  # none of BINARIES (nvidia-cdi-hook included)
        "nvidia-cdi-hook",  # only the hook
        "persistenced-socket",
        "proc",
        "gpu-nodes",  # /dev/nvidia<minor>
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
        "caps-nodes",  # /dev/nvidia-caps/*
        "vfio-nodes",  # /dev/vfio/*, /dev/iommu
    }
)


@dataclass(frozen=True, kw_only=True)
class DriverRoot(DriverLayout):
    """A built fake installation; paths are absolute on this machine."""

    base: Path
    facts_file: Path  # NVML facts for the reference generator's mock NVML
    fleet: str

    @property
    def hook_path(self) -> str:
        """nvidia-cdi-hook's path on the host."""
        return str(self.driver_root) + HOOK

    @property
    def lib_dir(self) -> Path:
        return self.driver_root / driverfiles.LIB_DIR

    def libraries(self) -> list[Path]:
        """The driver's versioned library files (what a generator must mount)."""
        if "libraries" in self.missing:
            return []
        return [
            self.lib_dir / lib.subdir / f"{lib.name}.{self.version}"
            for lib in driverfiles.DRIVER_LIBRARIES
        ]

    def gpu(self, index: int) -> FakeGpu:
        return self.gpus[index]


def unavailable() -> str | None:
    """Why a fake root cannot be built here (None: it can)."""
    if os.geteuid() != 0:
        return "the fake driver root needs root (mknod, ldconfig -r chroots); CI runs as uid 0"
    for tool in ("cc", "ldconfig"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"the fake driver root needs {tool}"
    return None


def build(
    base: Path,
    *,
    fleet: str = "dgx-a100",
    version: str = DEFAULT_VERSION,
    cuda_version: int = DEFAULT_CUDA,
    mig: bool = True,
    iommufd: bool = False,
    fabricmanager: bool = False,
    host_mps: bool = False,
    stale_version: str | None = None,
    dev_in_driver_root: bool = False,
    missing: Iterable[str] = (),
    node: str = "node-1",
    seed: int = 0,
) -> DriverRoot:
    """Build the installation under ``base`` (created; must not hold another one).

    ``mig`` keeps the fleet's static MIG layouts (off: every GPU whole);
    ``iommufd`` gives the host /dev/iommu and per-device vfio cdevs;
    ``fabricmanager`` and ``host_mps`` add those daemons' IPC files;
    ``stale_version`` leaves a previous driver's libcuda/libnvidia-ml behind;
    ``dev_in_driver_root`` puts dev/ inside the driver root (the host's / as the
    driver root, the chart's default) instead of under ``host/``.
    """
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    gone = frozenset(missing)
    if unknown := gone - PIECES:
        raise ValueError(f"missing: unknown pieces {sorted(unknown)}; known: {sorted(PIECES)}")
    root = DriverRoot(
        base=base,
        driver_root=base / "driver",
        dev_root=base / "driver" if dev_in_driver_root else base / "host",
        proc=base / "proc",
        sysfs=base / "host" / "sys",
        facts_file=base / "facts.json",
        version=version,
        cuda_version=cuda_version,
        fleet=fleet,
        iommufd=iommufd,
        gpus=drivergpus.gpus(get_fleet(fleet), node, seed, mig),
        missing=gone,
    )
    for d in (root.driver_root, root.dev_root / "dev", root.proc, root.sysfs):
        d.mkdir(parents=True)
    driverfiles.libraries(root, stale_version)
    driverfiles.binaries(root)
    driverfiles.firmware(root)
    driverfiles.sockets(root, fabricmanager, host_mps)
    driverkernel.device_nodes(root)
    driverkernel.sysfs(root)
    if "proc" not in gone:
        driverkernel.proc(root)
    root.facts_file.write_text(json.dumps(drivergpus.facts(root), indent=1))
    return root
