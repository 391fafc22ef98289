"""The device-operations interface: every side effect of preparing a claim goes through it.

Two implementations share the engine above them: :mod:`.real` (nvidia-smi,
NVML, sysfs, the MPS control daemon) and :mod:`.simulated` (the simulated NVML
state that discovery reads, so what the preparer does shows up in discovery).
Every operation is idempotent: doing it twice, or undoing what is not there,
is not an error, because a crash can repeat any step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.core.model.refusal import ClaimRefused
from services.core.model.schemas import Gpu, MigPlacement, MigProfile
from services.preparer.cdigen.generator import Generator
from services.preparer.checkpoint import MigState, MpsState, VfioState


class DeviceOpError(ClaimRefused, RuntimeError):
    """A side effect that failed; the message says which device and why."""


@dataclass(frozen=True)
class MpsRequest:
    """One MPS control daemon for one config group of one claim."""

    daemon_id: str  # "<claimUID>-<hash of device uuids>"
    claim_uid: str
    device_uuids: list[str]  # what CUDA_VISIBLE_DEVICES the daemon gets
    gpu_uuids: list[str]  # physical GPUs whose compute mode becomes EXCLUSIVE_PROCESS
    active_thread_percentage: int | None
    pinned_memory_limits_mib: dict[str, int]
    multi_user: bool = False


class DeviceOps(Protocol):
    """Side effects on this node's GPUs."""

    def cdigen(self) -> Generator:
        """The CDI generator over this node's driver installation and device nodes."""
        ...

    async def set_time_slice(self, gpu_uuids: list[str], interval: str) -> None:
        """Compute mode DEFAULT, then the time-slice ``interval`` (Default/Short/Medium/Long)."""
        ...

    async def create_mig(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> MigState:
        """Create a GPU instance at ``placement`` with its full compute instance."""
        ...

    async def destroy_mig(self, mig: MigState) -> None:
        """Destroy a MIG device (compute instance, then GPU instance); absent is fine."""
        ...

    async def live_migs(self) -> list[MigState]:
        """Every MIG device that exists now (for clean-up of strays)."""
        ...

    async def start_mps(self, request: MpsRequest) -> MpsState:
        """Start (or find running) the claim group's MPS control daemon and apply limits."""
        ...

    async def stop_mps(self, state: MpsState) -> None:
        """Stop the daemon, reset compute mode, remove its directories; absent is fine."""
        ...

    async def mps_daemons(self) -> list[MpsState]:
        """Every MPS control daemon this preparer started that still exists."""
        ...

    async def bind_vfio(self, gpu: Gpu) -> VfioState:
        """Unbind the GPU from nvidia and bind it to vfio-pci."""
        ...

    async def unbind_vfio(self, state: VfioState) -> None:
        """Give the GPU back to the driver it had before (nvidia)."""
        ...

    async def close(self) -> None: ...
