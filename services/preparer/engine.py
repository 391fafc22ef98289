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

import contextlib
import hashlib
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import Counter

from services.core.kube.resource import DeviceRequestAllocationResult, ResourceClaim
from services.core.model import configs, deviceattrs, gpudevices, nvidia, shares
from services.core.model import featuregates as fg
from services.core.model.schemas import ClaimRef, DeviceRef, PreparedDevice
from services.core.telemetry import tracing
from services.preparer import cdi, metadata, shareplan, verify
from services.preparer.cdigen.model import CdiGenError
from services.preparer.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    ClaimEntry,
    GroupState,
    MigState,
    MpsState,
    PreparedDeviceState,
    ShareState,
    VfioState,
)
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.claims import ClaimError, ClaimSource, check_identity, describe
from services.preparer.devices.base import DeviceOpError, DeviceOps, MpsRequest
from services.preparer.faults import Faults
from services.preparer.inventory import DeviceNotFound, InventoryView, Target, locate
from services.preparer.keylocks import KeyedLocks

log = logging.getLogger(__name__)

UNPREPARES_OF_LIVE_PODS = Counter(
    "gpudra_preparer_unprepares_of_live_pods_total",
    "Unprepares of a prepared claim while the API server still showed a reserving pod alive "
    "on this node (done: the kubelet unprepares before it reports the pod finished).",
)

DRIVER = nvidia.DRIVER_NAME
EXPECTED = (
    ClaimError,
    configs.ConfigError,
    DeviceNotFound,
    DeviceOpError,
    CdiGenError,
    shareplan.ShareError,
)


class PrepareError(ValueError):
    """A claim-level refusal (conflicts, empty allocations) with its reason."""


@dataclass
class Outcome:
    """What one claim's prepare or unprepare produced, for the reply and the event."""

    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""

    def refs(self) -> list[DeviceRef]:
        return [
            DeviceRef(
                request=",".join(d.request_names),
                pool=d.pool_name,
                device=d.device_name,
                cdi_device_ids=d.cdi_device_ids,
            )
            for d in self.devices
        ]


@dataclass
class _Done:
    """Side effects of the current attempt, to undo if a later step fails."""

    vfio: list[VfioState] = field(default_factory=list)
    migs: list[MigState] = field(default_factory=list)
    time_sliced: list[str] = field(default_factory=list)
    mps: list[MpsState] = field(default_factory=list)
    share_daemons: set[str] = field(default_factory=set)  # shared daemons this attempt used
    files: bool = False


@dataclass
class Settings:
    node: str
    gates: fg.FeatureGates
    cdi_root: Path
    plugin_dir: Path
    shares: shares.SharesMode = shares.DISABLED


