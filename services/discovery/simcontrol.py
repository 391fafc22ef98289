"""Answering ``dra.sim.<node>``: MIG changes on a simulated node for other services.

The preparer creates and destroys MIG devices through NVML on a real node; on
a simulated node it sends a :class:`SimMigRequest` instead and discovery
applies it to the shared state with compare-and-set (the same code path as
``gpudra sim mig``). Every request gets a reply; failures carry NVML's error.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import SimMigReply, SimMigRequest
from services.discovery import backend as nv
from services.discovery import mig
from services.discovery.sim import SimNvml
from services.discovery.simstore import SimStore

log = logging.getLogger(__name__)
T = TypeVar("T")


async def serve(bus: Bus, store: SimStore, node: str) -> None:
    async def handle(req: SimMigRequest, _headers: dict[str, str]) -> SimMigReply:
        try:
            return await apply(store, node, req)
        except nv.NvmlError as exc:
            return SimMigReply(error=str(exc), nvml_error=exc.symbol)
        except Exception as exc:  # a bad request must never take discovery down
            log.exception("simulated MIG request failed", extra={"op": req.op})
            return SimMigReply(error=f"{type(exc).__name__}: {exc}")

    # A queue group: should two discovery processes serve one node, each request
    # is still applied once.
    await bus.serve(subjects.sim_control(node), SimMigRequest, handle, queue="discovery")


async def apply(store: SimStore, node: str, req: SimMigRequest) -> SimMigReply:
    def index_of(sim: SimNvml) -> int:
        for i, gpu in enumerate(sim.state.gpus):
            if gpu.uuid == req.gpu_uuid:
                return i
        raise nv.NotFound(f"no GPU with UUID {req.gpu_uuid!r} on node {node!r}")

    if req.op == "create":
        profile = _need(req.gi_profile_id, "gi_profile_id")
        device = await store.mutate(
            node, lambda sim: mig.create(sim, index_of(sim), profile, req.placement_start)
        )
        return SimMigReply(device=device)
    if req.op == "destroy":
        gi, ci = _need(req.gi_id, "gi_id"), _need(req.ci_id, "ci_id")
        await store.mutate(node, lambda sim: mig.destroy(sim, index_of(sim), gi, ci))
        return SimMigReply()
    enabled = _need(req.mig_enabled, "mig_enabled")
    await store.mutate(node, lambda sim: sim.set_mig_mode(index_of(sim), enabled))
    return SimMigReply()


def _need(value: T | None, name: str) -> T:
    if value is None:
        raise nv.InvalidArgument(f"request field {name} is required for this op")
    return value
