"""Prepare and unprepare claims: the transaction around every side effect.

For one claim, in order:

1. checks that need no side effect: the claim's identity, its allocation,
   the devices (on this node, not held by another claim), the configs;
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
from collections.abc import Mapping

from opentelemetry import trace
from prometheus_client import Counter

from services.core.kube.resource import DeviceRequestAllocationResult, ResourceClaim
from services.core.model.schemas import ClaimRef, PreparedDevice
from services.core.telemetry import tracing
from services.preparer import plan as planning
from services.preparer import transaction, verify
from services.preparer.apply import Done, abort, apply
from services.preparer.checkpoint import PREPARE_COMPLETED, PREPARE_STARTED, ClaimEntry
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.claims import ClaimSource, describe
from services.preparer.context import Context, Settings
from services.preparer.devices.base import DeviceOps
from services.preparer.faults import Faults
from services.preparer.holds import Holds
from services.preparer.inventory import InventoryView
from services.preparer.keylocks import KeyedLocks
from services.preparer.recovery import recover
from services.preparer.transaction import Outcome, PrepareError
from services.preparer.undo import rollback_started, stop_unused_share_daemons, undo_completed

log = logging.getLogger(__name__)

UNPREPARES_OF_LIVE_PODS = Counter(
    "gpudra_preparer_unprepares_of_live_pods_total",
    "Unprepares of a prepared claim while the API server still showed a reserving pod alive "
    "on this node (done: the kubelet unprepares before it reports the pod finished).",
)

__all__ = ["Engine", "Outcome", "Settings"]


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

    async def prepare(self, ref: ClaimRef, deadline: float | None = None) -> Outcome:
        """``deadline``: unix time by which the caller needs the answer (the kubelet's)."""
        return await transaction.attempt(
            self._claim_locks, ref, lambda: self._prepare(ref, deadline)
        )

    async def _prepare(self, ref: ClaimRef, deadline: float | None) -> list[PreparedDevice]:
        ctx = self.ctx
        entry = ctx.store.claims.get(ref.uid)
        if entry is not None and entry.state == PREPARE_COMPLETED:
            return transaction.reply_devices(entry)
        with ctx.steps.step("claim.fetch"):
            claim = await self.claims.get(ref, deadline)
        results = self._our_results(claim)
        allocation = claim.status.allocation if claim.status else None
        assert allocation is not None  # checked by _our_results
        inv = ctx.inventory.require()
        targets = planning.locate_all(inv, results)
        with ctx.steps.step("config.resolve"):
            settings = ctx.settings
            plan = planning.make(
                ref.uid, allocation, results, targets, inv, settings.gates, settings.shares
            )
        who = f"{ref.namespace}/{ref.name}"
        ctx.holds.reserve(ref.uid, who, results, plan.targets, plan.shares)
        try:
            return await self._carry_out(ref, entry, claim.metadata.annotations or {}, plan)
        finally:
            ctx.holds.release(ref.uid)

    async def _carry_out(
        self,
        ref: ClaimRef,
        entry: ClaimEntry | None,
        annotations: Mapping[str, str],
        plan: planning.Plan,
    ) -> list[PreparedDevice]:
        """PrepareStarted (when there is anything to undo), the plan, PrepareCompleted."""
        ctx = self.ctx
        if entry is not None:  # PrepareStarted: a previous attempt died half-way
            with ctx.steps.step("rollback.partial"):
                await rollback_started(ctx, ref.uid, entry)
        started = transaction.started(ref, plan.allocation)
        if entry is not None or plan.side_effects(ctx.settings.gates):
            with ctx.steps.step("checkpoint.started"):
                await ctx.store.put(ref.uid, started)
        ctx.faults.hit("after-prepare-started")
        done = Done()
        try:
            completed = await apply(ctx, ref, started, annotations, plan, done)
        except BaseException:
            await abort(ctx, ref.uid, done)
            raise
        return transaction.reply_devices(completed)

    def _our_results(self, claim: ResourceClaim) -> list[DeviceRequestAllocationResult]:
        """This driver's results, on this node (ClaimSource checked it; checked again here
        so that no way of reading a claim can skip it)."""
        problem = verify.allocation(claim, self.ctx.settings.node)
        if problem is not None:
            raise PrepareError(problem)
        return verify.our_results(claim)

    # ------------------------------------------------------------ unprepare

    async def unprepare(self, ref: ClaimRef) -> Outcome:
        return await transaction.attempt(self._claim_locks, ref, lambda: self._unprepare(ref))

    async def _unprepare(self, ref: ClaimRef) -> None:
        """Undo a prepare, without the prepare's checks: the claim is usually deleted by now.

        An unprepare of a claim whose pod the API server still shows alive on this node is
        logged and counted, not refused: the kubelet unprepares after the pod's containers
        stopped but before it reports the pod finished (kubelet.go SyncTerminatingPod), so an
        evicted pod, a pod past its deadline or a finished Job looks exactly like a running
        pod at that moment. Only the bus's permissions keep others from asking (security.md).
        """
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
