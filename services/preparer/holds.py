"""Who holds which device of the node: prepared claims (the checkpoint) and prepares in
flight, so that two claims never get one device.

A device is held by a key: its name, and its physical GPU in ``nvidia`` or ``vfio``
mode (a GPU and its VFIO twin exclude each other; MIG devices and full GPUs of one
GPU are kept apart by the scheduler's counters, not here). A consumable share holds
``shared:<device>``, which excludes exclusive holders but not other shares, and
counts against the device's capacity (shareplan.check_fit). adminAccess holds nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

from services.core.kube.resource import DeviceRequestAllocationResult
from services.core.model import nvidia
from services.core.model.schemas import ClaimRef
from services.preparer import shareplan
from services.preparer.checkpoint import PREPARE_COMPLETED, PreparedDeviceState, ShareState
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.inventory import DeviceNotFound, InventoryView, Target, locate
from services.preparer.transaction import PrepareError


class Holds:
    def __init__(self, store: CheckpointStore, inventory: InventoryView) -> None:
        self.store = store
        self.inventory = inventory
        self._devices: dict[str, tuple[str, str]] = {}  # device -> (uid, "ns/name") preparing it
        # (device, uid, share id) -> ("ns/name", share) for shares being prepared
        self._shares: dict[tuple[str, str, str], tuple[str, ShareState]] = {}

    @contextlib.contextmanager
    def holding(
        self,
        ref: ClaimRef,
        results: Sequence[DeviceRequestAllocationResult],
        targets: Mapping[str, Target],
        plans: Mapping[str, shareplan.SharePlan],
    ) -> Iterator[None]:
        """The claim's devices and shares held against other prepares while the block
        prepares them (:meth:`reserve` refuses what another claim holds); after it, the
        claim's checkpoint entry holds them, if one was written."""
        self.reserve(ref.uid, f"{ref.namespace}/{ref.name}", results, targets, plans)
        try:
            yield
        finally:
            self.release(ref.uid)

    def reserve(
        self,
        uid: str,
        who: str,
        results: Sequence[DeviceRequestAllocationResult],
        targets: Mapping[str, Target],
        plans: Mapping[str, shareplan.SharePlan],
    ) -> None:
        """Refuse devices another claim holds (unless adminAccess) and shares that do not
        fit, then hold ours until :meth:`release`."""
        held = self.holders(exclude=uid)
        for r in results:
            if r.admin_access:
                continue
            target = targets[r.device]
            for key in share_conflict_keys(target) if r.share_id else conflict_keys(target):
                other = held.get(key)
                if other is not None:
                    raise PrepareError(
                        f"device {r.device!r} is held by claim {other} "
                        "(devices are exclusive; only adminAccess or consumable shares may "
                        "share them)"
                    )
        self._check_shares_fit(uid, who, results, plans)
        for r in results:
            if r.admin_access:
                continue
            if r.share_id is None:
                self._devices[r.device] = (uid, who)
            else:
                self._shares[(r.device, uid, r.share_id)] = (who, plans[r.share_id].state)

    def _check_shares_fit(
        self,
        uid: str,
        who: str,
        results: Sequence[DeviceRequestAllocationResult],
        plans: Mapping[str, shareplan.SharePlan],
    ) -> None:
        mine: list[tuple[str, ShareState]] = []
        for r in results:
            if r.share_id is None:
                continue
            plan = plans[r.share_id]
            others = [(w, st) for d, w, st in self.shares_on(exclude=uid) if d == r.device]
            others += [(f"{who} ({uid})", st) for d, st in mine if d == r.device]
            shareplan.check_fit(r.device, plan, others)
            mine.append((r.device, plan.state))

    def release(self, uid: str) -> None:
        for device in [d for d, (owner, _) in self._devices.items() if owner == uid]:
            del self._devices[device]
        for key in [k for k in self._shares if k[1] == uid]:
            del self._shares[key]

    def shares_on(self, exclude: str) -> list[tuple[str, str, ShareState]]:
        """(device, holder, share) for every share prepared or being prepared, but ``exclude``'s.

        A claim counts once: its checkpoint entry is complete a moment before its
        prepare, resumed, releases what it reserved (another prepare can look then)."""
        out = []
        completed = set()
        for uid, entry in self.store.claims.items():
            if uid == exclude or entry.state != PREPARE_COMPLETED:
                continue
            completed.add(uid)
            for d in entry.devices:
                if d.share is not None:
                    out.append((d.name, f"{entry.namespace}/{entry.name} ({uid})", d.share))
        for (device, owner, _), (who, state) in self._shares.items():
            if owner != exclude and owner not in completed:
                out.append((device, f"{who} ({owner}, being prepared)", state))
        return out

    def holders(self, exclude: str) -> dict[str, str]:
        """hold key -> claim, for completed claims and prepares in flight."""
        held: dict[str, str] = {}
        for uid, entry in self.store.claims.items():
            if uid == exclude or entry.state != PREPARE_COMPLETED:
                continue
            for d in entry.devices:
                if not d.admin_access:
                    for key in _state_hold_keys(d):
                        held[key] = f"{entry.namespace}/{entry.name} ({uid}, prepared)"
        for (device, uid, _), (who, _) in self._shares.items():
            if uid != exclude:
                for key in self._share_hold_keys(device):
                    held[key] = f"{who} ({uid}, being prepared)"
        for device, (uid, who) in self._devices.items():
            if uid != exclude and self.inventory.current is not None:
                for key in self._device_hold_keys(device):
                    held[key] = f"{who} ({uid}, being prepared)"
        return held

    def _share_hold_keys(self, device: str) -> list[str]:
        keys = [shared_key(device)]
        inv = self.inventory.current
        if inv is not None:
            with contextlib.suppress(DeviceNotFound):
                keys.append(f"nvidia:{locate(inv, device).gpu.pci_bus_id}")
        return keys

    def _device_hold_keys(self, device: str) -> list[str]:
        inv = self.inventory.current
        assert inv is not None
        try:
            return _hold_keys(locate(inv, device))
        except DeviceNotFound:
            return [device]

    def share_refs(self, daemon_id: str, exclude: str = "") -> list[str]:
        """The claims holding a share on ``daemon_id``'s device: its reference count,
        from the checkpoint (prepared) and from prepares in flight."""
        refs = [
            uid
            for uid, entry in self.store.claims.items()
            if uid != exclude
            and entry.state == PREPARE_COMPLETED
            and any(d.share is not None and d.share.daemon_id == daemon_id for d in entry.devices)
        ]
        for (_, owner, _), (_, state) in self._shares.items():
            if owner != exclude and state.daemon_id == daemon_id:
                refs.append(owner)
        return refs

    def shared_elsewhere(self, uid: str, device: PreparedDeviceState) -> bool:
        """Whether another claim holds a share of ``device`` (its MIG device must stay)."""
        return device.share is not None and any(
            d == device.name for d, _, _ in self.shares_on(exclude=uid)
        )

    def gpus_of_other_claims(self, uid: str) -> set[str]:
        return {
            d.gpu_uuid
            for other, e in self.store.claims.items()
            if other != uid and e.state == PREPARE_COMPLETED
            for d in e.devices
        }