class Engine:
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
        self.steps = tracing.Steps(self.tracer, step_mode)  # a summary, events or spans
        self.s = settings
        self.store = store
        self.claims = claims
        self.inventory = inventory
        self.ops = ops
        self.faults = faults or Faults()
        self._claim_locks = KeyedLocks()
        self._gpu_locks = KeyedLocks()  # physical GPU -> one unprepare's undo at a time
        self._inflight: dict[str, tuple[str, str]] = {}  # device -> (uid, "ns/name") preparing it
        # (device, uid, share id) -> ("ns/name", share) for shares being prepared
        self._inflight_shares: dict[tuple[str, str, str], tuple[str, ShareState]] = {}
        self._daemon_locks = KeyedLocks()  # shared MPS daemon id -> its start or stop

    # ------------------------------------------------------------ prepare

    async def prepare(self, ref: ClaimRef, deadline: float | None = None) -> Outcome:
        """``deadline``: unix time by which the caller needs the answer (the kubelet's)."""
        try:
            check_identity(ref)
            async with self._claim_locks.hold(ref.uid):
                return Outcome(devices=await self._prepare(ref, deadline))
        except (*EXPECTED, PrepareError) as exc:
            return Outcome(error=_prefixed(ref, str(exc)))

    async def _prepare(self, ref: ClaimRef, deadline: float | None) -> list[PreparedDevice]:
        entry = self.store.claims.get(ref.uid)
        if entry is not None and entry.state == PREPARE_COMPLETED:
            return reply_devices(ref.uid, entry)
        with self.steps.step("claim.fetch"):
            claim = await self.claims.get(ref, deadline)
        results = self._our_results(claim)
        allocation = claim.status.allocation if claim.status else None
        assert allocation is not None  # checked by _our_results
        inv = self.inventory.require()
        targets = {r.device: locate(inv, r.device) for r in results}
        with self.steps.step("config.resolve"):
            kinds = {name: t.kind for name, t in targets.items()}
            config_list = allocation.devices.config if allocation.devices else None
            groups = configs.resolve(config_list, results, kinds, self.s.gates)
            _check_mps_limits(groups, targets)
            plans = self._plan_shares(results, targets, groups)
        self._reserve(ref.uid, f"{ref.namespace}/{ref.name}", results, targets, plans)
        try:
            if entry is not None:  # PrepareStarted: a previous attempt died half-way
                with self.steps.step("rollback.partial"):
                    await self._rollback_started(ref.uid, entry)
            started = ClaimEntry(
                state=PREPARE_STARTED,
                namespace=ref.namespace,
                name=ref.name,
                allocation=allocation,
                started_at=time.time(),
            )
            if entry is not None or _has_side_effects(groups, targets, self.s.gates):
                with self.steps.step("checkpoint.started"):
                    await self.store.put(ref.uid, started)
            self.faults.hit("after-prepare-started")
            done = _Done()
            try:
                completed = await self._apply(
                    ref, started, claim.metadata.annotations or {}, groups, targets, plans, done
                )
            except BaseException:
                await self._abort(ref.uid, done)
                raise
            return reply_devices(ref.uid, completed)
        finally:
            self._release(ref.uid)

    def _our_results(self, claim: ResourceClaim) -> list[DeviceRequestAllocationResult]:
        """This driver's results, on this node (ClaimSource checked it; checked again here
        so that no way of reading a claim can skip it)."""
        problem = verify.allocation(claim, self.s.node)
        if problem is not None:
            raise PrepareError(problem)
        return verify.our_results(claim)

    def _plan_shares(
        self,
        results: Sequence[DeviceRequestAllocationResult],
        targets: Mapping[str, Target],
        groups: Sequence[configs.ConfigGroup],
    ) -> dict[str, shareplan.SharePlan]:
        """share id -> what it takes, for every ``shareID`` result (checked, no side effect)."""
        group_of = {id(r): g for g in groups for r in g.results}
        plans: dict[str, shareplan.SharePlan] = {}
        inv = self.inventory.require()
        for index, r in enumerate(results):
            if r.share_id is None:
                continue
            plans[r.share_id] = shareplan.plan(
                r, index, targets[r.device], inv, self.s.gates, self.s.shares, group_of.get(id(r))
            )
        return plans

    def _reserve(
        self,
        uid: str,
        who: str,
        results: Sequence[DeviceRequestAllocationResult],
        targets: Mapping[str, Target],
        plans: Mapping[str, shareplan.SharePlan],
    ) -> None:
        """Refuse devices another claim holds (unless adminAccess) and shares that do not
        fit, then hold ours. A share conflicts only with exclusive holders of its device."""
        held = self._holders(exclude=uid)
        for r in results:
            if r.admin_access:
                continue
            target = targets[r.device]
            keys = _share_conflict_keys(target) if r.share_id else _conflict_keys(target)
            for key in keys:
                other = held.get(key)
                if other is not None:
                    raise PrepareError(
                        f"device {r.device!r} is held by claim {other} "
                        "(devices are exclusive; only adminAccess or consumable shares may "
                        "share them)"
                    )
        mine: list[tuple[str, str, ShareState]] = []
        for r in results:
            if r.share_id is None:
                continue
            plan = plans[r.share_id]
            others = [(w, st) for d, w, st in self._shares_on(exclude=uid) if d == r.device]
            others += [(f"{who} ({uid})", st) for d, _, st in mine if d == r.device]
            shareplan.check_fit(r.device, plan, others)
            mine.append((r.device, who, plan.state))
        for r in results:
            if r.admin_access:
                continue
            if r.share_id is None:
                self._inflight[r.device] = (uid, who)
            else:
                self._inflight_shares[(r.device, uid, r.share_id)] = (who, plans[r.share_id].state)

    def _shares_on(self, exclude: str) -> list[tuple[str, str, ShareState]]:
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
        for (device, owner, _), (who, state) in self._inflight_shares.items():
            if owner != exclude and owner not in completed:
                out.append((device, f"{who} ({owner}, being prepared)", state))
        return out

    def _release(self, uid: str) -> None:
        for device in [d for d, (owner, _) in self._inflight.items() if owner == uid]:
            del self._inflight[device]
        for key in [k for k in self._inflight_shares if k[1] == uid]:
            del self._inflight_shares[key]

    def _holders(self, exclude: str) -> dict[str, str]:
        """hold key -> claim, for completed claims and prepares in flight."""
        held: dict[str, str] = {}
        inv = self.inventory.current
        for uid, entry in self.store.claims.items():
            if uid == exclude or entry.state != PREPARE_COMPLETED:
                continue
            for d in entry.devices:
                if not d.admin_access:
                    for key in _state_hold_keys(d):
                        held[key] = f"{entry.namespace}/{entry.name} ({uid}, prepared)"
        for (device, uid, _), (who, _) in self._inflight_shares.items():
            if uid != exclude:
                keys = [_shared_key(device)]
                if inv is not None:
                    with contextlib.suppress(DeviceNotFound):
                        keys.append(f"nvidia:{locate(inv, device).gpu.pci_bus_id}")
                for k in keys:
                    held[k] = f"{who} ({uid}, being prepared)"
        for device, (uid, who) in self._inflight.items():
            if uid != exclude and inv is not None:
                try:
                    keys = _hold_keys(locate(inv, device))
                except DeviceNotFound:
                    keys = [device]
                for key in keys:
                    held[key] = f"{who} ({uid}, being prepared)"
        return held

    async def _apply(
        self,
        ref: ClaimRef,
        started: ClaimEntry,
        annotations: Mapping[str, str],
        groups: Sequence[configs.ConfigGroup],
        targets: Mapping[str, Target],
        plans: Mapping[str, shareplan.SharePlan],
        done: _Done,
    ) -> ClaimEntry:
        devices: list[PreparedDeviceState] = []
        group_states: list[GroupState] = []
        for index, group in enumerate(groups):
            members = [
                await self._prepare_device(
                    ref.uid, r, targets[r.device], index, done, plans.get(r.share_id or "")
                )
                for r in group.results
            ]
            devices.extend(members)
            group_states.append(await self._apply_sharing(ref.uid, group, members, done))
        mounts = self._write_metadata(ref, annotations, devices, targets, done)
        inv = self.inventory.current
        version = inv.driver_version if inv is not None else ""
        with self.steps.step("cdi.render"):
            spec = cdi.render(ref.uid, devices, group_states, self.ops.cdigen(), version, mounts)
        entry = msgspec.structs.replace(
            started,
            state=PREPARE_COMPLETED,
            completed_at=time.time(),
            devices=devices,
            groups=group_states,
            metadata_files=[m.host_path for m in mounts],
        )
        parent = otel_context.get_current()

        def put_spec_in_place() -> None:
            """Runs in the checkpoint writer's thread, right before PrepareCompleted is written."""
            with self.steps.step("cdi.write", context=parent):
                cdi.write(self.s.cdi_root, ref.uid, spec)
            self.faults.hit("after-cdi-write")
            self.faults.hit("before-prepare-completed")

        done.files = True
        with self.steps.step("checkpoint.completed"):
            await self.store.put(ref.uid, entry, before=put_spec_in_place)
        return entry

    async def _prepare_device(
        self,
        uid: str,
        result: DeviceRequestAllocationResult,
        target: Target,
        group: int,
        done: _Done,
        plan: shareplan.SharePlan | None = None,
    ) -> PreparedDeviceState:
        state = PreparedDeviceState(
            name=result.device,
            kind=target.kind,
            requests=[result.request],
            pool=result.pool,
            cdi_device_ids=[cdi.device_id(uid, result.device)],
            gpu_uuid=target.gpu.uuid,
            gpu_minor=target.gpu.minor,
            pci_bus_id=target.gpu.pci_bus_id,
            admin_access=bool(result.admin_access),
            group=group,
        )
        if target.kind == nvidia.VFIO_TYPE:
            where = {"device": target.name}
            with self.steps.step("vfio.bind", attributes=where):
                vfio = await self.ops.bind_vfio(target.gpu)
            done.vfio.append(vfio)
            return msgspec.structs.replace(state, vfio=vfio)
        if target.kind == nvidia.MIG_TYPE:
            state = msgspec.structs.replace(state, mig=await self._mig(target, done))
        if plan is not None:
            state = msgspec.structs.replace(
                state,
                share=plan.state,
                share_mps=await self._share_daemon(uid, plan.state, target, done),
                cdi_device_ids=[cdi.device_id(uid, result.device, plan.state.share_id)],
            )
        return state

    async def _share_daemon(
        self, uid: str, share: ShareState, target: Target, done: _Done
    ) -> MpsState:
        """The shared device's one MPS daemon: started by its first share, found by the rest."""
        request = MpsRequest(
            daemon_id=share.daemon_id,
            claim_uid=uid,
            device_uuids=[share.device_uuid],
            gpu_uuids=[target.gpu.uuid],
            active_thread_percentage=None,  # each share's limits come with its CDI env
            pinned_memory_limits_mib={},
        )
        async with self._daemon_locks.hold(share.daemon_id):
            with self.steps.step("mps.share", attributes={"daemon": share.daemon_id}):
                mps = await self.ops.start_mps(request)
        done.share_daemons.add(share.daemon_id)
        return mps

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
        for (_, owner, _), (_, state) in self._inflight_shares.items():
            if owner != exclude and state.daemon_id == daemon_id:
                refs.append(owner)
        return refs

    async def _stop_unused_share_daemons(self, uid: str, daemon_ids: set[str] | None) -> None:
        """Stop (and restore compute mode for) shared daemons no other claim holds.

        ``daemon_ids`` None: every shared daemon running (a rollback that knows
        nothing of what the dead attempt started).
        """
        wanted = daemon_ids
        if wanted is None:
            running = await self.ops.mps_daemons()
            wanted = {
                d.daemon_id for d in running if d.daemon_id.startswith(shareplan.DAEMON_PREFIX)
            }
        for daemon_id in sorted(wanted):
            async with self._daemon_locks.hold(daemon_id):
                if self.share_refs(daemon_id, exclude=uid):
                    continue
                # Read under the lock: another share's unprepare may have stopped it.
                live = await self.ops.mps_daemons()
                daemon = next((d for d in live if d.daemon_id == daemon_id), None)
                if daemon is not None:
                    with self.steps.step("mps.share.stop", attributes={"daemon": daemon_id}):
                        await self.ops.stop_mps(daemon)

    async def _mig(self, target: Target, done: _Done) -> MigState:
        assert target.profile is not None and target.placement is not None
        if not self.s.gates.enabled(fg.DYNAMIC_MIG):
            live = target.live
            if live is None:
                raise DeviceNotFound(
                    f"MIG device {target.name!r} does not exist on GPU {target.gpu.minor} "
                    f"(static MIG; enable {fg.DYNAMIC_MIG} to have it created)"
                )
            return MigState.of(target.gpu, live)
        with self.steps.step("mig.create", attributes={"device": target.name}):
            mig = await self.ops.create_mig(target.gpu, target.profile, target.placement)
        done.migs.append(mig)
        self.faults.hit("after-mig-create")
        return mig

    async def _apply_sharing(
        self,
        uid: str,
        group: configs.ConfigGroup,
        members: Sequence[PreparedDeviceState],
        done: _Done,
    ) -> GroupState:
        config = group.config
        state = GroupState(
            kind=config.kind, origin=group.origin, config=msgspec.to_builtins(config)
        )
        if isinstance(config, configs.VfioDeviceConfig):
            iommu = config.iommu or configs.IommuConfig()
            return msgspec.structs.replace(
                state,
                vfio_api_device=bool(iommu.enable_api_device),
                vfio_iommufd=iommu.backend_policy == "PreferIommuFD",
            )
        sharing = config.sharing
        if sharing is None:
            return state
        where = f"{group.origin} {config.kind}.sharing"
        if sharing.strategy == configs.TIME_SLICING and isinstance(sharing, configs.GpuSharing):
            interval = (sharing.time_slicing_config or configs.TimeSlicingConfig()).interval
            gpus = sorted({m.gpu_uuid for m in members if m.kind == nvidia.GPU_TYPE})
            if interval and gpus:
                with self.steps.step("timeslice.set", attributes={"interval": interval}):
                    await self.ops.set_time_slice(gpus, interval)
                done.time_sliced.extend(gpus)
                state = msgspec.structs.replace(state, time_slice=interval, time_slice_gpus=gpus)
        if sharing.strategy == configs.MPS:
            mps_config = sharing.mps_config or configs.MpsConfig()
            # Sorted, as the reference hands them to its daemon (CUDA_VISIBLE_DEVICES).
            uuids = sorted(m.mig.uuid if m.mig else m.gpu_uuid for m in members)
            request = MpsRequest(
                daemon_id=mps_daemon_id(uid, uuids),
                claim_uid=uid,
                device_uuids=uuids,
                gpu_uuids=sorted({m.gpu_uuid for m in members}),
                active_thread_percentage=mps_config.default_active_thread_percentage,
                pinned_memory_limits_mib=configs.per_device_limits(
                    mps_config, uuids, f"{where}.mpsConfig"
                ),
                multi_user=bool(mps_config.multi_user),
            )
            with self.steps.step("mps.start"):
                mps = await self.ops.start_mps(request)
            done.mps.append(mps)
            state = msgspec.structs.replace(state, mps=mps)
        return state

    def _write_metadata(
        self,
        ref: ClaimRef,
        annotations: Mapping[str, str],
        devices: Sequence[PreparedDeviceState],
        targets: Mapping[str, Target],
        done: _Done,
    ) -> list[cdi.MetadataMount]:
        if not self.s.gates.enabled(fg.DEVICE_METADATA):
            return []
        members = []
        for d in devices:
            if d.kind != nvidia.VFIO_TYPE:
                continue  # the reference attaches metadata to VFIO devices only
            index = nvidia.parse_device_name(d.name).vfio_index or 0
            published = gpudevices.vfio_device(targets[d.name].gpu, index)
            if self.s.gates.enabled(fg.DRA_LIST_TYPE_ATTRIBUTES):  # as GetDevice() gives it
                (published,) = deviceattrs.list_type_attributes([published])
            members.append(
                metadata.MetadataDevice(d.requests[0], d.pool, d.name, published.attributes or {})
            )
        if not members:
            return []
        done.files = True
        return metadata.write_claim(
            self.s.plugin_dir,
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            annotations=annotations,
            driver=DRIVER,
            devices=members,
        )

    async def _abort(self, uid: str, done: _Done) -> None:
        """Undo this attempt; keep PrepareStarted if the undo itself fails."""
        try:
            if done.share_daemons:
                await self._stop_unused_share_daemons(uid, done.share_daemons)
            await self._undo(
                mps=done.mps, time_sliced=done.time_sliced, migs=done.migs, vfio=done.vfio
            )
            if done.files:
                self._delete_files(uid)
        except Exception:
            log.exception("could not undo a failed prepare; left for rollback", extra={"uid": uid})
            return
        await self.store.remove(uid)

    # ------------------------------------------------------------ unprepare

    async def unprepare(self, ref: ClaimRef) -> Outcome:
        try:
            check_identity(ref)
            async with self._claim_locks.hold(ref.uid):
                await self._unprepare(ref)
            return Outcome()
        except (*EXPECTED, PrepareError) as exc:
            return Outcome(error=_prefixed(ref, str(exc)))

    async def _unprepare(self, ref: ClaimRef) -> None:
        """Undo a prepare, without the prepare's checks: the claim is usually deleted by now.

        An unprepare of a claim whose pod the API server still shows alive on this node is
        logged and counted, not refused: the kubelet unprepares after the pod's containers
        stopped but before it reports the pod finished (kubelet.go SyncTerminatingPod), so an
        evicted pod, a pod past its deadline or a finished Job looks exactly like a running
        pod at that moment. Only the bus's permissions keep others from asking (security.md).
        """
        entry = self.store.claims.get(ref.uid)
        if entry is None:
            # Never prepared, or already undone; a stray spec is still ours to remove.
            self._delete_files(ref.uid)
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
                await self._rollback_started(ref.uid, entry)
            else:
                with self.steps.step("devices.undo"):
                    await self._undo_completed(ref.uid, entry)
            with self.steps.step("checkpoint.remove"):
                await self.store.remove(ref.uid, before=lambda: self._delete_files(ref.uid))
        # After the entry is gone: of shares leaving at once, the last to get here finds
        # no holder left (each counts the others while they are in the checkpoint). A
        # crash in between leaves a daemon no claim owns, which recover() stops.
        daemons = {d.share.daemon_id for d in entry.devices if d.share is not None}
        if daemons and entry.state != PREPARE_STARTED:
            await self._stop_unused_share_daemons(ref.uid, daemons)
        self.claims.forget(ref)

    async def _undo_completed(self, uid: str, entry: ClaimEntry) -> None:
        shared = self._gpus_of_other_claims(uid)
        await self._undo(
            mps=[g.mps for g in entry.groups if g.mps is not None],
            time_sliced=[u for g in entry.groups for u in g.time_slice_gpus if u not in shared],
            migs=[
                d.mig
                for d in entry.devices
                if d.mig is not None and d.mig.created and not self._shared_elsewhere(uid, d)
            ],
            vfio=[d.vfio for d in entry.devices if d.vfio is not None],
        )

    async def _undo(
        self,
        *,
        mps: Sequence[MpsState],
        time_sliced: Sequence[str],
        migs: Sequence[MigState],
        vfio: Sequence[VfioState],
    ) -> None:
        """Reverse order of preparing: sharing first, then devices."""
        for daemon in mps:
            await self.ops.stop_mps(daemon)
        if time_sliced and self.s.gates.enabled(fg.TIME_SLICING_SETTINGS):
            await self.ops.set_time_slice(sorted(set(time_sliced)), "Default")
        for mig in migs:
            await self.ops.destroy_mig(mig)
        for binding in vfio:
            await self.ops.unbind_vfio(binding)

    def _delete_files(self, uid: str) -> None:
        cdi.delete(self.s.cdi_root, uid)
        metadata.delete_claim(self.s.plugin_dir, uid)

    # ------------------------------------------------------------ rollback and recovery

    async def _rollback_started(self, uid: str, entry: ClaimEntry) -> None:
        """Undo whatever a dead attempt may have done, knowing only its allocation.

        A crash can strike between a side effect and any record of it, so this
        looks at the hardware: MIG devices at the allocated placements, VFIO
        bindings of the allocated GPUs, MPS daemons named after the claim.
        Devices that a completed claim holds are never touched.
        """
        held = self._holders(exclude=uid)
        results = [
            r
            for r in (
                (entry.allocation.devices.results or [])
                if entry.allocation and entry.allocation.devices
                else []
            )
            if r.driver == DRIVER and r.pool == self.s.node
        ]
        inv = self.inventory.current
        targets: list[Target] = []
        for r in results:
            try:
                target = locate(inv, r.device) if inv is not None else None
            except DeviceNotFound:
                target = None
            if target is not None and not any(k in held for k in _conflict_keys(target)):
                targets.append(target)
        for daemon in await self.ops.mps_daemons():
            if daemon.daemon_id.startswith(f"{uid}-"):
                await self.ops.stop_mps(daemon)
        await self._stop_unused_share_daemons(uid, None)
        gpus = sorted({t.gpu.uuid for t in targets if t.kind == nvidia.GPU_TYPE})
        if gpus and self.s.gates.enabled(fg.TIME_SLICING_SETTINGS):
            await self.ops.set_time_slice(gpus, "Default")
        if self.s.gates.enabled(fg.DYNAMIC_MIG):
            # From the names alone: the inventory may not show a device created just before a crash.
            wanted = set()
            for r in results:
                ident = _parse(r.device)
                kept = r.device in held or _shared_key(r.device) in held  # other claims' own
                if ident is not None and ident.kind == nvidia.MIG_TYPE and not kept:
                    wanted.add((ident.minor, ident.gi_profile_id, ident.placement_start))
            for mig in await self.ops.live_migs():
                if (mig.parent_minor, mig.gi_profile_id, mig.placement_start) in wanted:
                    await self.ops.destroy_mig(mig)
        for t in targets:
            if t.kind == nvidia.VFIO_TYPE and t.gpu.vfio is not None:
                await self.ops.unbind_vfio(
                    VfioState(pci_bus_id=t.gpu.pci_bus_id, iommu_group=t.gpu.vfio.iommu_group)
                )
        self._delete_files(uid)

    async def recover(self) -> dict[str, Any]:
        """At start-up: undo what no completed claim owns. Returns what was cleaned."""
        report: dict[str, Any] = {
            "rolled_back": [],
            "migs": [],
            "mps": [],
            "cdi": [],
            "metadata": [],
        }
        for uid, entry in list(self.store.claims.items()):
            if entry.state == PREPARE_STARTED:
                await self._rollback_started(uid, entry)
                await self.store.remove(uid)
                report["rolled_back"].append(uid)
        completed = {u: e for u, e in self.store.claims.items() if e.state == PREPARE_COMPLETED}
        if self.s.gates.enabled(fg.DYNAMIC_MIG):
            kept = {
                (d.mig.parent_minor, d.mig.gi_profile_id, d.mig.placement_start)
                for e in completed.values()
                for d in e.devices
                if d.mig is not None
            }
            for mig in await self.ops.live_migs():
                if (mig.parent_minor, mig.gi_profile_id, mig.placement_start) not in kept:
                    await self.ops.destroy_mig(mig)
                    report["migs"].append(mig.uuid)
        owned = {g.mps.daemon_id for e in completed.values() for g in e.groups if g.mps}
        owned |= {d.share.daemon_id for e in completed.values() for d in e.devices if d.share}
        for daemon in await self.ops.mps_daemons():
            if daemon.daemon_id not in owned:
                await self.ops.stop_mps(daemon)
                report["mps"].append(daemon.daemon_id)
        for uid in cdi.claim_uids_on_disk(self.s.cdi_root):
            if uid not in completed:
                cdi.delete(self.s.cdi_root, uid)
                report["cdi"].append(uid)
        for uid in metadata.claim_uids_on_disk(self.s.plugin_dir):
            if uid not in completed:
                shutil.rmtree(metadata.claim_dir(self.s.plugin_dir, uid), ignore_errors=True)
                report["metadata"].append(uid)
        return report

    def _shared_elsewhere(self, uid: str, device: PreparedDeviceState) -> bool:
        """Whether another claim holds a share of ``device`` (its MIG device must stay)."""
        return device.share is not None and any(
            d == device.name for d, _, _ in self._shares_on(exclude=uid)
        )

    def _gpus_of_other_claims(self, uid: str) -> set[str]:
        return {
            d.gpu_uuid
            for other, e in self.store.claims.items()
            if other != uid and e.state == PREPARE_COMPLETED
            for d in e.devices
        }


