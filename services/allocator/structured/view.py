"""What one node sees: its usable pools and their devices as candidates, in the order
the search tries them (pool, slice, device)."""

from __future__ import annotations

from dataclasses import dataclass

from services.allocator.structured.counters import Consumption
from services.allocator.structured.pools import Node, Pool
from services.allocator.structured.state import DeviceID
from services.core.kube.resource import Device, ResourceSlice


@dataclass(slots=True)
class Candidate:
    """One device of one usable pool, as seen from one node."""

    pool: Pool
    slice: ResourceSlice
    device: Device
    id: DeviceID
    counters: Consumption  # what it consumes of its pool's counters


@dataclass(slots=True)
class NodeView:
    node: Node | None
    pools: list[Pool]
    candidates: list[Candidate]  # devices of complete, valid pools, in search order
    # 1.34: where the search reaches an invalid pool and must stop the claim.
    stop: tuple[int, str] | None = None