def _hold_keys(target: Target) -> list[str]:
    """What preparing ``target`` holds: its name, and its GPU in nvidia or vfio mode."""
    mode = "vfio" if target.kind == nvidia.VFIO_TYPE else "nvidia"
    return [target.name, f"{mode}:{target.gpu.pci_bus_id}"]


def _state_hold_keys(device: PreparedDeviceState) -> list[str]:
    mode = "vfio" if device.kind == nvidia.VFIO_TYPE else "nvidia"
    name = shared_key(device.name) if device.share is not None else device.name
    return [name, f"{mode}:{device.pci_bus_id}"] if device.pci_bus_id else [name]


def shared_key(device: str) -> str:
    """The hold key of a device's shares: exclusive holders conflict with it, shares do not."""
    return f"shared:{device}"


def share_conflict_keys(target: Target) -> list[str]:
    """Held keys that exclude a share of ``target``: an exclusive holder, or its VFIO twin."""
    return [target.name, f"vfio:{target.gpu.pci_bus_id}"]


def conflict_keys(target: Target) -> list[str]:
    """Held keys that exclude ``target``: the same device, or its GPU in the other mode."""
    other = "nvidia" if target.kind == nvidia.VFIO_TYPE else "vfio"
    return [target.name, f"{other}:{target.gpu.pci_bus_id}", shared_key(target.name)]
