"""Carrying out a claim's plan: ``PrepareStarted``, its side effects, files and
``PrepareCompleted`` entry (:func:`carry_out`).

A dead attempt's leftovers are rolled back first, and ``PrepareStarted`` is written
when a crash would leave something to undo. Then through the device backend, in
order: each device (VFIO binding, dynamic MIG device, a share's MPS daemon), each
config group's sharing (time-slicing, MPS), the KEP-5304 metadata files, the CDI
spec (put in place by the checkpoint writer just before ``PrepareCompleted``). What
this attempt did is recorded in :class:`Done`, so that :func:`abort` can take
exactly that back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
from opentelemetry import context as otel_context

from services.core.kube.resource import DeviceRequestAllocationResult
from services.core.model import configs, deviceattrs, gpudevices, nvidia
from services.core.model import featuregates as fg
from services.core.model.schemas import ClaimRef
from services.preparer import cdi, metadata, transaction
from services.preparer.checkpoint import (
    ClaimEntry,
    GroupState,
    MigState,
    MpsState,
    PreparedDeviceState,
    ShareState,
    VfioState,
)
from services.preparer.context import DRIVER, Context
from services.preparer.devices.base import MpsRequest
from services.preparer.inventory import DeviceNotFound, Target
from services.preparer.plan import Plan
from services.preparer.undo import rollback_started, stop_unused_share_daemons, undo

log = logging.getLogger(__name__)


@dataclass
class Done:
    """Side effects of the current attempt, to undo if a later step fails."""

    vfio: list[VfioState] = field(default_factory=list)
    migs: list[MigState] = field(default_factory=list)
    time_sliced: list[str] = field(default_factory=list)
    mps: list[MpsState] = field(default_factory=list)
    share_daemons: set[str] = field(default_factory=set)  # shared daemons this attempt used
    files: bool = False


async def carry_out(
    ctx: Context,
    ref: ClaimRef,
    entry: ClaimEntry | None,
    annotations: Mapping[str, str],
    plan: Plan,
) -> ClaimEntry:
    """The plan carried out and recorded; the claim's ``PrepareCompleted`` entry.

    ``entry``: the claim's ``PrepareStarted`` of an attempt that died half-way, if any.
    A failure undoes what this attempt did before it goes on up."""
    started = await _begin(ctx, ref, entry, plan)
    done = Done()
    try:
        return await apply(ctx, ref, started, annotations, plan, done)
    except BaseException:
        await abort(ctx, ref.uid, done)
        raise


async def _begin(ctx: Context, ref: ClaimRef, entry: ClaimEntry | None, plan: Plan) -> ClaimEntry:
    """PrepareStarted, written when there is anything to undo: a dead attempt's (rolled
    back first) or this plan's side effects beyond the claim's own files."""
    if entry is not None:  # PrepareStarted: a previous attempt died half-way
        with ctx.steps.step("rollback.partial"):
            await rollback_started(ctx, ref.uid, entry)
    started = transaction.started(ref, plan.allocation)
    if entry is not None or plan.side_effects(ctx.settings.gates):
        with ctx.steps.step("checkpoint.started"):
            await ctx.store.put(ref.uid, started)
    ctx.faults.hit("after-prepare-started")
    return started


async def apply(
    ctx: Context,
    ref: ClaimRef,
    started: ClaimEntry,
    annotations: Mapping[str, str],
    plan: Plan,
    done: Done,
) -> ClaimEntry:
    """The plan carried out; the claim's ``PrepareCompleted`` entry, written."""
    devices: list[PreparedDeviceState] = []
    group_states: list[GroupState] = []
    for index, group in enumerate(plan.groups):
        members = [await _device(ctx, ref.uid, r, index, plan, done) for r in group.results]
        devices.extend(members)
        group_states.append(await _sharing(ctx, ref.uid, index, group, members, plan, done))
    mounts = _write_metadata(ctx, ref, annotations, devices, plan.targets, done)
    inv = ctx.inventory.current
    version = inv.driver_version if inv is not None else ""
    with ctx.steps.step("cdi.render"):
        spec = cdi.render(ref.uid, devices, group_states, ctx.ops.cdigen(), version, mounts)
    parent = otel_context.get_current()

    def put_spec_in_place() -> None:
        """Runs in the checkpoint writer's thread, right before PrepareCompleted is written."""
        with ctx.steps.step("cdi.write", context=parent):
            cdi.write(ctx.settings.cdi_root, ref.uid, spec)
        ctx.faults.hit("after-cdi-write")
        ctx.faults.hit("before-prepare-completed")

    done.files = True
    with ctx.steps.step("checkpoint.completed"):
        return await transaction.complete(
            ctx.store,
            ref.uid,
            started,
            put_spec_in_place,
            devices=devices,
            groups=group_states,
            metadata_files=[m.host_path for m in mounts],
        )


