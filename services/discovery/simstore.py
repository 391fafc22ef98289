"""Shared simulated NVML state in the KV bucket ``simnvml``, changed with compare-and-set.

Every change (MIG create/destroy, XID, GPU lost) is: read the node's state and
its KV revision, apply the change to a private copy with :class:`SimNvml`, and
write it back only if the revision is still the same; on a conflict, start
over from the newer state. An NVML error from the change aborts it and nothing
is written, so a failed call never leaves half-done state.

This module is also the Python API for changing a simulated node from another
process (tests, ``gpudra sim``); other services go through the bus request
``dra.sim.<node>`` that discovery answers (see :mod:`services.discovery.simcontrol`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.model.schemas import MigDevice, SchemaError
from services.discovery import metrics, mig
from services.discovery.fleet import Fleet
from services.discovery.sim import SimNvml, SimStateError
from services.discovery.simstate import SimNodeState, decode_state, encode_state

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_ATTEMPTS = 50


class SimNodeMissing(LookupError):
    """No simulated state for the node: nothing has booted it yet."""


class SimConflict(RuntimeError):
    """Too many concurrent writers; the change was not applied."""


def sim_key(node: str) -> str:
    return subjects.escape_token(node)


class SimStore:
    """Read and change simulated nodes in the ``simnvml`` bucket."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def get(self, node: str) -> tuple[SimNodeState, int] | None:
        """The node's state and KV revision; None if absent. Raises SchemaError if unusable."""
        kv = await self.bus.kv(subjects.SIM_BUCKET)
        try:
            entry = await kv.get(sim_key(node))
        except KeyNotFoundError:
            return None
        if entry.value is None or not entry.value:
            return None
        return decode_state(entry.value), int(entry.revision or 0)

    async def boot(
        self, node: str, fleet: Fleet, seed: int, *, force: bool = False
    ) -> tuple[SimNodeState, int]:
        """The node's state, created from the fleet unless the same fleet and seed already run.

        Like a real node, live MIG devices and lost GPUs survive a restart of
        discovery; a different fleet or seed, an unreadable state or ``force``
        replaces it (a reboot of the simulated node).
        """
        try:
            current = await self.get(node)
        except (SchemaError, SimStateError) as exc:
            log.warning(
                "replacing unreadable simulated state", extra={"node": node, "error": str(exc)}
            )
            current = None
        if current is not None and not force:
            state, revision = current
            if state.fleet == fleet.name and state.seed == seed:
                return state, revision
        fresh = SimNvml.boot(node, fleet, seed).state
        kv = await self.bus.kv(subjects.SIM_BUCKET)
        revision = int(await kv.put(sim_key(node), encode_state(fresh)))
        return fresh, revision

    async def mutate(self, node: str, change: Callable[[SimNvml], T]) -> T:
        """Apply ``change`` to the node's state with compare-and-set; returns its result."""
        kv = await self.bus.kv(subjects.SIM_BUCKET)
        for _ in range(MAX_ATTEMPTS):
            current = await self.get(node)
            if current is None:
                raise SimNodeMissing(
                    f"no simulated node {node!r}: start `gpudra discovery --fleet ...` "
                    f"or `gpudra sim boot` for it first"
                )
            state, revision = current
            sim = SimNvml(state)
            sim.init()
            result = change(sim)
            try:
                await kv.update(sim_key(node), encode_state(sim.state), last=revision)
            except KeyWrongLastSequenceError:
                metrics.SIM_CONFLICTS.inc()
                continue
            return result
        raise SimConflict(f"node {node!r}: gave up after {MAX_ATTEMPTS} conflicting writes")

    # ------------------------------------------------------------ the Python API

    async def create_mig_device(
        self, node: str, gpu: int, profile: str | int, placement: int | None = None
    ) -> MigDevice:
        """Create a GPU instance + full compute instance on simulated GPU ``gpu`` (NVML index).

        ``profile`` is a name ("1g.10gb") or a GI profile id (19); ``placement``
        is the memory-slice start (None: the first free valid one). MIG mode is
        switched on first if it is off. Raises backend.NvmlError as NVML would.
        """
        return await self.mutate(node, lambda sim: mig.create(sim, gpu, profile, placement))

    async def destroy_mig_device(self, node: str, gpu: int, gi_id: int, ci_id: int) -> None:
        """Destroy the compute instance and then its GPU instance (missing ones are fine)."""
        await self.mutate(node, lambda sim: mig.destroy(sim, gpu, gi_id, ci_id))

    async def inject_xid(
        self, node: str, gpu: int, xid: int, gi_id: int | None = None, ci_id: int | None = None
    ) -> int:
        """Raise an XID on a GPU (or on one of its MIG devices); returns the event number."""
        return await self.mutate(node, lambda sim: sim.inject_xid(gpu, xid, gi_id, ci_id))

    async def set_lost(self, node: str, gpu: int, lost: bool = True) -> None:
        """Make a GPU fall off the bus (every NVML query on it fails), or bring it back."""
        await self.mutate(node, lambda sim: sim.set_lost(gpu, lost))

    async def set_mig_mode(self, node: str, gpu: int, enabled: bool) -> None:
        await self.mutate(node, lambda sim: sim.set_mig_mode(gpu, enabled))
