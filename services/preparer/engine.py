"""Prepare and unprepare claims: the transaction around every side effect.

For one claim, in order:

1. checks that need no side effect: the claim's identity (the service's, before
   it asks), its allocation, the devices (on this node, not held by another
   claim), the configs;
2. checkpoint ``PrepareStarted`` (with the allocation, so a crash can be undone),
   when step 3 has anything to do: a claim of full GPUs without sharing has no
   side effect but its files, which start-up removes as orphans when no
   completed entry owns them, so it goes straight to 5 (one write, not two);
3. side effects through the device-operations backend: VFIO binding, dynamic
   MIG devices, time-slicing, MPS daemons;
4. the KEP-5304 metadata files and the claim's CDI spec;
5. checkpoint ``PrepareCompleted`` with everything that was done (the spec is
   put in place by the checkpoint writer just before it writes this entry:
   one trip to its worker thread for both).

A failure in 3-5 undoes what this attempt did and drops the checkpoint entry.
A crash after step 2 leaves ``PrepareStarted``: the next prepare of that claim (or the next
start of the preparer) rolls it back from the allocation before anything else.
Different claims run concurrently; one claim's operations run one at a time.
"""

from __future__ import annotations

import logging

from opentelemetry import trace
from prometheus_client import Counter

from services.core.model.schemas import ClaimRef, PreparedDevice
from services.core.telemetry import tracing
from services.preparer import plan as planning
from services.preparer import transaction
from services.preparer.apply import carry_out
from services.preparer.checkpoint import PREPARE_COMPLETED, PREPARE_STARTED
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.claims import ClaimSource, describe
from services.preparer.context import Context, Settings
from services.preparer.devices.base import DeviceOps
from services.preparer.faults import Faults
from services.preparer.holds import Holds
from services.preparer.inventory import InventoryView
from services.preparer.keylocks import KeyedLocks
from services.preparer.recovery import recover
from services.preparer.undo import rollback_started, stop_unused_share_daemons, undo_completed

log = logging.getLogger(__name__)

UNPREPARES_OF_LIVE_PODS = Counter(
    "gpudra_preparer_unprepares_of_live_pods_total",
    "Unprepares of a prepared claim while the API server still showed a reserving pod alive "
    "on this node (done: the kubelet unprepares before it reports the pod finished).",
)

__all__ = ["Engine", "Settings"]


class Engine:
    """The GPU driver's claims: prepare (plan.py, apply.py), unprepare (undo.py) and
    start-up recovery (recovery.py), one claim at a time per claim, many claims at once."""

    def __init__(
        self,
        settings: Settings,
        store: CheckpointStore,
        claims: ClaimSource,
        inventory: InventoryView,
        ops: DeviceOps,
        faults: Faults | None = None,
        tracer: trace.Tracer | None = None,
        step_mode: str | None = None,
    ) -> None:
        self.tracer = tracer or tracing.tracer("gpudra.preparer")
        self.claims = claims
        self.ctx = Context(
            settings=settings,
            store=store,
            inventory=inventory,
            ops=ops,
            holds=Holds(store, inventory),
            steps=tracing.Steps(self.tracer, step_mode),  # a summary, events or spans
            faults=faults or Faults(),
        )
        self._claim_locks = KeyedLocks()
        self._gpu_locks = KeyedLocks()  # physical GPU -> one unprepare's undo at a time

    @property
    def store(self) -> CheckpointStore:
        return self.ctx.store

    @property
    def steps(self) -> tracing.Steps:
        return self.ctx.steps

    async def recover(self) -> dict[str, object]:
        return await recover(self.ctx)

    # ------------------------------------------------------------ prepare

    async def prepare(self, ref: ClaimRef, deadline: float | None = None) -> list[PreparedDevice]:
        """The claim's devices for the kubelet, in order: the claim read, checked and
        planned (plan.py), its devices held (holds.py), the plan carried out and recorded
        (apply.py). ``deadline``: unix time by which the kubelet needs the answer. A claim
        that cannot be prepared raises the reason (a ClaimRefused) for the service."""
        ctx = self.ctx
        async with self._claim_locks.hold(ref.uid):
            entry = ctx.store.claims.get(ref.uid)
            if entry is not None and entry.state == PREPARE_COMPLETED:
                return transaction.reply_devices(entry)
            with ctx.steps.step("claim.fetch"):
                claim = await self.claims.get(ref, deadline)
            plan = planning.for_claim(ctx, ref.uid, claim)
            annotations = claim.metadata.annotations or {}
            with ctx.holds.holding(ref, plan.results, plan.targets, plan.shares):
                completed = await carry_out(ctx, ref, entry, annotations, plan)
            return transaction.reply_devices(completed)

    # ------------------------------------------------------------ unprepare

    async def unprepare(self, ref: ClaimRef) -> None:
        """Undo a prepare, without the prepare's checks: the claim is usually deleted by now.

        An unprepare of a claim whose pod the API server still shows alive on this node is
        logged and counted, not refused: the kubelet unprepares after the pod's containers
        stopped but before it reports the pod finished (kubelet.go SyncTerminatingPod), so an
        evicted pod, a pod past its deadline or a finished Job looks exactly like a running
        pod at that moment. Only the bus's permissions keep others from asking (security.md).
        """
        async with self._claim_locks.hold(ref.uid):
            await self._unprepare(ref)

    async def _unprepare(self, ref: ClaimRef) -> None:
        """What the claim's entry says was done, undone; then the entry and its files."""
        ctx = self.ctx
        entry = ctx.store.claims.get(ref.uid)
        if entry is None:
            # Never prepared, or already undone; a stray spec is still ours to remove.
            ctx.delete_files(ref.uid)
            return
        alive = self.claims.alive_holders(ref)
        if alive:
            UNPREPARES_OF_LIVE_PODS.inc()
            log.info(  # info: a finished Job's pod looks like this every time
                "unprepare of a claim whose pod still looks alive on this node; done (the "
                "kubelet unprepares before it reports a pod finished)",
                extra={"claim": describe(ref), "uid": ref.uid, "pods": alive},
            )
        # Claims of one GPU (adminAccess, shares) leave it one at a time: each leaves the
        # GPU's settings and MIG devices to the others while they hold it, so the last one
        # out must see the others gone from the checkpoint.
        async with self._gpu_locks.hold_all({d.gpu_uuid or d.name for d in entry.devices}):
            if entry.state == PREPARE_STARTED:
                await rollback_started(ctx, ref.uid, entry)
            else:
                with ctx.steps.step("devices.undo"):
                    await undo_completed(ctx, ref.uid, entry)
            with ctx.steps.step("checkpoint.remove"):
                await ctx.store.remove(ref.uid, before=lambda: ctx.delete_files(ref.uid))
        # After the entry is gone: of shares leaving at once, the last to get here finds
        # no holder left (each counts the others while they are in the checkpoint). A
        # crash in between leaves a daemon no claim owns, which recover() stops.
        daemons = {d.share.daemon_id for d in entry.devices if d.share is not None}
        if daemons and entry.state != PREPARE_STARTED:
            await stop_unused_share_daemons(ctx, ref.uid, daemons)
        self.claims.forget(ref)