async def abort(ctx: Context, uid: str, done: Done) -> None:
    """Undo this attempt; keep PrepareStarted if the undo itself fails."""
    try:
        if done.share_daemons:
            await stop_unused_share_daemons(ctx, uid, done.share_daemons)
        await undo(ctx, mps=done.mps, time_sliced=done.time_sliced, migs=done.migs, vfio=done.vfio)
        if done.files:
            ctx.delete_files(uid)
    except Exception:
        log.exception("could not undo a failed prepare; left for rollback", extra={"uid": uid})
        return
    await ctx.store.remove(uid)


async def _device(
    ctx: Context,
    uid: str,
    result: DeviceRequestAllocationResult,
    group: int,
    plan: Plan,
    done: Done,
) -> PreparedDeviceState:
    target = plan.targets[result.device]
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
        with ctx.steps.step("vfio.bind", attributes={"device": target.name}):
            vfio = await ctx.ops.bind_vfio(target.gpu)
        done.vfio.append(vfio)
        return msgspec.structs.replace(state, vfio=vfio)
    if target.kind == nvidia.MIG_TYPE:
        state = msgspec.structs.replace(state, mig=await _mig(ctx, target, done))
    share = plan.shares.get(result.share_id or "")
    if share is not None:
        state = msgspec.structs.replace(
            state,
            share=share.state,
            share_mps=await _share_daemon(ctx, uid, share.state, target, done),
            cdi_device_ids=[cdi.device_id(uid, result.device, share.state.share_id)],
        )
    return state


async def _share_daemon(
    ctx: Context, uid: str, share: ShareState, target: Target, done: Done
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
    async with ctx.daemon_locks.hold(share.daemon_id):
        with ctx.steps.step("mps.share", attributes={"daemon": share.daemon_id}):
            mps = await ctx.ops.start_mps(request)
    done.share_daemons.add(share.daemon_id)
    return mps


async def _mig(ctx: Context, target: Target, done: Done) -> MigState:
    assert target.profile is not None and target.placement is not None
    if not ctx.gate(fg.DYNAMIC_MIG):
        live = target.live
        if live is None:
            raise DeviceNotFound(
                f"MIG device {target.name!r} does not exist on GPU {target.gpu.minor} "
                f"(static MIG; enable {fg.DYNAMIC_MIG} to have it created)"
            )
        return MigState.of(target.gpu, live)
    with ctx.steps.step("mig.create", attributes={"device": target.name}):
        mig = await ctx.ops.create_mig(target.gpu, target.profile, target.placement)
    done.migs.append(mig)
    ctx.faults.hit("after-mig-create")
    return mig


async def _sharing(
    ctx: Context,
    uid: str,
    index: int,
    group: configs.ConfigGroup,
    members: Sequence[PreparedDeviceState],
    plan: Plan,
    done: Done,
) -> GroupState:
    config = group.config
    state = GroupState(kind=config.kind, origin=group.origin, config=msgspec.to_builtins(config))
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
    if sharing.strategy == configs.TIME_SLICING and isinstance(sharing, configs.GpuSharing):
        interval = (sharing.time_slicing_config or configs.TimeSlicingConfig()).interval
        gpus = sorted({m.gpu_uuid for m in members if m.kind == nvidia.GPU_TYPE})
        if interval and gpus:
            with ctx.steps.step("timeslice.set", attributes={"interval": interval}):
                await ctx.ops.set_time_slice(gpus, interval)
            done.time_sliced.extend(gpus)
            state = msgspec.structs.replace(state, time_slice=interval, time_slice_gpus=gpus)
    mps_plan = plan.mps.get(index)
    if mps_plan is not None:
        request = MpsRequest(
            daemon_id=mps_plan.daemon_id,
            claim_uid=uid,
            device_uuids=mps_plan.device_uuids,
            gpu_uuids=mps_plan.gpu_uuids,
            active_thread_percentage=mps_plan.active_thread_percentage,
            pinned_memory_limits_mib=mps_plan.pinned_memory_limits_mib,
            multi_user=mps_plan.multi_user,
        )
        with ctx.steps.step("mps.start"):
            mps = await ctx.ops.start_mps(request)
        done.mps.append(mps)
        state = msgspec.structs.replace(state, mps=mps)
    return state


def _write_metadata(
    ctx: Context,
    ref: ClaimRef,
    annotations: Mapping[str, str],
    devices: Sequence[PreparedDeviceState],
    targets: Mapping[str, Target],
    done: Done,
) -> list[cdi.MetadataMount]:
    if not ctx.gate(fg.DEVICE_METADATA):
        return []
    members = []
    for d in devices:
        if d.kind != nvidia.VFIO_TYPE:
            continue  # the reference attaches metadata to VFIO devices only
        index = nvidia.parse_device_name(d.name).vfio_index or 0
        published = gpudevices.vfio_device(targets[d.name].gpu, index)
        if ctx.gate(fg.DRA_LIST_TYPE_ATTRIBUTES):  # as GetDevice() gives it
            (published,) = deviceattrs.list_type_attributes([published])
        members.append(
            metadata.MetadataDevice(d.requests[0], d.pool, d.name, published.attributes or {})
        )
    if not members:
        return []
    done.files = True
    return metadata.write_claim(
        ctx.settings.plugin_dir,
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        annotations=annotations,
        driver=DRIVER,
        devices=members,
    )
