"""Device operations on a real node: nvidia-smi, NVML, sysfs and MPS daemon processes."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from services.core.model.schemas import Gpu, MigPlacement, MigProfile
from services.preparer.cdigen import hooks
from services.preparer.cdigen.caps import ProcCaps
from services.preparer.cdigen.devfs import HostDevFs, dev_root_of
from services.preparer.cdigen.generator import Generator, Options
from services.preparer.checkpoint import MigState, MpsState, VfioState
from services.preparer.devices import commands
from services.preparer.devices.base import MpsRequest
from services.preparer.devices.mps import MpsDaemons
from services.preparer.devices.nvml import NvmlMig
from services.preparer.devices.vfio import VfioSysfs

log = logging.getLogger(__name__)

# nvidia-smi compute-policy --set-timeslice takes the interval's index.
TIME_SLICES = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}


def _iommufd(dev_root: str) -> bool:
    """IOMMUFD is on when the host has /dev/iommu (the reference's check)."""
    return os.path.exists(os.path.join(dev_root, "dev/iommu"))


class RealOps:
    def __init__(
        self,
        plugin_dir: Path,
        *,
        driver_root: Path = Path("/"),
        host_driver_root: str = "/",
        dev_root: str = "",
        hook_path: str = hooks.DEFAULT_PATH,
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
        devs = HostDevFs(dev_root or dev_root_of(str(driver_root)), str(sysfs))
        options = Options(
            driver_root=str(driver_root),
            host_driver_root=host_driver_root,
            hook_path=hook_path,
            sysfs=str(sysfs),
        )
        self._cdigen = Generator(options, devs, ProcCaps(str(proc)), lambda: _iommufd(devs.root))

    @property
    def nvml(self) -> NvmlMig:
        if self._nvml is None:
            self._nvml = NvmlMig()
        return self._nvml

    def cdigen(self) -> Generator:
        return self._cdigen

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