# ------------------------------------------------------------------ helpers


def reply_devices(uid: str, entry: ClaimEntry) -> list[PreparedDevice]:
    return [
        PreparedDevice(
            request_names=d.requests,
            pool_name=d.pool,
            device_name=d.name,
            cdi_device_ids=d.cdi_device_ids,
            share_id=d.share.share_id if d.share is not None else None,
        )
        for d in entry.devices
    ]


def _has_side_effects(
    groups: Sequence[configs.ConfigGroup], targets: Mapping[str, Target], gates: fg.FeatureGates
) -> bool:
    """Whether preparing changes the node beyond the claim's own files (which start-up
    removes when no completed entry owns them): then a crash must find PrepareStarted."""
    for t in targets.values():
        if t.kind == nvidia.VFIO_TYPE or (
            t.kind == nvidia.MIG_TYPE and gates.enabled(fg.DYNAMIC_MIG)
        ):
            return True
    return any(getattr(g.config, "sharing", None) is not None for g in groups)


def _check_mps_limits(groups: Sequence[configs.ConfigGroup], targets: Mapping[str, Target]) -> None:
    """Per-device MPS limits name devices by UUID or index: check before any side effect."""
    for group in groups:
        sharing = getattr(group.config, "sharing", None)
        if sharing is None or sharing.strategy != configs.MPS or sharing.mps_config is None:
            continue
        uuids = []
        for r in group.results:
            target = targets[r.device]
            uuids.append(target.live.uuid if target.live else target.gpu.uuid)
        where = f"{group.origin} {group.config.kind}.sharing.mpsConfig"
        configs.per_device_limits(sharing.mps_config, uuids, where)


