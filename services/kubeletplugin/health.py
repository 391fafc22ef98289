"""DRAResourceHealth: stream this node's device health to the kubelet.

The device list and base health come from the node's inventory (KV
``inventory``); health events on ``dra.health.<node>`` apply on top at once,
before discovery has rewritten the inventory. Every message carries the
complete list, and it is re-sent periodically because the kubelet turns a
device it has not heard about for 30 s into Unknown.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from services.core import nvidia, subjects
from services.core.access import Identity, Role
from services.core.bus import Bus
from services.core.schemas import Gpu, HealthEvent, NodeInventory
from services.proto_gen.kubelet.drahealth.v1alpha1 import api_pb2 as pb
from services.proto_gen.kubelet.drahealth.v1alpha1 import api_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = "v1alpha1.DRAResourceHealth"
RESEND_SECONDS = 10.0


class Health(enum.IntEnum):
    """The wire values; :func:`worse` orders them by severity."""

    UNKNOWN = pb.UNKNOWN
    HEALTHY = pb.HEALTHY
    UNHEALTHY = pb.UNHEALTHY


_SEVERITY = {Health.HEALTHY: 0, Health.UNKNOWN: 1, Health.UNHEALTHY: 2}


def worse(a: Health, b: Health) -> Health:
    return a if _SEVERITY[a] >= _SEVERITY[b] else b


_EVENT_HEALTH = {
    "xid": Health.UNHEALTHY,
    "gpu-lost": Health.UNHEALTHY,
    "nvml-error": Health.UNKNOWN,
    "recovered": Health.HEALTHY,
}


@dataclass(frozen=True)
class DeviceState:
    device: str
    health: Health
    since: float  # unix time the health last changed


class HealthBoard:
    """The current health of every device of one node, and a change signal."""

    def __init__(self, node: str, pool: str | None = None) -> None:
        self.node = node
        self.pool = pool or node  # the publisher's pool is the node name
        self.version = 0
        self._inventory: NodeInventory | None = None
        self._events: dict[str, Health] = {}  # gpu uuid -> health the last event said
        self._states: dict[str, DeviceState] = {}
        self._changed = asyncio.Condition()

    async def follow(self, bus: Bus, retry: float = 1.0) -> None:
        """Track the node's health events and inventory until cancelled.

        A broken inventory watch is re-opened (it replays the current value first).
        """
        discovery = Identity(Role.DISCOVERY, self.node)  # the only one that may say it
        await bus.subscribe(
            subjects.health(self.node), HealthEvent, self._on_event, sender=discovery
        )
        key = subjects.inventory_key(self.node)
        while True:
            try:
                async for update in bus.watch_kv(subjects.INVENTORY_BUCKET, NodeInventory, key):
                    await self.set_inventory(update.value)
            except Exception as exc:
                log.warning("inventory watch failed; retrying", extra={"error": str(exc)})
            await asyncio.sleep(retry)

    async def set_inventory(self, inventory: NodeInventory | None) -> None:
        self._inventory = inventory
        if inventory is not None:
            uuids = {gpu.uuid for gpu in inventory.gpus}
            self._events = {u: h for u, h in self._events.items() if u in uuids}
        await self._recompute()

    async def apply_event(self, event: HealthEvent) -> None:
        health = _EVENT_HEALTH.get(event.kind, Health.UNKNOWN)
        if event.kind == "recovered":
            self._events.pop(event.gpu_uuid, None)
        else:
            self._events[event.gpu_uuid] = health
        await self._recompute()

    async def _on_event(self, event: HealthEvent, headers: dict[str, str]) -> None:
        await self.apply_event(event)

    def states(self) -> list[DeviceState]:
        return sorted(self._states.values(), key=lambda s: s.device)

    async def watch(self, resend: float = RESEND_SECONDS) -> AsyncGenerator[list[DeviceState]]:
        """The full list once an inventory is known, then on every change or every ``resend``."""
        seen = 0
        while True:
            async with self._changed:
                if self.version == seen:
                    try:
                        await asyncio.wait_for(self._changed.wait(), resend)
                    except TimeoutError:
                        pass
                seen = self.version
                states = self.states()
            if self._inventory is not None:
                yield states

    async def _recompute(self) -> None:
        now = time.time()
        fresh: dict[str, DeviceState] = {}
        for gpu in self._inventory.gpus if self._inventory else []:
            event = self._events.get(gpu.uuid, Health.HEALTHY)
            for device, health in device_health(gpu).items():
                worst = worse(health, event)
                old = self._states.get(device)
                since = old.since if old is not None and old.health == worst else now
                fresh[device] = DeviceState(device, worst, since)
        async with self._changed:
            if fresh != self._states or self.version == 0:
                self._states = fresh
                self.version += 1
                self._changed.notify_all()


def device_health(gpu: Gpu) -> dict[str, Health]:
    """Health of each device the publisher advertises for ``gpu``, from inventory facts.

    A lost GPU or an NVML error makes all of its devices unhealthy or unknown;
    the latest XID counts only when it is not an application error
    (:data:`nvidia.NON_FATAL_XIDS`), and only for its MIG device when NVML
    attributed it to one.
    """
    names: dict[tuple[int, int | None] | None, str] = {}
    if not gpu.mig_enabled:
        names[None] = nvidia.gpu_device_name(gpu.minor)
    for mig in gpu.mig_devices:
        names[(mig.gi_id, mig.ci_id)] = nvidia.mig_device_name(
            gpu.minor, mig.profile, mig.gi_profile_id, mig.placement.start
        )
    base = Health.UNKNOWN if gpu.error else Health.HEALTHY
    result = dict.fromkeys(names.values(), base)
    if gpu.health.lost:
        return dict.fromkeys(names.values(), Health.UNHEALTHY)
    if gpu.health.xids:
        latest = max(gpu.health.xids, key=lambda x: x.timestamp)
        if latest.xid not in nvidia.NON_FATAL_XIDS:
            hit = names.get((latest.gi_id, latest.ci_id)) if latest.gi_id is not None else None
            for name in [hit] if hit else names.values():
                result[name] = Health.UNHEALTHY
    return result


class HealthServicer:
    def __init__(self, board: HealthBoard, resend: float = RESEND_SECONDS) -> None:
        self.board = board
        self.resend = resend

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.NodeWatchResourcesResponse]:
        log.info("kubelet is watching device health")
        async for states in self.board.watch(self.resend):
            yield pb.NodeWatchResourcesResponse(
                devices=[
                    pb.DeviceHealth(
                        device=pb.DeviceIdentifier(pool_name=self.board.pool, device_name=s.device),
                        health=pb.HealthStatus.Name(s.health),
                        last_updated_time=int(s.since),
                    )
                    for s in states
                ]
            )


def add_to_server(server: grpc.aio.Server, board: HealthBoard) -> str:
    pb_grpc.add_DRAResourceHealthServicer_to_server(HealthServicer(board), server)
    return SERVICE_NAME
