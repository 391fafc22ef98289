"""What is already allocated: devices in use, shared allocations and the capacity they consume.

Built from claims whose ``status.allocation`` is set, and grown by each new
allocation. Results with ``adminAccess`` do not make a device busy; with
DRAConsumableCapacity a result carrying a ``shareID`` is a share of a device
(it consumes capacity) rather than exclusive use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.allocator.structured import capacity
from services.core.kube.quantity import Quantity
from services.core.kube.resource import AllocationResult

DeviceID = tuple[str, str, str]  # driver, pool, device


@dataclass(slots=True)
class AllocatedState:
    devices: set[DeviceID] = field(default_factory=set)
    shares: set[tuple[DeviceID, str]] = field(default_factory=set)
    shared_devices: set[DeviceID] = field(default_factory=set)
    consumed: dict[DeviceID, capacity.Consumed] = field(default_factory=dict)
    version: int = 0  # bumped on every change, for caches keyed on the state

    def add(self, allocation: AllocationResult | None, consumable_capacity: bool) -> None:
        results = allocation.devices.results if allocation and allocation.devices else None
        for result in results or []:
            if result.admin_access:
                continue
            device_id = (result.driver, result.pool, result.device)
            if consumable_capacity and result.share_id is not None:
                self.shares.add((device_id, result.share_id))
                self.shared_devices.add(device_id)
                if result.consumed_capacity is not None:
                    amounts = {k: Quantity.parse(v) for k, v in result.consumed_capacity.items()}
                    capacity.add_into(self.consumed.setdefault(device_id, {}), amounts)
                continue
            self.devices.add(device_id)
        self.version += 1

    def is_allocated(self, device_id: DeviceID) -> bool:
        """IsDeviceAllocated: in exclusive use, shared, or with consumed capacity."""
        return (
            device_id in self.devices
            or device_id in self.shared_devices
            or device_id in self.consumed
        )
