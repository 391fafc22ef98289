"""Device operations on a real node: nvidia-smi, NVML, sysfs and MPS daemon processes."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from services.core.schemas import Gpu, MigPlacement, MigProfile
from services.preparer.cdi import DriverFile, NodeFacts, stat_char_device
from services.preparer.checkpoint import MigState, MpsState, VfioState
from services.preparer.devices import commands
from services.preparer.devices.base import MpsRequest
from services.preparer.devices.mps import MpsDaemons
from services.preparer.devices.nvml import NvmlMig
from services.preparer.devices.vfio import VfioSysfs

log = logging.getLogger(__name__)

# nvidia-smi compute-policy --set-timeslice takes the interval's index.
TIME_SLICES = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}

LIBRARY_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib64",
)
# Compute libraries the CUDA user-mode stack loads (what nvcdi mounts for compute).
LIBRARIES = (
    "libcuda.so.*",
    "libcudadebugger.so.*",
    "libnvidia-ml.so.*",
    "libnvidia-ptxjitcompiler.so.*",
    "libnvidia-nvvm.so.*",
    "libnvidia-gpucomp.so.*",
    "libnvidia-allocator.so.*",
    "libnvidia-cfg.so.*",
    "libnvidia-opencl.so.*",
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)


def driver_files(driver_root: Path) -> list[DriverFile]:
    """The driver's compute libraries and tools under ``driver_root`` (mounted where found)."""
    found: list[DriverFile] = []
    for sub in LIBRARY_DIRS:
        directory = driver_root / sub
        if not directory.is_dir():
            continue
        for pattern in LIBRARIES:
            for path in sorted(directory.glob(pattern)):
                if path.is_file() and not path.is_symlink():
                    found.append(_mount(driver_root, path))
    for name in BINARIES:
        for sub in ("usr/bin", "bin"):
            path = driver_root / sub / name
            if path.is_file():
                found.append(_mount(driver_root, path))
                break
    return found


def _mount(driver_root: Path, path: Path) -> DriverFile:
    inside = "/" + str(path.relative_to(driver_root))
    return DriverFile(host_path=str(path), container_path=inside)


def caps_major(proc: Path = Path("/proc")) -> int | None:
    """The char major of nvidia-caps from /proc/devices (None when the driver has none)."""
    try:
        lines = (proc / "devices").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1] == "nvidia-caps" and parts[0].isdigit():
            return int(parts[0])
    return None


class RealOps:
    def __init__(
        self,
        plugin_dir: Path,
        *,
        driver_root: Path = Path("/"),
        sysfs: Path = Path("/sys"),
        proc: Path = Path("/proc"),
        mount_shm: bool = True,
    ) -> None:
        self.nvidia_smi = commands.find_tool("nvidia-smi", driver_root)
        self.mps = MpsDaemons(
            plugin_dir / "mps",
            commands.find_tool("nvidia-cuda-mps-control", driver_root),
            mount_shm=mount_shm,
        )
        self.vfio = VfioSysfs(sysfs)
        self._nvml: NvmlMig | None = None
        self._facts = NodeFacts(
            driver_files=driver_files(driver_root),
            caps_major=caps_major(proc),
            char_device=stat_char_device,
        )

    @property
    def nvml(self) -> NvmlMig:
        if self._nvml is None:
            self._nvml = NvmlMig()
        return self._nvml

    def facts(self) -> NodeFacts:
        return self._facts

    async def _compute_mode(self, gpu_uuids: list[str], mode: str) -> None:
        for uuid in gpu_uuids:
            await commands.run(
                [self.nvidia_smi, "-i", uuid, "-c", mode], what=f"GPU {uuid}: compute mode {mode}"
            )

    async def set_time_slice(self, gpu_uuids: list[str], interval: str) -> None:
        await self._compute_mode(gpu_uuids, "DEFAULT")
        for uuid in gpu_uuids:
            await commands.run(
                [
                    self.nvidia_smi,
                    "compute-policy",
                    "-i",
                    uuid,
                    "--set-timeslice",
                    str(TIME_SLICES[interval]),
                ],
                what=f"GPU {uuid}: time slice {interval}",
            )

    async def create_mig(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> MigState:
        return await asyncio.to_thread(self.nvml.create, gpu, profile, placement)

    async def destroy_mig(self, mig: MigState) -> None:
        await asyncio.to_thread(self.nvml.destroy, mig)

    async def live_migs(self) -> list[MigState]:
        return await asyncio.to_thread(self.nvml.live)

    async def start_mps(self, request: MpsRequest) -> MpsState:
        await self._compute_mode(request.gpu_uuids, "EXCLUSIVE_PROCESS")
        return await self.mps.start(request)

    async def stop_mps(self, state: MpsState) -> None:
        await self.mps.stop(state)
        if state.gpu_uuids:
            await self._compute_mode(state.gpu_uuids, "DEFAULT")

    async def mps_daemons(self) -> list[MpsState]:
        return self.mps.list()

    async def bind_vfio(self, gpu: Gpu) -> VfioState:
        return await asyncio.to_thread(self.vfio.bind, gpu.pci_bus_id)

    async def unbind_vfio(self, state: VfioState) -> None:
        await asyncio.to_thread(self.vfio.unbind, state)

    async def close(self) -> None:
        if self._nvml is not None:
            self._nvml.shutdown()
