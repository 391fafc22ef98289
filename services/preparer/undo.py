"""Taking back what a prepare did: a completed claim's devices and settings, what a dead
attempt may have left (knowing only its allocation), the shared MPS daemons nobody
holds any more. Sharing goes first, then devices: the reverse of preparing."""

from __future__ import annotations

from collections.abc import Sequence

from services.core.kube.resource import DeviceRequestAllocationResult
from services.core.model import featuregates as fg
from services.core.model import nvidia
from services.preparer import shareplan
from services.preparer.checkpoint import ClaimEntry, MigState, MpsState, VfioState
from services.preparer.context import DRIVER, Context
from services.preparer.holds import conflict_keys, shared_key
from services.preparer.inventory import DeviceNotFound, Target, locate


async def undo(
    ctx: Context,
    *,
    mps: Sequence[MpsState],
    time_sliced: Sequence[str],
    migs: Sequence[MigState],
    vfio: Sequence[VfioState],
) -> None:
    """Reverse order of preparing: sharing first, then devices."""
    for daemon in mps:
        await ctx.ops.stop_mps(daemon)
    if time_sliced and ctx.gate(fg.TIME_SLICING_SETTINGS):
        await ctx.ops.set_time_slice(sorted(set(time_sliced)), "Default")
    for mig in migs:
        await ctx.ops.destroy_mig(mig)
    for binding in vfio:
        await ctx.ops.unbind_vfio(binding)


async def undo_completed(ctx: Context, uid: str, entry: ClaimEntry) -> None:
    """A prepared claim's sharing and devices, but what other claims of its GPUs still use."""
    shared = ctx.holds.gpus_of_other_claims(uid)
    await undo(
        ctx,
        mps=[g.mps for g in entry.groups if g.mps is not None],
        time_sliced=[u for g in entry.groups for u in g.time_slice_gpus if u not in shared],
        migs=[
            d.mig
            for d in entry.devices
            if d.mig is not None and d.mig.created and not ctx.holds.shared_elsewhere(uid, d)
        ],
        vfio=[d.vfio for d in entry.devices if d.vfio is not None],
    )


async def stop_unused_share_daemons(ctx: Context, uid: str, daemon_ids: set[str] | None) -> None:
    """Stop (and restore compute mode for) shared daemons no other claim holds.

    ``daemon_ids`` None: every shared daemon running (a rollback that knows
    nothing of what the dead attempt started).
    """
    wanted = daemon_ids
    if wanted is None:
        running = await ctx.ops.mps_daemons()
        wanted = {d.daemon_id for d in running if d.daemon_id.startswith(shareplan.DAEMON_PREFIX)}
    for daemon_id in sorted(wanted):
        async with ctx.daemon_locks.hold(daemon_id):
            if ctx.holds.share_refs(daemon_id, exclude=uid):
                continue
            # Read under the lock: another share's unprepare may have stopped it.
            live = await ctx.ops.mps_daemons()
            daemon = next((d for d in live if d.daemon_id == daemon_id), None)
            if daemon is not None:
                with ctx.steps.step("mps.share.stop", attributes={"daemon": daemon_id}):
                    await ctx.ops.stop_mps(daemon)


async def rollback_started(ctx: Context, uid: str, entry: ClaimEntry) -> None:
    """Undo whatever a dead attempt may have done, knowing only its allocation.

    A crash can strike between a side effect and any record of it, so this
    looks at the hardware: MIG devices at the allocated placements, VFIO
    bindings of the allocated GPUs, MPS daemons named after the claim.
    Devices that a completed claim holds are never touched.
    """
    held = ctx.holds.holders(exclude=uid)
    results = _ours(ctx, entry)
    targets = _unheld_targets(ctx, results, held)
    for daemon in await ctx.ops.mps_daemons():
        if daemon.daemon_id.startswith(f"{uid}-"):
            await ctx.ops.stop_mps(daemon)
    await stop_unused_share_daemons(ctx, uid, None)
    gpus = sorted({t.gpu.uuid for t in targets if t.kind == nvidia.GPU_TYPE})
    if gpus and ctx.gate(fg.TIME_SLICING_SETTINGS):
        await ctx.ops.set_time_slice(gpus, "Default")
    if ctx.gate(fg.DYNAMIC_MIG):
        await _destroy_placed_migs(ctx, results, held)
    for t in targets:
        if t.kind == nvidia.VFIO_TYPE and t.gpu.vfio is not None:
            await ctx.ops.unbind_vfio(
                VfioState(pci_bus_id=t.gpu.pci_bus_id, iommu_group=t.gpu.vfio.iommu_group)
            )
    ctx.delete_files(uid)


def _ours(ctx: Context, entry: ClaimEntry) -> list[DeviceRequestAllocationResult]:
    devices = entry.allocation.devices if entry.allocation else None
    return [
        r
        for r in (devices.results or [] if devices else [])
        if r.driver == DRIVER and r.pool == ctx.settings.node
    ]


def _unheld_targets(
    ctx: Context, results: list[DeviceRequestAllocationResult], held: dict[str, str]
) -> list[Target]:
    inv = ctx.inventory.current
    targets: list[Target] = []
    for r in results:
        try:
            target = locate(inv, r.device) if inv is not None else None
        except DeviceNotFound:
            target = None
        if target is not None and not any(k in held for k in conflict_keys(target)):
            targets.append(target)
    return targets


async def _destroy_placed_migs(
    ctx: Context, results: list[DeviceRequestAllocationResult], held: dict[str, str]
) -> None:
    """MIG devices at the allocated placements, found from the names alone: the inventory
    may not show a device created just before a crash. Other claims' own are kept."""
    wanted = set()
    for r in results:
        name = r.device
        ident = _parse(name)
        kept = name in held or shared_key(name) in held
        if ident is not None and ident.kind == nvidia.MIG_TYPE and not kept:
            wanted.add((ident.minor, ident.gi_profile_id, ident.placement_start))
    for mig in await ctx.ops.live_migs():
        if (mig.parent_minor, mig.gi_profile_id, mig.placement_start) in wanted:
            await ctx.ops.destroy_mig(mig)


def _parse(name: str) -> nvidia.DeviceId | None:
    try:
        return nvidia.parse_device_name(name)
    except ValueError:
        return None
