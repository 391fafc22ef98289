"""Creating and destroying MIG devices over any backend, all or nothing.

A MIG device is a GPU instance plus the compute instance that spans it. If the
compute instance cannot be made, the GPU instance is destroyed again, so a
failure never leaves a half-built device behind (the reference driver's order:
enable MIG mode if needed, create the GI at a placement, create its CI).
"""

from __future__ import annotations

import contextlib
import logging

from services.core.model.schemas import MigDevice, MigPlacement
from services.discovery import backend as nv
from services.discovery.backend import Backend

log = logging.getLogger(__name__)


def find_profile(be: Backend, index: int, profile: str | int) -> nv.GpuInstanceProfile:
    """The GPU's profile by name ("1g.10gb") or GI profile id (19); InvalidArgument if none."""
    profiles = be.gpu_instance_profiles(index)
    for p in profiles:
        if p.name == profile or p.id == profile:
            return p
    valid = ", ".join(f"{p.name} (id {p.id})" for p in profiles)
    raise nv.InvalidArgument(f"GPU {index} has no MIG profile {profile!r}; valid: {valid}")


def create(be: Backend, index: int, profile: str | int, placement: int | None) -> MigDevice:
    spec = find_profile(be, index, profile)
    current, _ = be.mig_mode(index)
    if not current:
        be.set_mig_mode(index, True)
    gi_id, where = be.create_gpu_instance(index, spec.id, placement)
    try:
        ci_id, uuid = be.create_compute_instance(index, gi_id)
    except nv.NvmlError:
        with contextlib.suppress(nv.NvmlError):
            be.destroy_gpu_instance(index, gi_id)
        raise
    log.info(
        "created MIG device",
        extra={"gpu": index, "profile": spec.name, "gi": gi_id, "ci": ci_id, "uuid": uuid},
    )
    return MigDevice(
        uuid=uuid,
        profile=spec.name,
        gi_profile_id=spec.id,
        gi_id=gi_id,
        ci_id=ci_id,
        placement=MigPlacement(where.start, where.size),
    )


def destroy(be: Backend, index: int, gi_id: int, ci_id: int) -> None:
    """CI first, then GI (NVML refuses the other order); already-gone parts are fine."""
    with contextlib.suppress(nv.NotFound):
        be.destroy_compute_instance(index, gi_id, ci_id)
    with contextlib.suppress(nv.NotFound):
        be.destroy_gpu_instance(index, gi_id)
    log.info("destroyed MIG device", extra={"gpu": index, "gi": gi_id, "ci": ci_id})
