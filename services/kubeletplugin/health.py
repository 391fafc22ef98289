"""DRAResourceHealth: stream this node's device health to the kubelet.

The device list and base health come from the node's inventory (KV
``inventory``); health events on ``dra.health.<node>`` apply on top at once,
before discovery has rewritten the inventory. Every message carries the
complete list, and it is re-sent periodically because the kubelet turns a
device it has not heard about for 30 s into Unknown. A device that is not
healthy says why in its ``message`` (``XID 79: GPU has fallen off the bus``),
which kubelets 1.36 and later show in the pod's status.

One implementation is served as two gRPC services on the DRA socket:
``v1.DRAResourceHealth`` (kubelet 1.37 and later prefer it) and
``v1alpha1.DRAResourceHealth`` (kubelets 1.34 to 1.36 know only it; 1.37 to
1.39 still take it). Both are advertised at registration, newest first; the
messages are the same field for field.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

from services.core.bus import subjects
from services.core.bus.access import Identity, Role
from services.core.bus.client import Bus
from services.core.model import gpuhealth, nvidia
from services.core.model.schemas import Gpu, HealthEvent, NodeInventory
from services.proto_gen.kubelet.drahealth.v1 import api_pb2 as pb_v1
from services.proto_gen.kubelet.drahealth.v1 import api_pb2_grpc as pb_v1_grpc
from services.proto_gen.kubelet.drahealth.v1alpha1 import api_pb2 as pb_v1alpha1
from services.proto_gen.kubelet.drahealth.v1alpha1 import api_pb2_grpc as pb_v1alpha1_grpc

log = logging.getLogger(__name__)

# The versions served, newest first: (proto module, its gRPC module).
VERSIONS: tuple[tuple[ModuleType, ModuleType], ...] = (
    (pb_v1, pb_v1_grpc),
    (pb_v1alpha1, pb_v1alpha1_grpc),
)
RESEND_SECONDS = 10.0
# The kubelet keeps at most this much of a message (ResourceHealthMessageMaxLength).
MESSAGE_MAX = 1024


def service_name(pb: ModuleType) -> str:
    """What registration advertises for a version: ``v1.DRAResourceHealth``."""
    return str(pb.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name)


SERVICE_NAMES = tuple(service_name(pb) for pb, _ in VERSIONS)


class Health(enum.IntEnum):
    """The wire values (the same in v1 and v1alpha1); ``_SEVERITY`` orders them."""

    UNKNOWN = pb_v1.UNKNOWN
    HEALTHY = pb_v1.HEALTHY
    UNHEALTHY = pb_v1.UNHEALTHY


_SEVERITY = {Health.HEALTHY: 0, Health.UNKNOWN: 1, Health.UNHEALTHY: 2}


@dataclass(frozen=True)
class Verdict:
    """One device's health and, unless it is healthy, why (the kubelet's ``message``)."""

    health: Health
    message: str = ""


HEALTHY = Verdict(Health.HEALTHY)


def _worse(a: Verdict, b: Verdict) -> Verdict:
    """The more severe of two verdicts; ``a`` on a tie."""
    return a if _SEVERITY[a.health] >= _SEVERITY[b.health] else b


def fit(message: str) -> str:
    """``message`` within the kubelet's limit, cut as the kubelet cuts ("..."), on a character."""
    data = message.encode()
    if len(data) <= MESSAGE_MAX:
        return message
    return data[: MESSAGE_MAX - 3].decode(errors="ignore") + "..."


@dataclass(frozen=True)
class DeviceState:
    device: str
    health: Health
    since: float  # unix time the health last changed
    message: str = ""


@dataclass(frozen=True)
class _EventFact:
    """What the last health event said about a GPU, until the inventory says it too.

    ``target`` is the (GI, CI) of the MIG device NVML attributed an XID to;
    None for the whole GPU.
    """

    kind: str
    verdict: Verdict
    target: tuple[int, int | None] | None = None


def event_fact(event: HealthEvent) -> _EventFact | None:
    """What a health event says about its GPU's devices; None: nothing wrong any more.

    The same rules as :func:`device_reports`: an application XID
    (:data:`gpuhealth.NON_FATAL_XIDS`) is no fault, a lost GPU is unhealthy, an
    NVML error makes health unknown. The event's ``reason`` is the message; an
    event from a discovery that predates it gets the same words made here.
    """
    if event.kind == "recovered":
        return None
    if event.kind == "xid":
        if event.xid in gpuhealth.NON_FATAL_XIDS:
            return None
        reason = event.reason or (
            gpuhealth.xid_reason(event.xid) if event.xid is not None else "XID"
        )
        target = (event.gi_id, event.ci_id) if event.gi_id is not None else None
        return _EventFact("xid", Verdict(Health.UNHEALTHY, fit(reason)), target)
    if event.kind == "gpu-lost":
        return _EventFact(
            event.kind, Verdict(Health.UNHEALTHY, fit(event.reason or gpuhealth.GPU_LOST_REASON))
        )
    return _EventFact(event.kind, Verdict(Health.UNKNOWN, fit(event.reason or event.message)))


