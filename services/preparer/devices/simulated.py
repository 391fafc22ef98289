"""Device operations on a simulated node.

MIG devices are created and destroyed in the simulated NVML state through the
bus request ``dra.sim.<node>`` that discovery answers, so a MIG device the
preparer makes shows up in discovery's inventory exactly as on a real node.
What a real node keeps in the kernel and the driver outside NVML's MIG tables
(compute modes, time slices, MPS daemon processes, PCI driver bindings) is
kept here, in one node-local file next to the checkpoint
(``<plugin dir>/simulated-host.json``), so it survives a preparer restart as
it would survive on a real host.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.bus.failures import RequestFailed
from services.core.model.schemas import Gpu, MigPlacement, MigProfile, SimMigReply, SimMigRequest
from services.preparer.cdigen.caps import TableCaps
from services.preparer.cdigen.devfs import DevFs, HostDevFs, dev_root_of
from services.preparer.cdigen.generator import Generator, Options
from services.preparer.checkpoint import MigState, MpsState, VfioState
from services.preparer.devices import simroot
from services.preparer.devices.base import DeviceOpError, MpsRequest
from services.preparer.fsutil import atomic_write
from services.preparer.inventory import InventoryView

STATE_FILE = "simulated-host.json"
SIM_DRIVER_ROOT = "simulated-driver-root"


class SimHost(msgspec.Struct, kw_only=True):
    """Host-side GPU state of a simulated node (outside NVML's MIG tables)."""

    compute_mode: dict[str, str] = {}  # GPU uuid -> DEFAULT / EXCLUSIVE_PROCESS
    time_slice: dict[str, str] = {}  # GPU uuid -> Default / Short / Medium / Long
    mps: dict[str, MpsState] = {}  # daemon id -> daemon
    pci_driver: dict[str, str] = {}  # PCI bus id -> driver, when not "nvidia"


class SimulatedOps:
    def __init__(
        self,
        bus: Bus,
        node: str,
        inventory: InventoryView,
        plugin_dir: Path,
        *,
        request_timeout: float = 10.0,
        settle_timeout: float = 5.0,
        driver_root: Path | None = None,
        host_driver_root: str = "",
        hook_path: str = "",
        dev_root: str = "",
    ) -> None:
        self.bus = bus
        self.node = node
        self.inventory = inventory
        self.plugin_dir = plugin_dir
        self.path = plugin_dir / STATE_FILE
        self.request_timeout = request_timeout
        self.settle_timeout = settle_timeout
        self._lock = asyncio.Lock()
        # No driver root given: a simulated installation under the plugin directory.
        self.sim_root = driver_root is None
        root = str(driver_root or plugin_dir / SIM_DRIVER_ROOT)
        # Device nodes are simulated unless a real dev root is given (a fake node's, in tests).
        real_dev = dev_root or ("" if self.sim_root else dev_root_of(root))
        fs: DevFs = (
            HostDevFs(real_dev) if real_dev not in ("", "/") else simroot.SimDevFs(self._node_facts)
        )
        options = Options(
            driver_root=root,
            host_driver_root=host_driver_root or root,
            hook_path=hook_path
            or os.path.join(host_driver_root or root, "usr/bin/nvidia-cdi-hook"),
        )
        self._cdigen = Generator(options, fs, TableCaps(simroot.CAPS_MAJOR), self._iommufd)
        self._built = ""
        self.host = (
            msgspec.json.decode(self.path.read_bytes(), type=SimHost)
            if self.path.exists()
            else SimHost()
        )

    # ------------------------------------------------------------ facts

    def cdigen(self) -> Generator:
        """The CDI generator over this node's (simulated) driver installation."""
        inv = self.inventory.current
        version = inv.driver_version if inv else ""
        if self.sim_root and version and version != self._built:
            simroot.build(Path(self._cdigen.options.driver_root), version)
            self._built = version
        return self._cdigen

    def _node_facts(self) -> tuple[set[int], bool]:
        inv = self.inventory.current
        if inv is None:
            return set(), False
        return {g.minor for g in inv.gpus}, self._iommufd()

    def _iommufd(self) -> bool:
        inv = self.inventory.current
        return inv is not None and any(
            g.vfio is not None and g.vfio.iommu_fd_enabled for g in inv.gpus
        )

    # ------------------------------------------------------------ host state

    async def _save(self) -> None:
        data = msgspec.json.encode(self.host)
        await asyncio.to_thread(atomic_write, self.path, data, mode=0o600)

    async def set_time_slice(self, gpu_uuids: list[str], interval: str) -> None:
        async with self._lock:
            for uuid in gpu_uuids:
                self.host.compute_mode.pop(uuid, None)  # DEFAULT
                if interval == "Default":
                    self.host.time_slice.pop(uuid, None)
                else:
                    self.host.time_slice[uuid] = interval
            await self._save()

    # ------------------------------------------------------------ MIG

    async def _sim(self, request: SimMigRequest, what: str) -> SimMigReply:
        try:
            reply = await self.bus.request(
                subjects.sim_control(self.node), request, SimMigReply, self.request_timeout
            )
        except RequestFailed as exc:
            raise DeviceOpError(f"{what}: simulated NVML did not answer ({exc})") from exc
        return reply

    async def create_mig(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> MigState:
        what = (
            f"creating MIG device {profile.name} at placement {placement.start} on GPU {gpu.minor}"
        )
        reply = await self._sim(
            SimMigRequest(
                op="create",
                gpu_uuid=gpu.uuid,
                gi_profile_id=profile.gi_profile_id,
                placement_start=placement.start,
            ),
            what,
        )
        if reply.error or reply.device is None:
            raise DeviceOpError(f"{what}: {reply.error or 'no device in the reply'}")
        device = reply.device
        await self._settle(lambda inv_uuids: device.uuid in inv_uuids)
        return MigState.of(gpu, device, created=True)

    async def destroy_mig(self, mig: MigState) -> None:
        what = f"destroying MIG device {mig.uuid} (GPU {mig.parent_minor} GI {mig.gi_id})"
        reply = await self._sim(
            SimMigRequest(op="destroy", gpu_uuid=mig.parent_uuid, gi_id=mig.gi_id, ci_id=mig.ci_id),
            what,
        )
        if reply.error:
            raise DeviceOpError(f"{what}: {reply.error}")
        await self._settle(lambda inv_uuids: mig.uuid not in inv_uuids)

    async def live_migs(self) -> list[MigState]:
        inv = self.inventory.current
        if inv is None:
            return []
        return [MigState.of(g, m) for g in inv.gpus for m in g.mig_devices]

    async def _settle(self, check: Callable[[set[str]], bool]) -> None:
        """Wait (bounded) until discovery's inventory reflects a MIG change we made."""
        deadline = time.monotonic() + self.settle_timeout
        while time.monotonic() < deadline:
            inv = self.inventory.current
            uuids = {m.uuid for g in inv.gpus for m in g.mig_devices} if inv else set()
            if check(uuids):
                return
            await self.inventory.wait_for(self.inventory.revision, deadline - time.monotonic())

    # ------------------------------------------------------------ MPS

    def _mps_dirs(self, daemon_id: str) -> tuple[Path, Path, Path, Path]:
        root = self.plugin_dir / "mps" / daemon_id
        return root, root / "pipe", root / "shm", root / "log"

    async def start_mps(self, request: MpsRequest) -> MpsState:
        async with self._lock:
            existing = self.host.mps.get(request.daemon_id)
            if existing is not None:
                return existing
            root, pipe, shm, logs = self._mps_dirs(request.daemon_id)
            for d in (pipe, shm, logs):
                d.mkdir(parents=True, exist_ok=True)
            state = MpsState(
                daemon_id=request.daemon_id,
                root_dir=str(root),
                pipe_dir=str(pipe),
                shm_dir=str(shm),
                log_dir=str(logs),
                device_uuids=request.device_uuids,
                gpu_uuids=request.gpu_uuids,
                active_thread_percentage=request.active_thread_percentage,
                pinned_memory_limits_mib=request.pinned_memory_limits_mib,
            )
            for uuid in request.gpu_uuids:
                self.host.compute_mode[uuid] = "EXCLUSIVE_PROCESS"
            self.host.mps[request.daemon_id] = state
            await self._save()
            return state

    async def stop_mps(self, state: MpsState) -> None:
        async with self._lock:
            daemon = self.host.mps.pop(state.daemon_id, None)
            if daemon is not None:
                still_used = {u for d in self.host.mps.values() for u in d.gpu_uuids}
                for uuid in list(self.host.compute_mode):
                    if uuid not in still_used:
                        self.host.compute_mode.pop(uuid)
                await self._save()
            shutil.rmtree(self._mps_dirs(state.daemon_id)[0], ignore_errors=True)

    async def mps_daemons(self) -> list[MpsState]:
        return list(self.host.mps.values())

    # ------------------------------------------------------------ VFIO

    async def bind_vfio(self, gpu: Gpu) -> VfioState:
        if gpu.vfio is None:
            raise DeviceOpError(f"GPU {gpu.minor} ({gpu.pci_bus_id}) has no VFIO support")
        async with self._lock:
            previous = self.host.pci_driver.get(gpu.pci_bus_id, "nvidia")
            self.host.pci_driver[gpu.pci_bus_id] = "vfio-pci"
            await self._save()
        return VfioState(
            pci_bus_id=gpu.pci_bus_id,
            iommu_group=gpu.vfio.iommu_group,
            previous_driver=previous if previous != "vfio-pci" else "nvidia",
            iommufd_dev=f"vfio{gpu.minor}",  # the cdev number vfio-pci would give it
        )

    async def unbind_vfio(self, state: VfioState) -> None:
        async with self._lock:
            if self.host.pci_driver.pop(state.pci_bus_id, None) is not None:
                await self._save()

    async def close(self) -> None:
        return None
