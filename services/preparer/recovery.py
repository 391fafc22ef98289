"""At start-up: undo what no completed claim owns, so a crash at any point of a prepare
leaves nothing behind. Attempts that died half-way (``PrepareStarted``) are rolled back
from their allocation; dynamic MIG devices, MPS daemons, CDI specs and metadata files
no completed claim accounts for are removed."""

from __future__ import annotations

import shutil
from typing import Any

from services.core.model import featuregates as fg
from services.preparer import cdi, metadata
from services.preparer.checkpoint import PREPARE_COMPLETED, PREPARE_STARTED, ClaimEntry
from services.preparer.context import Context
from services.preparer.undo import rollback_started


async def recover(ctx: Context) -> dict[str, Any]:
    """What was cleaned: rolled-back claims, MIG devices, MPS daemons, specs, metadata."""
    report: dict[str, Any] = {"rolled_back": [], "migs": [], "mps": [], "cdi": [], "metadata": []}
    for uid, entry in list(ctx.store.claims.items()):
        if entry.state == PREPARE_STARTED:
            await rollback_started(ctx, uid, entry)
            await ctx.store.remove(uid)
            report["rolled_back"].append(uid)
    completed = {u: e for u, e in ctx.store.claims.items() if e.state == PREPARE_COMPLETED}
    if ctx.gate(fg.DYNAMIC_MIG):
        report["migs"] = await _stray_migs(ctx, completed)
    report["mps"] = await _stray_daemons(ctx, completed)
    for uid in cdi.claim_uids_on_disk(ctx.settings.cdi_root):
        if uid not in completed:
            cdi.delete(ctx.settings.cdi_root, uid)
            report["cdi"].append(uid)
    for uid in metadata.claim_uids_on_disk(ctx.settings.plugin_dir):
        if uid not in completed:
            shutil.rmtree(metadata.claim_dir(ctx.settings.plugin_dir, uid), ignore_errors=True)
            report["metadata"].append(uid)
    return report


async def _stray_migs(ctx: Context, completed: dict[str, ClaimEntry]) -> list[str]:
    kept = {
        (d.mig.parent_minor, d.mig.gi_profile_id, d.mig.placement_start)
        for e in completed.values()
        for d in e.devices
        if d.mig is not None
    }
    removed = []
    for mig in await ctx.ops.live_migs():
        if (mig.parent_minor, mig.gi_profile_id, mig.placement_start) not in kept:
            await ctx.ops.destroy_mig(mig)
            removed.append(mig.uuid)
    return removed


async def _stray_daemons(ctx: Context, completed: dict[str, ClaimEntry]) -> list[str]:
    owned = {g.mps.daemon_id for e in completed.values() for g in e.groups if g.mps}
    owned |= {d.share.daemon_id for e in completed.values() for d in e.devices if d.share}
    stopped = []
    for daemon in await ctx.ops.mps_daemons():
        if daemon.daemon_id not in owned:
            await ctx.ops.stop_mps(daemon)
            stopped.append(daemon.daemon_id)
    return stopped
