"""A node's NVLink clique: the node label and the one clique its GPUs must agree on."""

from __future__ import annotations

from collections.abc import Iterable

from services.core.model.schemas import Gpu

# The node label GPU Feature Discovery sets (and the reference's plugin, with
# gpuCliqueLabelEnabled): "<clusterUUID>.<cliqueID>", the node's NVLink clique.
GPU_CLIQUE_LABEL = "nvidia.com/gpu.clique"
FABRIC_STATE_COMPLETED = 3  # nvmlGpuFabricState_t
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"
_FABRIC_STATES = {0: "NOT_SUPPORTED", 1: "NOT_STARTED", 2: "IN_PROGRESS", 3: "COMPLETED"}


class CliqueError(ValueError):
    """The node's GPUs do not name one NVLink clique (or, strict, a fabric is unhealthy)."""


def node_clique_id(gpus: Iterable[Gpu], *, strict: bool = True) -> str:
    """The node's clique id, ``<clusterUUID>.<cliqueID>``, or "" for a node outside a fabric.

    As the reference's getCliqueID: GPUs that NVML says are not attached (no
    fabric, a zero cluster UUID) are skipped, and all others must agree. A GPU
    whose fabric registration has not completed or failed is skipped, or with
    ``strict`` (the reference's CrashOnNVLinkFabricErrors) refuses the node:
    guessing a clique would put it in the wrong IMEX domain.
    """
    ids: dict[str, list[int]] = {}
    for gpu in gpus:
        fabric = gpu.fabric
        if fabric is None or fabric.cluster_uuid == _ZERO_UUID:
            continue
        if fabric.state != FABRIC_STATE_COMPLETED or fabric.status != 0:
            if strict:
                state = _FABRIC_STATES.get(fabric.state, str(fabric.state))
                raise CliqueError(
                    f"GPU {gpu.index} ({gpu.uuid}): NVLink fabric state {state}, "
                    f"status {fabric.status} (want COMPLETED and 0)"
                )
            continue
        ids.setdefault(f"{fabric.cluster_uuid}.{fabric.clique_id}", []).append(gpu.index)
    if len(ids) > 1:
        seen = "; ".join(f"{k} on GPUs {v}" for k, v in sorted(ids.items()))
        raise CliqueError(f"the node's GPUs are in more than one NVLink clique: {seen}")
    return next(iter(ids), "")