class HealthBoard:
    """The current health of every device of one node, and a change signal."""

    def __init__(self, node: str, pool: str | None = None) -> None:
        self.node = node
        self.pool = pool or node  # the publisher's pool is the node name
        self.version = 0
        self._inventory: NodeInventory | None = None
        self._events: dict[str, _EventFact] = {}  # gpu uuid -> what its last event said
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
            self._events = {u: f for u, f in self._events.items() if u in uuids}
        await self._recompute()

    async def apply_event(self, event: HealthEvent) -> None:
        fact = event_fact(event)
        old = self._events.get(event.gpu_uuid)
        if fact is not None:
            self._events[event.gpu_uuid] = fact
        elif event.kind == "recovered" or (old is not None and old.kind == "xid"):
            # Recovered: nothing holds. An application XID: the latest XID is no fault.
            self._events.pop(event.gpu_uuid, None)
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
            fact = self._events.get(gpu.uuid)
            names = device_names(gpu)
            hit = names.get(fact.target) if fact is not None and fact.target else None
            for name, verdict in device_reports(gpu).items():
                if fact is not None and hit in (None, name):
                    verdict = _worse(fact.verdict, verdict)
                old = self._states.get(name)
                since = old.since if old is not None and old.health == verdict.health else now
                fresh[name] = DeviceState(name, verdict.health, since, verdict.message)
        async with self._changed:
            if fresh != self._states or self.version == 0:
                self._states = fresh
                self.version += 1
                self._changed.notify_all()


def device_names(gpu: Gpu) -> dict[tuple[int, int | None] | None, str]:
    """The devices the publisher advertises for ``gpu``: None for the full GPU, (GI, CI) per MIG."""
    names: dict[tuple[int, int | None] | None, str] = {}
    if not gpu.mig_enabled:
        names[None] = nvidia.gpu_device_name(gpu.minor)
    for mig in gpu.mig_devices:
        names[(mig.gi_id, mig.ci_id)] = nvidia.mig_device_name(
            gpu.minor, mig.profile, mig.gi_profile_id, mig.placement.start
        )
    return names


def device_reports(gpu: Gpu) -> dict[str, Verdict]:
    """Health and reason of each device the publisher advertises for ``gpu``, from inventory facts.

    A lost GPU or an NVML error makes all of its devices unhealthy or unknown;
    the latest XID counts only when it is not an application error
    (:data:`gpuhealth.NON_FATAL_XIDS`), and only for the MIG devices NVML attributed
    it to (:func:`_hit`).
    """
    names = device_names(gpu)
    if gpu.health.lost:
        return dict.fromkeys(names.values(), Verdict(Health.UNHEALTHY, gpuhealth.GPU_LOST_REASON))
    base = HEALTHY
    if gpu.error:
        base = Verdict(Health.UNKNOWN, fit(gpuhealth.nvml_error_reason(gpu.error)))
    result = dict.fromkeys(names.values(), base)
    if gpu.health.xids:
        latest = max(gpu.health.xids, key=lambda x: x.timestamp)
        if latest.xid not in gpuhealth.NON_FATAL_XIDS:
            fault = Verdict(Health.UNHEALTHY, gpuhealth.xid_reason(latest.xid))
            for name in _hit(names, latest.gi_id, latest.ci_id):
                result[name] = fault
    return result


def _hit(
    names: dict[tuple[int, int | None] | None, str], gi: int | None, ci: int | None
) -> list[str]:
    """The devices an XID lands on: NVML's GI and CI when it gave them (a GI without a CI:
    every MIG device of that GPU instance; a GI we do not publish: none), else every
    device of the GPU."""
    if gi is None:
        return list(names.values())
    if ci is not None:
        return [names[(gi, ci)]] if (gi, ci) in names else []
    return [name for key, name in names.items() if key is not None and key[0] == gi]


def device_health(gpu: Gpu) -> dict[str, Health]:
    """Only the health of :func:`device_reports`."""
    return {name: verdict.health for name, verdict in device_reports(gpu).items()}


class HealthServicer:
    """NodeWatchResources, one implementation for every version (``pb``: its messages)."""

    def __init__(
        self, board: HealthBoard, pb: ModuleType = pb_v1, resend: float = RESEND_SECONDS
    ) -> None:
        self.board = board
        self.pb = pb
        self.service = service_name(pb)
        self.resend = resend

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        log.info("kubelet is watching device health", extra={"service": self.service})
        pb = self.pb
        async for states in self.board.watch(self.resend):
            yield pb.NodeWatchResourcesResponse(
                devices=[
                    pb.DeviceHealth(
                        device=pb.DeviceIdentifier(pool_name=self.board.pool, device_name=s.device),
                        health=pb.HealthStatus.Name(s.health),
                        last_updated_time=int(s.since),
                        message=s.message,
                    )
                    for s in states
                ]
            )


def add_to_server(server: grpc.aio.Server, board: HealthBoard) -> list[str]:
    """Serve every version on ``server``; return their names for registration, newest first."""
    for pb, pb_grpc in VERSIONS:
        pb_grpc.add_DRAResourceHealthServicer_to_server(HealthServicer(board, pb), server)
    return list(SERVICE_NAMES)