def mps_daemon_id(claim_uid: str, uuids: Sequence[str]) -> str:
    """``<claimUID>-<5 hex of sha256(sorted uuids)>``, as the reference names daemons."""
    digest = hashlib.sha256(",".join(sorted(uuids)).encode()).hexdigest()
    return f"{claim_uid}-{digest[:5]}"


def _hold_keys(target: Target) -> list[str]:
    """What preparing ``target`` holds: its name, and its GPU in nvidia or vfio mode."""
    mode = "vfio" if target.kind == nvidia.VFIO_TYPE else "nvidia"
    return [target.name, f"{mode}:{target.gpu.pci_bus_id}"]


def _state_hold_keys(device: PreparedDeviceState) -> list[str]:
    mode = "vfio" if device.kind == nvidia.VFIO_TYPE else "nvidia"
    name = _shared_key(device.name) if device.share is not None else device.name
    return [name, f"{mode}:{device.pci_bus_id}"] if device.pci_bus_id else [name]


def _shared_key(device: str) -> str:
    """The hold key of a device's shares: exclusive holders conflict with it, shares do not."""
    return f"shared:{device}"


def _share_conflict_keys(target: Target) -> list[str]:
    """Held keys that exclude a share of ``target``: an exclusive holder, or its VFIO twin."""
    return [target.name, f"vfio:{target.gpu.pci_bus_id}"]


def _conflict_keys(target: Target) -> list[str]:
    """Held keys that exclude ``target``: the same device, or its GPU in the other mode.

    A GPU and its VFIO twin are mutually exclusive; MIG devices and full GPUs on
    one GPU are kept apart by the scheduler's counters, not here.
    """
    other = "nvidia" if target.kind == nvidia.VFIO_TYPE else "vfio"
    return [target.name, f"{other}:{target.gpu.pci_bus_id}", _shared_key(target.name)]


def _parse(name: str) -> nvidia.DeviceId | None:
    try:
        return nvidia.parse_device_name(name)
    except ValueError:
        return None


def _prefixed(ref: ClaimRef, message: str) -> str:
    """Every per-claim error starts with the claim it is about."""
    who = f"claim {describe(ref)}"
    return message if message.startswith(who) else f"{who}: {message}"
