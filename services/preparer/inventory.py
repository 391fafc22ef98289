"""What an allocated device name denotes on this node, found in the node's inventory.

The scheduler allocates names (``gpu-3``, ``gpu-0-mig-1g10gb-19-6``,
``gpu-vfio-2``); preparing needs the hardware behind them. Discovery keeps the
node's NVML view in the ``inventory`` bucket; the preparer follows it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.kit import supervisor
from services.core.model import nvidia
from services.core.model.refusal import ClaimRefused
from services.core.model.schemas import Gpu, MigDevice, MigPlacement, MigProfile, NodeInventory

log = logging.getLogger(__name__)


class DeviceNotFound(ClaimRefused, LookupError):
    """An allocated device that this node does not have."""


@dataclass(frozen=True)
class Target:
    """One allocated device and the hardware it names."""

    name: str
    kind: nvidia.DeviceType
    gpu: Gpu
    profile: MigProfile | None = None  # MIG: the GPU-instance profile
    placement: MigPlacement | None = None  # MIG: where in the GPU
    live: MigDevice | None = None  # MIG: the device as NVML lists it now, if it exists


def locate(inv: NodeInventory, name: str) -> Target:
    """The hardware behind device ``name``; :class:`DeviceNotFound` says what is missing."""
    try:
        ident = nvidia.parse_device_name(name)
    except ValueError as exc:
        raise DeviceNotFound(f"device {name!r} is not one of ours: {exc}") from exc
    where = f"device {name!r} is not on node {inv.node}"
    if ident.kind == nvidia.VFIO_TYPE:
        twins = nvidia.vfio_order(inv.gpus)  # the publisher numbers twins the same way
        assert ident.vfio_index is not None
        if ident.vfio_index >= len(twins) or twins[ident.vfio_index].vfio is None:
            raise DeviceNotFound(f"{where}: GPU {ident.vfio_index} in PCI order has no VFIO twin")
        return Target(name, nvidia.VFIO_TYPE, twins[ident.vfio_index])
    gpu = next((g for g in inv.gpus if g.minor == ident.minor), None)
    if gpu is None:
        raise DeviceNotFound(f"{where}: no GPU with minor {ident.minor}")
    if ident.kind == nvidia.GPU_TYPE:
        return Target(name, nvidia.GPU_TYPE, gpu)
    profile = next((p for p in gpu.mig_profiles if p.gi_profile_id == ident.gi_profile_id), None)
    if profile is None or nvidia.rfc1123(profile.name.replace(".", "")) != ident.profile_token:
        raise DeviceNotFound(
            f"{where}: GPU {gpu.minor} has no MIG profile {ident.profile_token} "
            f"with GPU-instance profile id {ident.gi_profile_id}"
        )
    placement = next((p for p in profile.placements if p.start == ident.placement_start), None)
    live = find_live_mig(gpu, profile.gi_profile_id, ident.placement_start or 0)
    if placement is None and live is not None:
        placement = live.placement
    if placement is None:
        raise DeviceNotFound(
            f"{where}: profile {profile.name} on GPU {gpu.minor} has no placement "
            f"starting at {ident.placement_start}"
        )
    return Target(name, nvidia.MIG_TYPE, gpu, profile, placement, live)


def find_live_mig(gpu: Gpu, gi_profile_id: int, start: int) -> MigDevice | None:
    return next(
        (
            m
            for m in gpu.mig_devices
            if m.gi_profile_id == gi_profile_id and m.placement.start == start
        ),
        None,
    )


class InventoryView:
    """The latest inventory of one node, kept current from the ``inventory`` bucket."""

    def __init__(self, bus: Bus, node: str) -> None:
        self.bus = bus
        self.node = node
        self.current: NodeInventory | None = None
        self.revision = 0
        self._changed = asyncio.Condition()

    async def start(self) -> None:
        got = await self.bus.kv_get(
            subjects.INVENTORY_BUCKET, subjects.inventory_key(self.node), NodeInventory
        )
        if got is not None:
            self.current, self.revision = got
        supervisor.current().spawn("inventory-follow", self._follow)

    async def stop(self) -> None:
        await supervisor.current().cancel("inventory-follow")

    async def _follow(self) -> None:
        key = subjects.inventory_key(self.node)
        async for update in self.bus.watch_kv(subjects.INVENTORY_BUCKET, NodeInventory, key):
            if update.value is None:
                continue
            async with self._changed:
                self.current, self.revision = update.value, update.revision
                self._changed.notify_all()

    def require(self) -> NodeInventory:
        if self.current is None:
            raise DeviceNotFound(
                f"no inventory for node {self.node} yet (is discovery running for it?)"
            )
        return self.current

    async def wait_for(self, revision: int, timeout: float) -> bool:
        """Wait until the inventory is newer than ``revision``; False on timeout."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.revision > revision), timeout
                )
            except TimeoutError:
                return False
        return True
